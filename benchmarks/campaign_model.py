"""The executor seam's cost, measured, and a model of a campaign's wall time on N workers.

Run it in a vLLM environment (Ray is pinned there), with ``nice`` on a shared machine:

    nice .venv-vllm-0.33/bin/python benchmarks/campaign_model.py overhead
    nice .venv-vllm-0.33/bin/python benchmarks/campaign_model.py mutate \\
        --operators remove-refund refund-twice --examples 20
    nice .venv-vllm-0.33/bin/python benchmarks/campaign_model.py sweep
    nice .venv-vllm-0.33/bin/python benchmarks/campaign_model.py fuzz --examples 200 --ray \\
        --keep out/campaign-model

``overhead``: no-op units through ``LocalExecutor(2)`` and ``RayExecutor`` (a local Ray
of 2 CPUs): the workers' start and the seconds each unit costs beyond its own work.

``mutate``, ``fuzz`` and ``sweep``: the command once on one worker (``--jobs 1``: the unit
time distribution, each unit's own seconds), then on the 2 workers of this machine
(``--jobs 2``, and ``--executor ray`` for ``mutate``); the model's prediction for 2
workers, made from the first run alone, is printed beside the measured wall, then the
model's wall for N workers of a campaign at full size (the full mutant set at 2,000
examples; a 100,000-example fuzz).

The model (``predict``): the executors hand units out in unit order and a free worker
takes the next (list scheduling), so the wall is the workers' start plus the makespan of
that schedule over the unit times, each unit plus the executor's per-unit overhead. A
unit's time is its CPU seconds over the CPU share a worker gets: 1 on a cluster whose
workers each hold a CPU; on a shared machine the share ``cpu_share`` measures just before
the run (busy processes, one per worker, for a few seconds), since other jobs take their
part of the cores. At full size a unit's time scales with its examples, except a killed
mutant's: it stops at its first divergence, which more examples do not move later.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)
"""The cluster sizes the model's table reports."""
FULL_MUTANT_EXAMPLES = 2000
FULL_FUZZ_EXAMPLES = 100_000
FUZZ_UNIT_EXAMPLES = 200
"""Examples per unit of a large fuzz campaign (a unit per layout, aim and seed)."""


@dataclass(frozen=True)
class Overhead:
    """An executor's cost beyond the units' own work."""

    start_seconds: float
    """Its workers' start (and initializer), before the first unit."""
    per_unit_seconds: float = 0.0
    """Seconds each unit costs a worker beyond its own work."""


def makespan(unit_seconds: Sequence[float], workers: int, per_unit: float = 0.0) -> float:
    """The wall of list scheduling: units in order, each to the worker free first."""
    free = [0.0] * max(1, workers)
    for seconds in unit_seconds:
        heapq.heappush(free, heapq.heappop(free) + seconds + per_unit)
    return max(free)


def predict(unit_seconds: Sequence[float], workers: int, overhead: Overhead) -> float:
    """The model's wall: the workers' start, then the schedule's makespan."""
    return overhead.start_seconds + makespan(unit_seconds, workers, overhead.per_unit_seconds)


def _spin(seconds: float) -> float:
    """Busy for ``seconds`` of wall: the CPU share this process got."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def cpu_share(workers: int, seconds: float = 4.0) -> float:
    """The mean CPU share of ``workers`` busy processes on this machine now."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        shares = pool.map(_spin, [seconds] * workers)
    return sum(shares) / len(shares)


# -- the executors' overhead ---------------------------------------------------------------
def _nothing(unit: int) -> int:
    return unit


def measure_overhead(executor: str, units: int = 400, width: int = 2) -> Overhead:
    from dualbudget.campaign.executor import executor_for

    started = time.perf_counter()
    with executor_for(executor, width) as ex:
        start = time.perf_counter() - started
        t0 = time.perf_counter()
        assert list(ex.map(_nothing, list(range(units)))) == list(range(units))
        wall = time.perf_counter() - t0
    # ``width`` workers share the units: each unit costs a worker wall * width / units.
    return Overhead(start, wall * width / units)


