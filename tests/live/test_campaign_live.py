"""One fuzz and one mutate run give the same result on every executor: ``--jobs 1``,
``--jobs 2`` and a local Ray of 2 CPUs (timings aside); and a fuzz campaign resumed
from a directory holding some of its units ends with the same result."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration.testing import live_profile_name
from tests.ray_support import RAY_GROUP, local_ray

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("local_ray"), RAY_GROUP]
__all__ = ["local_ray"]

EXAMPLES = 20
TIMINGS = ("seconds", "warm_up_seconds")
KILLER = "shift-boundary/schedule/long_prefill_token_threshold/3"
"""A mutant tests/live/test_mutate_live.py sees killed (at 200 examples; at these few its
status, whatever it is, must only be the same on every executor)."""


def _runs(out: Path, executor: Any, campaign: Path | None = None) -> dict[str, Any]:
    """The fuzz's JSON and two mutants' results (timings aside) on ``executor``."""
    from dualbudget.fuzz_cli import known_findings
    from dualbudget.integration.commands import fuzz_json
    from dualbudget.integration.fuzz import FuzzPlan, run_fuzz
    from dualbudget.integration.live import require_vllm
    from dualbudget.integration.mutate import Plan, run_mutants
    from dualbudget.integration.mutation.loading import installed_vllm_source, sites

    profile = live_profile_name()
    result = run_fuzz(
        FuzzPlan(
            profile=profile,
            vllm_version=require_vllm(),
            examples=EXAMPLES,
            seed=1,
            out_dir=out / "fuzz",
            known_findings=known_findings(),
            campaign=campaign,
        ),
        executor=executor,
    )
    fuzz = {k: v for k, v in fuzz_json(result).items() if k not in TIMINGS}
    found = sites(installed_vllm_source())
    chosen = [s for s in found if s.name == KILLER] + [s for s in found if s.name != KILLER][:1]
    plan = Plan(profile, EXAMPLES, 1, out / "mutants", known_findings())
    control, mutants = run_mutants(chosen, plan, executor)
    statuses = [
        {k: v for k, v in r.to_json().items() if k != "seconds"} for r in [control, *mutants]
    ]
    return {"fuzz": fuzz, "mutants": statuses}


@pytest.fixture(scope="module")
def local_one(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dualbudget.integration.fuzz import fuzz_executor

    with fuzz_executor(1) as executor:
        return _runs(tmp_path_factory.mktemp("same"), executor)


@pytest.mark.parametrize(("name", "jobs"), [("local", 2), ("ray", 2)])
def test_every_executor_gives_the_same_fuzz_and_mutants(
    name: str, jobs: int, local_one: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from dualbudget.integration.fuzz import fuzz_executor

    assert [m["name"] for m in local_one["mutants"]][:2] == ["control", KILLER]
    assert local_one["fuzz"]["examples"] == EXAMPLES
    # The same out directory: scenario paths are part of the result.
    out = tmp_path_factory.getbasetemp() / "same0"
    with fuzz_executor(jobs, executor=name) as executor:
        assert _runs(out, executor) == local_one


def test_a_resumed_fuzz_campaign_ends_as_an_uninterrupted_run(
    local_one: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from dualbudget.integration.fuzz import fuzz_executor

    out = tmp_path_factory.getbasetemp() / "same0"
    campaign = out / "campaign"
    with fuzz_executor(1) as executor:
        first = _runs(out, executor, campaign)
        with sqlite3.connect(campaign / "campaign.sqlite") as db:
            (kept,) = db.execute("select count(*) from units").fetchone()
            # As if the driver had been killed after three units.
            db.execute("delete from units where id not in (select id from units limit 3)")
        again = _runs(out, executor, campaign)
    assert kept > 3
    assert again == first
    # Its scenarios live in the campaign: the same result but for their paths.
    assert first["fuzz"]["examples"] == local_one["fuzz"]["examples"]
    assert first["fuzz"]["coverage"] == local_one["fuzz"]["coverage"]


def test_a_budget_campaign_draws_seeds_then_merges_its_directory(
    tmp_path: Path, profile: str
) -> None:
    import json

    from dualbudget.cli import main

    directory, out = tmp_path / "campaign", tmp_path / "fuzz.json"
    common = ["fuzz", "--profile", profile, "--examples", "10", "--seed", "1", "--jobs", "1"]
    common += ["--layout", "ngram", "--layout", "eagle", "--no-coverage-gate"]
    common += ["--campaign", str(directory), "--json", str(out)]

    def kept() -> list[tuple[str, bytes]]:
        with sqlite3.connect(directory / "campaign.sqlite") as db:
            return list(db.execute("select id, result from units order by id"))

    assert main([*common, "--budget", "20s"]) == 0
    first, result = kept(), json.loads(out.read_text())
    seeds = {int(unit_id.split("/seed")[1].split("/")[0]) for unit_id, _ in first}
    # Seed after seed: more than seed 1's units, and everything kept is in the result.
    assert {1, 2} <= seeds
    assert result["examples"] == sum(result["examples_by_unit"].values()) > 10
    assert result["divergences"] == []
    # A rerun keeps what the first kept, untouched, and draws more.
    assert main([*common, "--budget", "5s"]) == 0
    again = kept()
    assert set(first) < set(again)
    assert json.loads(out.read_text())["examples"] > result["examples"]
