"""``dualbudget bench`` against the installed vLLM (needs vLLM; see
docs/vllm-environments.md): the JSON that document names, figures that were measured
(positive, the ratio their quotient), and a divergence in its lockstep runs exits 1. Timings are
printed, never asserted. One workload each, to keep the live suite short: a full-attention
stream and the hybrid one, both with prefix caching on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration import commands
from dualbudget.integration.live import installed_vllm_version
from dualbudget.integration.testing import differing_release_profile

pytestmark = pytest.mark.live

ALL_WORKLOADS = commands.bench_workloads


def _only(method: str) -> Any:
    def workloads(profile: str) -> list[Any]:
        chosen = [w for w in ALL_WORKLOADS(profile) if commands.workload_method(w) == method]
        assert len(chosen) == 1
        return chosen

    return workloads


def test_bench_reports_the_rates_it_measured(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    profile: str,
) -> None:
    monkeypatch.setattr(commands, "bench_workloads", _only("eagle3"))
    out_file = tmp_path / "bench.json"
    assert commands.bench(commands.BenchOptions(json_path=str(out_file), repeat=2)) == 0
    out = json.loads(out_file.read_text())
    assert out["vllm_version"] == installed_vllm_version()
    assert out["profile"] == profile
    assert out["repeat"] == 2
    rates = [out[f"{mode}_steps_per_s"] for mode in ("reference", "live", "lockstep")]
    assert all(rate > 0 for rate in rates)
    assert out["ratio"] == pytest.approx(rates[0] / rates[1], abs=0.01)
    [workload] = out["workloads"]
    assert workload["method"] == "eagle3" and workload["steps"] > 0
    # Prefix caching is on, and every request but the first arrivals hits the system prompt.
    assert 0.85 <= workload["prefix_hit_rate"] <= 1
    assert workload["ratio"] == pytest.approx(out["ratio"], abs=0.01)
    printed = capsys.readouterr().out
    assert f"profile {profile} (detected by version), median of 2 runs" in printed
    assert f"ratio reference/live {out['ratio']}x" in printed
    assert re.search(rf"prefix hits +{workload['prefix_hit_rate']:.0%}", printed)


def test_bench_runs_the_hybrid_stream_in_lockstep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A sliding window beside full attention, prefix caching on: vLLM's hybrid
    # coordinator takes the reference's stream and decides alike in the lockstep runs.
    monkeypatch.setattr(commands, "bench_workloads", _only("eagle3+async+hybrid"))
    out_file = tmp_path / "bench.json"
    assert commands.bench(commands.BenchOptions(json_path=str(out_file), repeat=1)) == 0
    [workload] = json.loads(out_file.read_text())["workloads"]
    assert workload["method"] == "eagle3+async+hybrid" and workload["prefix_hit_rate"] > 0.85


def test_bench_stops_at_a_divergence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], profile: str
) -> None:
    # The other release's profile on DFlash: its first step differs (see the fuzz tests).
    other = differing_release_profile(profile)
    monkeypatch.setattr(commands, "bench_workloads", _only("dflash"))
    assert commands.bench(commands.BenchOptions(repeat=1, profile=other)) == 1
    assert f"vLLM diverges from the reference {other} at" in capsys.readouterr().err