def overhead_command(units: int) -> dict[str, Any]:
    local = measure_overhead("local", units)
    ray = measure_overhead("ray", units)
    for name, o in (("local processes (2)", local), ("local Ray (2 CPUs)", ray)):
        print(
            f"{name}: workers start in {o.start_seconds:.2f} s;"
            f" {1000 * o.per_unit_seconds:.2f} ms per unit ({units} no-op units)"
        )
    return {"local": local.__dict__, "ray": ray.__dict__, "units": units}


# -- running a command ---------------------------------------------------------------------
def dualbudget(*args: str) -> tuple[float, str]:
    """Run ``dualbudget ARGS`` in this interpreter's environment: wall seconds, stdout."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dualbudget", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"dualbudget {' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return wall, done.stdout + done.stderr


WARM_UP = re.compile(r"warm-up[^:]*: ([0-9.]+)s")
FUZZ_UNIT = re.compile(r"^  (\S+)\s+(\d+) examples\s+\d+ steps\s+([0-9.]+)s", re.M)


def warm_up_seconds(output: str) -> float:
    found = WARM_UP.search(output)
    return float(found.group(1)) if found else 0.0


@dataclass
class Comparison:
    what: str
    predicted: float
    measured: dict[str, float]

    def lines(self) -> list[str]:
        out = []
        for name, wall in self.measured.items():
            error = (self.predicted - wall) / wall
            out.append(
                f"{self.what}, 2 workers: predicted {self.predicted:.1f} s, measured"
                f" {wall:.1f} s ({name}): {100 * error:+.1f}%"
            )
        return out


def mutate_command(operators: Sequence[str], examples: int, ray: bool) -> dict[str, Any]:
    common = ["mutate", "--operators", *operators, "--examples", str(examples), "--seed", "1"]
    shares: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, tuple[float, dict[str, Any], str]] = {}
        for name, extra, workers in (
            ("jobs 1", ["--jobs", "1"], 1),
            ("jobs 2", ["--jobs", "2"], 2),
            *([("ray 2", ["--executor", "ray", "--jobs", "2"], 2)] if ray else []),
        ):
            shares[name] = cpu_share(workers)
            path = Path(tmp) / f"{name.replace(' ', '-')}.json"
            wall, output = dualbudget(
                *common, *extra, "--json", str(path), "--out-dir", str(Path(tmp) / "m")
            )
            runs[name] = (wall, json.loads(path.read_text()), output)
            print(f"mutate {name}: {wall:.1f} s wall, CPU share {shares[name]:.2f}", flush=True)
    serial_wall, serial, serial_out = runs["jobs 1"]
    mutants = serial["mutants"]
    # CPU seconds: what each unit took at the share the serial run got. The start (vLLM's
    # import, the unmutated control) is taken at its wall: it reads files as much as it
    # computes, and the workers do it at once, so more workers do not lengthen it.
    cpu = [m["seconds"] * shares["jobs 1"] for m in mutants]
    start = serial_wall - sum(m["seconds"] for m in mutants)
    statuses = {name: [m["status"] for m in runs[name][1]["mutants"]] for name in runs}
    same = all(s == statuses["jobs 1"] for s in statuses.values())
    share = shares["jobs 2"]
    here = Overhead(start, 0.0)
    comparison = Comparison(
        f"mutate ({len(cpu)} mutants, {examples} examples)",
        predict([c / share for c in cpu], 2, here),
        {"--jobs 2": runs["jobs 2"][0]},
    )
    print(f"unit CPU seconds: {summary(cpu)}; start {start:.1f} s")
    print(f"statuses equal for {', '.join(runs)}: {same}")
    if ray:
        print(
            "speedup of --executor ray (a local Ray of 2 CPUs) over --jobs 2:"
            f" {runs['jobs 2'][0] / runs['ray 2'][0]:.2f}"
        )
    for line in comparison.lines():
        print(line)
    full = [
        c if m["status"] == "killed" else c * FULL_MUTANT_EXAMPLES / examples
        for m, c in zip(mutants, cpu, strict=True)
    ]
    table = model_table(
        f"{len(full)} mutants at {FULL_MUTANT_EXAMPLES} examples, a CPU per worker",
        full,
        Overhead(start, 0.0),
    )
    return {
        "unit_cpu_seconds": cpu,
        "statuses_equal": same,
        "shares": shares,
        "walls": {name: runs[name][0] for name in runs},
        "predicted_2": comparison.predicted,
        "model": table,
        "warm_up_seconds": warm_up_seconds(serial_out),
    }


FUZZ_RUNS = (("jobs 1", ("--jobs", "1"), 1), ("jobs 2", ("--jobs", "2"), 2))
RAY_RUN = ("ray", ("--executor", "ray", "--jobs", "2"), 2)
TOP_UP = re.compile(r"-top-up(\d+)$")


def _rounds(units: Sequence[tuple[str, float]]) -> list[list[float]]:
    """Unit seconds by round: the planned units, then each top-up round's (a round is
    its own ``map``: it starts when the one before has ended)."""
    rounds: dict[int, list[float]] = {}
    for name, seconds in units:
        found = TOP_UP.search(name)
        rounds.setdefault(int(found.group(1)) if found else 0, []).append(seconds)
    return [rounds[r] for r in sorted(rounds)]


def predict_rounds(rounds: Sequence[Sequence[float]], workers: int, overhead: Overhead) -> float:
    """``predict`` over maps run one after the other (a fuzz's rounds, a campaign's
    maps): the start once, then each map's makespan."""
    return overhead.start_seconds + sum(
        makespan(units, workers, overhead.per_unit_seconds) for units in rounds
    )


