"""Hand-worked first steps of the reference scheduler, for every policy and method row.

Common setup unless a case says otherwise: B = max_num_batched_tokens = 20,
max_num_seqs = 4, K = 4, three 10-token prompts arriving in order, FCFS, chunked prefill
on, a KV pool too large to matter. Every request is waiting, so the step is the waiting
loop alone: each request in turn gets ``min(need, room)`` and pays its charge.

Slots (vLLM's max_num_new_slots_for_drafting) with K = 4:
  0.32: ngram 0, ngram-parallel 3, eagle 0, p-eagle 3, draft-model 1, pard 4, dflash 4,
  dspark 3 (both);
  0.33: the same but dflash 0, dspark 0.
True draft rows C(q): ngram 0, ngram-parallel 0, eagle q, p-eagle q+3, draft-model q+1,
  pard q+4, dflash 5, dspark-anchor 4, dspark-fill-in 5.
"""

from __future__ import annotations

import pytest

from tests.reference_support import config, first_step

PROMPTS = [10, 10, 10]

# (profile, layout, scheduled, draft_rows, budgets_left (token, input))
CASES = [
    # -- vllm-0.32 (additive): room = min(token, input - slots), charge (q, q + slots) --
    # slots 0: r0 10 -> (10, 10); r1 10 -> (0, 0); token 0 stops. D = 0.
    ("vllm-0.32", "ngram", {"0": 10, "1": 10}, 0, (0, 0)),
    # slots 3 (parallel drafting) as p-eagle, but no draft forward: D = 0.
    ("vllm-0.32", "ngram-parallel", {"0": 10, "1": 4}, 0, (6, 0)),
    # slots 0, as ngram; D = 10 + 10.
    ("vllm-0.32", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    # slots 3: r0 room 17 -> 10, (10, 7); r1 room min(10, 4) = 4, (6, 0); 0 <= 3 stops.
    # D = 13 + 7.
    ("vllm-0.32", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    # slots 1: r0 room 19 -> 10, (10, 9); r1 room min(10, 8) = 8, (2, 0). D = 11 + 9.
    ("vllm-0.32", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    # slots 4: r0 room 16 -> 10, (10, 6); r1 room min(10, 2) = 2, (8, 0). D = 14 + 6.
    ("vllm-0.32", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    # slots 4 as pard; D = 5 + 5 (the draft pass carries no target rows).
    ("vllm-0.32", "dflash", {"0": 10, "1": 2}, 10, (8, 0)),
    # slots 3 as p-eagle; D = 4 + 4.
    ("vllm-0.32", "dspark-anchor", {"0": 10, "1": 4}, 8, (6, 0)),
    # slots 3 as p-eagle; D = 5 + 5.
    ("vllm-0.32", "dspark-fill-in", {"0": 10, "1": 4}, 10, (6, 0)),
    # -- vllm-0.33 (additive, capped): as 0.32, DFlash/DSpark slots 0, running cap B // lookahead --
    ("vllm-0.33", "ngram", {"0": 10, "1": 10}, 0, (0, 0)),
    ("vllm-0.33", "ngram-parallel", {"0": 10, "1": 4}, 0, (6, 0)),
    ("vllm-0.33", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    ("vllm-0.33", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    ("vllm-0.33", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    ("vllm-0.33", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    # slots 0, cap min(4, 20 // 5) = 4: r0 10 -> (10, 10); r1 10 -> (0, 0). D = 5 + 5.
    ("vllm-0.33", "dflash", {"0": 10, "1": 10}, 10, (0, 0)),
    # slots 0, cap min(4, 20 // 4) = 4: as dflash; D = 4 + 4.
    ("vllm-0.33", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 0)),
    # slots 0, lookahead 5, cap 4: as dflash; D = 5 + 5.
    ("vllm-0.33", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 0)),
    # -- vllm-0.34: 0.33's budget; no parallel EAGLE, PARD or parallel ngram to build --
    ("vllm-0.34", "ngram", {"0": 10, "1": 10}, 0, (0, 0)),
    ("vllm-0.34", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    ("vllm-0.34", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    ("vllm-0.34", "dflash", {"0": 10, "1": 10}, 10, (0, 0)),
    ("vllm-0.34", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 0)),
    ("vllm-0.34", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 0)),
    # -- global-reserve: S' = B - max_num_seqs * slots(0.32) fixed; charge (q, 0) --
    # S' = 20: r0 10, r1 10; token 0 stops.
    ("global-reserve", "ngram", {"0": 10, "1": 10}, 0, (0, 20)),
    # S' = 20 - 4*3 = 8: r0 gets 8. D = 0.
    ("global-reserve", "ngram-parallel", {"0": 8}, 0, (0, 20)),
    ("global-reserve", "eagle", {"0": 10, "1": 10}, 20, (0, 20)),
    # S' = 20 - 4*3 = 8: r0 gets 8 and the step is over. D = 8 + 3.
    ("global-reserve", "p-eagle", {"0": 8}, 11, (0, 20)),
    # S' = 20 - 4*1 = 16: r0 10, r1 6. D = 11 + 7.
    ("global-reserve", "draft-model", {"0": 10, "1": 6}, 18, (0, 20)),
    # S' = 20 - 4*4 = 4: r0 4. D = 4 + 4.
    ("global-reserve", "pard", {"0": 4}, 8, (0, 20)),
    # S' = 4: r0 4. D = 5.
    ("global-reserve", "dflash", {"0": 4}, 5, (0, 20)),
    # S' = 20 - 4*3 = 8: r0 8. D = 4.
    ("global-reserve", "dspark-anchor", {"0": 8}, 4, (0, 20)),
    # S' = 8: r0 8. D = 5.
    ("global-reserve", "dspark-fill-in", {"0": 8}, 5, (0, 20)),
    # -- dual: token budget 20 charged q; draft budget 20 charged C(q) --
    # C = 0: room = token budget: r0 10, r1 10.
    ("dual", "ngram", {"0": 10, "1": 10}, 0, (0, 20)),
    ("dual", "ngram-parallel", {"0": 10, "1": 10}, 0, (0, 20)),
    # C(q) = q: room min(token, input): r0 10 -> (10, 10); r1 10 -> (0, 0).
    ("dual", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    # C(q) = q + 3: r0 room min(20, 17) -> 10, (10, 7); r1 room min(10, 4) = 4, (6, 0).
    ("dual", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    # C(q) = q + 1: r0 10 -> (10, 9); r1 room min(10, 8) = 8 -> (2, 0).
    ("dual", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    # C(q) = q + 4: r0 10 -> (10, 6); r1 room min(10, 2) = 2 -> (8, 0).
    ("dual", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    # C = 5 whatever q: room = token budget while input >= 5: r0 10 -> (10, 15);
    # r1 10 -> (0, 10); token 0 stops.
    ("dual", "dflash", {"0": 10, "1": 10}, 10, (0, 10)),
    # C = 4: r0 10 -> (10, 16); r1 10 -> (0, 12).
    ("dual", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 12)),
    # C = 5: as dflash.
    ("dual", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 10)),
    # -- pr-53080: dual's rule term for term (target charged q, draft budget C(q)) --
    ("pr-53080", "ngram", {"0": 10, "1": 10}, 0, (0, 20)),
    ("pr-53080", "ngram-parallel", {"0": 10, "1": 10}, 0, (0, 20)),
    ("pr-53080", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    ("pr-53080", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    ("pr-53080", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    ("pr-53080", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    ("pr-53080", "dflash", {"0": 10, "1": 10}, 10, (0, 10)),
    ("pr-53080", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 12)),
    ("pr-53080", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 10)),
    # -- pr-52996: 0.32's additive charge, but DSpark charged K = 4 rows of a separate
    # draft budget of B = 20 and q of a target budget min(S, B) = 20 --
    ("pr-52996", "ngram", {"0": 10, "1": 10}, 0, (0, 0)),
    ("pr-52996", "ngram-parallel", {"0": 10, "1": 4}, 0, (6, 0)),
    ("pr-52996", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    ("pr-52996", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    ("pr-52996", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    ("pr-52996", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    # DFlash keeps 0.32's slots 4, as vllm-0.32.
    ("pr-52996", "dflash", {"0": 10, "1": 2}, 10, (8, 0)),
    # r0 10 -> (10, 16); r1 10 -> (0, 12); token 0 stops. D = 4 + 4.
    ("pr-52996", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 12)),
    # charged K = 4 rows each, as the anchor layout, while the true D = 5 + 5.
    ("pr-52996", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 12)),
    # -- fork-605: pr-52996, plus DFlash charged K + 1 = 5 rows of the separate budget --
    ("fork-605", "ngram", {"0": 10, "1": 10}, 0, (0, 0)),
    ("fork-605", "ngram-parallel", {"0": 10, "1": 4}, 0, (6, 0)),
    ("fork-605", "eagle", {"0": 10, "1": 10}, 20, (0, 0)),
    ("fork-605", "p-eagle", {"0": 10, "1": 4}, 20, (6, 0)),
    ("fork-605", "draft-model", {"0": 10, "1": 8}, 20, (2, 0)),
    ("fork-605", "pard", {"0": 10, "1": 2}, 20, (8, 0)),
    # r0 10 -> (10, 15); r1 10 -> (0, 10). D = 5 + 5.
    ("fork-605", "dflash", {"0": 10, "1": 10}, 10, (0, 10)),
    ("fork-605", "dspark-anchor", {"0": 10, "1": 10}, 8, (0, 12)),
    ("fork-605", "dspark-fill-in", {"0": 10, "1": 10}, 10, (0, 12)),
]


@pytest.mark.parametrize(
    ("profile", "layout", "scheduled", "draft_rows", "left"),
    CASES,
    ids=[f"{c[0]}-{c[1]}" for c in CASES],
)
def test_first_step(
    profile: str,
    layout: str,
    scheduled: dict[str, int],
    draft_rows: int,
    left: tuple[int, int],
) -> None:
    record = first_step(profile, config(layout), PROMPTS)
    assert record.num_scheduled_tokens == scheduled
    assert record.target_tokens == sum(scheduled.values())
    assert record.draft_rows == draft_rows
    assert (record.budgets_left["token_budget"], record.budgets_left["input_budget"]) == left
    assert record.scheduled_spec_tokens == {}
    assert record.preempted == []


def test_every_policy_and_method_row_has_a_case() -> None:
    from dualbudget.spec.methods import LAYOUT_NAMES
    from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES

    # Every method row the profile's release builds (0.34 refuses the parallel drafters
    # but DFlash's and DSpark's).
    built = {(p, m) for p in PROFILE_NAMES for m in PROFILES[p].release.layouts}
    assert {(c[0], c[1]) for c in CASES} == built
    assert built < {(p, m) for p in PROFILE_NAMES for m in LAYOUT_NAMES}


def test_upstream_case() -> None:
    # The public upstream case: B = 20, max_num_seqs = 16, eagle3 K = 4 with parallel
    # drafting (P-EAGLE, slots 3), two 10-token prompts. r0: room min(20, 17) -> 10,
    # charged 13, input 7 left; r1: room min(10, 7 - 3) = 4.
    record = first_step("vllm-0.32", config("p-eagle", max_num_seqs=16), [10, 10])
    assert record.num_scheduled_tokens == {"0": 10, "1": 4}


def test_static_cap_caps_running_dflash_requests() -> None:
    # B = 20, max_num_seqs = 8, K = 4, six 2-token prompts.
    # vllm-0.33: slots 0; max_active = min(8, 20 // (K+1)) = 4: four requests admitted,
    #   2 tokens each (T = 8, D = 4 * 5 = 20).
    # vllm-0.32: slots 4, each charged 2 + 4 = 6: input 20 -> 14 -> 8 -> 2; at 2 <= 4 the
    #   loop stops after three requests (D = 15).
    cfg = config("dflash", max_num_seqs=8)
    capped = first_step("vllm-0.33", cfg, [2] * 6)
    assert capped.num_scheduled_tokens == {str(i): 2 for i in range(4)}
    assert capped.draft_rows == 20
    additive = first_step("vllm-0.32", cfg, [2] * 6)
    assert additive.num_scheduled_tokens == {str(i): 2 for i in range(3)}
    assert additive.draft_rows == 15


def test_max_num_seqs_caps_admission() -> None:
    # No speculation, max_num_seqs = 2, B = 20: three 3-token prompts, only two admitted.
    record = first_step("vllm-0.32", config(max_num_seqs=2), [3, 3, 3])
    assert record.num_scheduled_tokens == {"0": 3, "1": 3}


def test_max_num_scheduled_tokens_caps_the_target_budget() -> None:
    # S = max_num_scheduled_tokens = 12 < B = 20, eagle: r0 10; r1 room min(2, 10) = 2.
    record = first_step("dual", config("eagle", max_num_scheduled_tokens=12), PROMPTS)
    assert record.num_scheduled_tokens == {"0": 10, "1": 2}
