"""The reach scenarios of ``prove --reach`` replayed through the reference scheduler.

``proofs/reach.py`` builds, for each finding with a realistic region, one step of prompts
at a config of the region and checks the violation on the spec's FCFS step; proofs/ may
not import the reference, so the replay through ``reference/`` (the scheduler that
mirrors vLLM's event flow) is here, for ``dualbudget report`` and the tests.
"""

from __future__ import annotations

import copy
from typing import Any

from dualbudget.proofs.obligations import lower_of
from dualbudget.reference.formats.scenario import ScenarioError, parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.spec.invariants import one_more_token_fits
from dualbudget.spec.policies import StepParams


def replay_reach(profile: str, contract: str, check: str, scenario: dict[str, Any]) -> str | None:
    """What the reference's first step of ``scenario`` shows for the finding ``check`` (of
    the contract item ``contract``) of ``profile`` (one line), or None when it does not
    show it."""
    if check == "C4-converse":
        try:
            parse_scenario(scenario)
        except ScenarioError as err:
            as_dual = copy.deepcopy(scenario)
            as_dual["profile"] = "dual"
            record = next(ScenarioRun(parse_scenario(as_dual), max_steps=1).records())
            if record.target_tokens >= 1:
                return f"refused ({err}); dual schedules T={record.target_tokens}"
        return None
    parsed = parse_scenario(scenario)
    run = ScenarioRun(parsed, max_steps=1, check="collect")
    record = next(run.records())
    p = StepParams.of(parsed.config)
    if contract == "C3":
        broken = [v for v in run.scheduler.violations if v.contract == "C3"]
        if broken and record.draft_rows > p.max_num_batched_tokens:
            return f"C3: D={record.draft_rows} > B={p.max_num_batched_tokens}"
        return None
    if contract == "C5":
        needs = {r.id: r.prompt_len for r in parsed.requests}
        scheduled = record.num_scheduled_tokens
        cut = [rid for rid in needs if scheduled.get(rid, 0) < needs[rid]]
        if not cut:
            return None
        got = scheduled.get(cut[0], 0)
        draft = record.draft_rows - (p.draft_rows(got) if got else 0)
        count = len(scheduled) - (1 if got else 0)
        if one_more_token_fits(p, record.target_tokens - got, draft, count, got):
            return f"C5: {cut[0]} got {got} of {needs[cut[0]]}, one more fits"
        return None
    if contract == "C6":
        lower = lower_of(parsed.profile)
        if lower is None:
            return None
        other = next(ScenarioRun(parsed, profile=lower, max_steps=1, check="collect").records())
        if "tokens" in check and record.target_tokens < other.target_tokens:
            return f"C6: T={record.target_tokens} < {lower}'s {other.target_tokens}"
        if "requests" in check and len(record.num_scheduled_tokens) < len(
            other.num_scheduled_tokens
        ):
            return (
                f"C6: {len(record.num_scheduled_tokens)} requests <"
                f" {lower}'s {len(other.num_scheduled_tokens)}"
            )
        return None
    return None