def campaign_maps(planned: Sequence[float], seeds: int, workers: int) -> list[list[float]]:
    """A budget campaign's maps (``integration.fuzz.draw_for``): ``seeds`` seeds of the
    ``planned`` units, ``seeds_per_map`` of them in each map."""
    from dualbudget.integration.fuzz import seeds_per_map

    batch = seeds_per_map(len(planned), workers)
    return [list(planned) * min(batch, seeds - s) for s in range(0, seeds, batch)]


def fuzz_command(examples: int, ray: bool, keep: str | None) -> dict[str, Any]:
    """``fuzz --examples N --seed 1`` on 1 worker (the unit-time distribution), then on
    the 2 of this machine (``--jobs 2``; with ``ray``, also ``--executor ray``): the
    model's prediction for 2 workers from the first run alone against the measured
    wall, each run's JSON against the first's (``campaign.same_results``, timings
    aside), and the model of a campaign of FULL_FUZZ_EXAMPLES examples on N workers:
    ``fuzz --campaign DIR --budget ...`` drawing seeds of ``examples`` each, the measured
    run's planned units again for every seed."""
    from dualbudget.campaign.same_results import first_difference

    common = ["fuzz", "--examples", str(examples), "--seed", "1"]
    out = Path(keep or tempfile.mkdtemp(prefix="campaign-model-"))
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for name, extra, workers in (*FUZZ_RUNS, *([RAY_RUN] if ray else [])):
        load = os.getloadavg()
        share = cpu_share(workers)
        path = out / f"fuzz-{name.replace(' ', '-')}.json"
        # One --out-dir for every run: the scenario paths are part of the JSON.
        wall, output = dualbudget(*common, *extra, "--json", str(path), "--out-dir", str(out / "d"))
        runs[name] = {"wall": wall, "share": share, "load": load, "output": output,
                      "json": json.loads(path.read_text())}  # fmt: skip
        print(
            f"fuzz {name}: {wall:.1f} s wall, CPU share {share:.2f}, load average before"
            f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            flush=True,
        )
    serial = runs["jobs 1"]
    share1, share2 = serial["share"], runs["jobs 2"]["share"]
    found = FUZZ_UNIT.findall(serial["output"])
    units = [(name, float(seconds) * share1) for name, _, seconds in found]
    start_cpu = (serial["wall"] - sum(float(s) for _, _, s in found)) * share1
    rounds = _rounds(units)
    comparison = Comparison(
        f"fuzz ({examples} examples, {len(units)} units, {len(rounds) - 1} top-up rounds)",
        predict_rounds([[c / share2 for c in r] for r in rounds], 2, Overhead(start_cpu / share2)),
        {"--jobs 2": runs["jobs 2"]["wall"]},
    )
    print(f"unit CPU seconds: {summary([c for _, c in units])}; start {start_cpu:.1f} CPU s")
    for line in comparison.lines():
        print(line)
    same = {name: first_difference(serial["json"], run["json"]) for name, run in runs.items()}
    for name, difference in same.items():
        if name != "jobs 1":
            print(f"JSON of {name} against jobs 1: {difference or 'the same, timings aside'}")
    seeds = FULL_FUZZ_EXAMPLES // examples
    table = {
        n: predict_rounds(campaign_maps(rounds[0], seeds, n), n, Overhead(start_cpu))
        for n in WORKERS
    }
    cells = ", ".join(f"N={n}: {_hours(t)}" for n, t in table.items())
    print(
        f"model, a {FULL_FUZZ_EXAMPLES}-example campaign ({seeds} seeds of {examples} examples,"
        f" {len(rounds[0])} units each), a CPU per worker: {cells}"
    )
    return {
        "examples": examples,
        "unit_cpu_seconds": dict(units),
        "start_cpu_seconds": start_cpu,
        "runs": {name: _figures(run) for name, run in runs.items()},
        "predicted_2": comparison.predicted,
        "json_differences": same,
        "model": table,
        "kept": str(out),
    }


