"""``fuzz --campaign DIR --budget DURATION``: seeds drawn round-robin until the budget is
spent, a divergence stopping its own unit only, everything in DIR merged, and a rerun
that goes on after the units already kept. The units are ``executor_units.fuzz_unit``
(no vLLM), run through the fuzz's own loop (``draw_for``) on local workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dualbudget.campaign.budget import parse_duration, spoken
from dualbudget.campaign.executor import LocalExecutor
from dualbudget.campaign.store import Campaign
from dualbudget.cli import build_parser, main
from dualbudget.integration.aims import AIMS
from dualbudget.integration.fuzz import UnitPlan, draw_for, seeds_per_map, shares, unit_id
from dualbudget.integration.outcome import FuzzResult, UnitRun
from dualbudget.spec.methods import LAYOUT_NAMES
from tests.executor_units import fuzz_unit

LAYOUTS = list(LAYOUT_NAMES[:2])
EXAMPLES = 2 * len(AIMS)
"""Per seed: every (layout, aim) a unit of one example or more."""
PRELOAD = ("tests.executor_units",)
"""Imported once, in the workers' forkserver: no unit pays the import in the budget."""
PER_SEED = len(shares(EXAMPLES, LAYOUTS))
"""Units a seed has: one tick of ``Ticks`` each."""


class Ticks:
    """A clock that reads one second later at each call: ``draw_for`` reads it once per
    unit merged and once per map, so a budget reaches the same units on any machine,
    loaded or not (the units themselves still run on real workers)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _plans_of(out: Path) -> Callable[[int, float], list[UnitPlan]]:
    def plans_of(seed: int, deadline: float) -> list[UnitPlan]:
        return [
            UnitPlan(
                index=index,
                profile="vllm-0.33",
                layout=layout,
                aim=aim,
                examples=count,
                seed=seed,
                out_dir=str(out),
                known_findings=frozenset(),
                scheduler_cls=None,
                deadline=deadline,
            )
            for index, (layout, aim, count) in enumerate(shares(EXAMPLES, LAYOUTS))
        ]

    return plans_of


def _draw(directory: Path, budget: float, jobs: int) -> tuple[FuzzResult, int]:
    """(the merged result, the units this draw ran)."""
    out = directory / "scenarios"
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    with (
        Campaign(directory, "fake fuzz") as campaign,
        LocalExecutor(jobs, preload=PRELOAD) as executor,
    ):
        result = FuzzResult(profile="vllm-0.33", vllm_version="0.33.0")
        merged = draw_for(
            budget, _plans_of(out), 0, executor, campaign, result, LAYOUTS, lines.append,
            unit=fuzz_unit, clock=Ticks(),
        )  # fmt: skip
        assert lines[-1].startswith(f"  campaign {directory}: budget {spoken(budget)} spent")
        return merged, campaign.ran


def _ran(directory: Path) -> list[str]:
    return (directory / "scenarios" / "ran.log").read_text().split()


def _seed(unit: str) -> int:
    return int(unit.split("/seed")[1].split("/")[0])


def test_a_budget_draws_seeds_until_spent_and_merges_the_whole_campaign(tmp_path: Path) -> None:
    # Two whole seeds and the start of a third: a map (one seed here) per clock read, then
    # a unit per read until the budget is spent.
    merged, ran = _draw(tmp_path, 2 * (PER_SEED + 1) + 5, 2)
    runs = _ran(tmp_path)
    seeds = sorted({_seed(u) for u in runs})
    # Past seed 1, whose first unit diverged: a divergence stops its unit, not the campaign.
    assert seeds[:3] == [0, 1, 2]
    assert 2 * PER_SEED < ran < 3 * PER_SEED
    assert [d.seed for d in merged.divergences] == [1]
    # Every kept unit, merged: seed 0's units all ran whole (EXAMPLES examples), seed 1's
    # first unit one example.
    kept = _kept(tmp_path)
    assert merged.examples == sum(run.examples for run in kept.values())
    assert merged.steps == 3 * merged.examples - 1
    assert sum(merged.examples_by_unit.values()) == merged.examples
    event = next(iter(merged.totals()))
    assert merged.totals()[event] == sum(run.seed + 1 for run in kept.values())


def _kept(directory: Path) -> dict[str, UnitRun]:
    with Campaign(directory, "fake fuzz") as campaign:
        return campaign.all_results()


def test_a_rerun_goes_on_after_the_units_kept(tmp_path: Path) -> None:
    first, ran_first = _draw(tmp_path, PER_SEED + 8, 1)
    kept_first = _kept(tmp_path)
    assert len(kept_first) == ran_first == len(_ran(tmp_path))
    # A kept unit costs no work but a clock read: this budget passes the two seeds begun
    # and starts a third.
    again, ran_again = _draw(tmp_path, 3 * (PER_SEED + 1) + 5, 2)
    kept = _kept(tmp_path)
    new = set(kept) - set(kept_first)
    assert len(new) == ran_again > 0
    # No kept unit ran again; the rerun starts where the first stopped: the rest of its
    # last seed (none left if the budget ran out at its end), then new seeds.
    assert not set(kept_first) & set(_ran(tmp_path)[ran_first:])
    last = max(_seed(u) for u in kept_first)
    assert min(_seed(u) for u in new) in (last, last + 1)
    assert {unit_id(plan) for plan in _plans_of(tmp_path)(last, 0.0)} <= set(kept)
    assert again.examples == sum(run.examples for run in kept.values()) > first.examples


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("8h", 28800.0), ("90m", 5400.0), ("30s", 30.0), ("1h30m", 5400.0), ("2.5", 2.5)],
)
def test_a_duration_is_read_as_people_write_it(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert build_parser().parse_args(["fuzz", "--budget", text]).budget == seconds


@pytest.mark.parametrize("text", ["8x", "h", "0s", "-3m", "1h 30m", "inf", ""])
def test_a_bad_duration_is_one_line_exit_2(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)
    with pytest.raises(SystemExit) as exit_:
        main(["fuzz", "--campaign", "c", f"--budget={text}"])
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("dualbudget fuzz: error: argument --budget: not a")


def test_a_budget_without_a_campaign_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--budget", "20s"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("dualbudget fuzz: error: --budget needs --campaign DIR")


@pytest.mark.parametrize(
    ("units", "width", "seeds"), [(90, 2, 1), (90, 90, 2), (90, 256, 6), (20, 0, 1), (0, 4, 8)]
)
def test_a_map_has_seeds_for_two_units_a_worker(units: int, width: int, seeds: int) -> None:
    assert seeds_per_map(units, width) == seeds