def _figures(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k not in ("output", "json")}


def sweep_command() -> dict[str, Any]:
    """The model checked on ``simulate --sweep``'s units (no vLLM: a quick check), in this
    process: each unit's CPU seconds alone, the prediction for 2 local workers from those,
    the CPU share 2 workers get now and the local executor's measured overhead, then the
    units on 2 workers, timed."""
    from dualbudget.campaign.executor import executor_for
    from dualbudget.reference.runs.simulate import StepTimeModel
    from dualbudget.reference.runs.sweep import parse_grid, run_unit, sweep_units

    grid = parse_grid(["B=128,512,2048", "max_num_seqs=16,64,256", "K=3,7"])
    plan = sweep_units(
        grid, ("vllm-0.32", "vllm-0.33", "dual"), ["dspark-bench"], seed=0,
        model=StepTimeModel(), num_requests=256,
    )  # fmt: skip
    cpu = []
    for unit in plan:
        t0 = time.process_time()
        run_unit(unit)
        cpu.append(time.process_time() - t0)
    overhead = measure_overhead("local", 200)
    share = cpu_share(2)
    t0 = time.perf_counter()
    with executor_for("local", 2) as ex:
        rows = list(ex.map(run_unit, plan))
    wall2 = time.perf_counter() - t0
    assert len(rows) == len(plan)
    comparison = Comparison(
        f"simulate --sweep ({len(cpu)} units)",
        predict([c / share for c in cpu], 2, overhead),
        {"local executor, 2 workers": wall2},
    )
    print(f"unit CPU seconds: {summary(cpu)}; CPU share of 2 workers now {share:.2f}")
    for line in comparison.lines():
        print(line)
    return {"unit_cpu_seconds": cpu, "share": share, "predicted_2": comparison.predicted,
            "wall_2": wall2}  # fmt: skip


def summary(values: Sequence[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "no units"
    p = ordered[min(len(ordered) - 1, len(ordered) // 2)]
    return (
        f"{len(ordered)} units, sum {sum(ordered):.1f} s, median {p:.2f} s, max {ordered[-1]:.2f} s"
    )


def model_table(what: str, units: Sequence[float], overhead: Overhead) -> dict[int, float]:
    table = {n: predict(units, n, overhead) for n in WORKERS}
    cells = ", ".join(f"N={n}: {_hours(s)}" for n, s in table.items())
    print(f"model, {what}: {cells}")
    return table


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


COMMANDS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "overhead": lambda a: overhead_command(a.units),
    "mutate": lambda a: mutate_command(a.operators, a.examples, not a.no_ray),
    "fuzz": lambda a: fuzz_command(a.examples, a.ray, a.keep),
    "sweep": lambda a: sweep_command(),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=COMMANDS)
    parser.add_argument("--units", type=int, default=400, help="no-op units of `overhead`")
    parser.add_argument("--operators", nargs="+", default=["remove-refund", "refund-twice"])
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--no-ray", action="store_true", help="`mutate`: local runs only")
    parser.add_argument("--ray", action="store_true", help="`fuzz`: also --executor ray")
    parser.add_argument("--keep", metavar="DIR", help="`fuzz`: keep each run's JSON in DIR")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    result = COMMANDS[args.what](args)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
