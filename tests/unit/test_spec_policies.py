"""The budget policies, each on its profile's release, on hand-worked ledgers
(B = max_num_batched_tokens, K = 4).

Each case's arithmetic is in its comment; the numbers are not derived from the code.
"""

from __future__ import annotations

import pytest
import z3

from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import Ledger, StepParams
from dualbudget.spec.profiles import PROFILES


def params(layout: str, b: int = 20, seqs: int = 4, s: int | None = None) -> StepParams:
    return StepParams(b, b if s is None else s, seqs, 4, layout_named(layout))


def schedule(profile: str, p: StepParams, needs: list[int]) -> tuple[list[int], Ledger]:
    """The FCFS greedy step the schedulers run: grant, charge, stop when exhausted."""
    policy = PROFILES[profile].policy
    ledger = policy.open(p)
    granted = []
    for need in needs:
        if policy.exhausted(p, ledger):
            break
        q = policy.grant(p, ledger, need)
        if q == 0:
            break
        ledger = policy.apply(ledger, policy.charge(p, q))
        granted.append(q)
    return granted, ledger


def test_additive_p_eagle_upstream_case() -> None:
    # slots = K-1 = 3. First request: room min(20, 20-3) = 17, gets 10, charged 13 -> (10, 7).
    # Second: room min(10, 7-3) = 4, gets 4, charged 7 -> (6, 0); 0 <= 3 stops the step.
    granted, ledger = schedule("vllm-0.32", params("p-eagle", seqs=16), [10, 10, 10])
    assert granted == [10, 4]
    assert ledger == Ledger(6, 0)


def test_additive_dflash_reserves_k_slots() -> None:
    # 0.32 DFlash slots = K = 4: room min(20, 16) = 16, gets 10 -> (10, 6); room min(10, 2) = 2.
    granted, ledger = schedule("vllm-0.32", params("dflash"), [10, 10])
    assert granted == [10, 2]
    assert ledger == Ledger(8, 0)


def test_static_cap_dflash_reserves_nothing_and_caps_admission() -> None:
    # 0.33 DFlash slots = 0: both requests get 10; num_lookahead_tokens = K+1 = 5, so at most
    # 20 // 5 = 4 running requests even with max_num_seqs = 16.
    p = params("dflash", seqs=16)
    granted, ledger = schedule("vllm-0.33", p, [10, 10])
    assert granted == [10, 10]
    assert ledger == Ledger(0, 0)
    assert PROFILES["vllm-0.33"].policy.max_active_requests(p) == 4
    assert PROFILES["vllm-0.33"].policy.max_active_requests(params("eagle", seqs=16)) == 16


def test_global_reserve_fixes_the_target_cap() -> None:
    # S' = 20 - max_num_seqs * slots = 20 - 4 * 3 = 8, whatever the step holds.
    granted, ledger = schedule("global-reserve", params("p-eagle"), [10, 10])
    assert granted == [8]
    assert ledger == Ledger(0, 20)


def test_dual_charges_draft_rows_separately() -> None:
    # DFlash C(q) = K+1 = 5: target 10 + 10 = 20 <= 20, draft rows 5 + 5 = 10 <= 20.
    granted, ledger = schedule("dual", params("dflash"), [10, 10, 10])
    assert granted == [10, 10]
    assert ledger == Ledger(0, 10)
    # P-EAGLE C(q) = q + 3: room min(20, 20 - 3) = 17 -> 10, draft left 20 - 13 = 7;
    # then room min(10, 7 - 3) = 4.
    granted, ledger = schedule("dual", params("p-eagle"), [10, 10])
    assert granted == [10, 4]
    assert ledger == Ledger(6, 0)


def test_dual_ngram_is_bounded_by_target_tokens_only() -> None:
    granted, ledger = schedule("dual", params("ngram"), [15, 15])
    assert granted == [15, 5]
    assert ledger == Ledger(0, 20)


def test_refund_gives_back_exactly_the_charge() -> None:
    for name, policy in ((n, p.policy) for n, p in PROFILES.items()):
        p = params("pard")
        opened = policy.open(p)
        charge = policy.charge(p, 3)
        assert policy.refund(policy.apply(opened, charge), charge) == opened, name


def config(
    b: int,
    method: str,
    k: int = 4,
    parallel: bool = True,
    seqs: int = 4,
    dspark_layout: str | None = None,
) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=seqs,
        max_model_len=64,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig(method, k, parallel, dspark_layout),
    )


@pytest.mark.parametrize(
    ("profile", "method", "rejected_b", "accepted_b"),
    [
        ("vllm-0.32", "dflash", 4, 5),  # B must exceed slots = K = 4
        ("vllm-0.32", "eagle3", 3, 4),  # P-EAGLE slots = K-1 = 3
        ("vllm-0.33", "dflash", 5, 6),  # B must exceed num_lookahead_tokens = K+1 = 5
        ("vllm-0.33", "dspark", 4, 5),  # anchor layout: num_lookahead_tokens = K = 4
        ("dual", "dflash", 4, 5),  # B must hold C(1) = K+1 = 5
        ("dual", "draft_model", 4, 5),  # PARD C(1) = 1 + K = 5
        ("global-reserve", "eagle3", 12, 13),  # S' = B - 4 * 3 must be > 0
    ],
)
def test_admission_mirrors_vllm(
    profile: str, method: str, rejected_b: int, accepted_b: int
) -> None:
    policy = PROFILES[profile].policy
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        policy.validate(config(rejected_b, method, seqs=4))
    policy.validate(config(accepted_b, method, seqs=4))


def test_the_same_code_builds_the_proved_formula() -> None:
    # The z3 term the proofs check is the policy code itself: evaluated at a point it
    # agrees with the concrete run.
    b, s, seqs, k, tokens, rows, need = z3.Ints("b s seqs k tokens rows need")
    for name, policy in ((n, p.policy) for n, p in PROFILES.items()):
        for layout in ("eagle", "p-eagle", "dflash", "dspark-fill-in", "pard"):
            symbolic = StepParams(b, s, seqs, k, layout_named(layout))
            concrete = StepParams(23, 19, 3, 5, layout_named(layout))
            term = policy.grant(symbolic, Ledger(tokens, rows), need)
            point = [
                (b, z3.IntVal(23)),
                (s, z3.IntVal(19)),
                (seqs, z3.IntVal(3)),
                (k, z3.IntVal(5)),
                (tokens, z3.IntVal(17)),
                (rows, z3.IntVal(11)),
                (need, z3.IntVal(9)),
            ]
            value = z3.simplify(z3.substitute(term, *point)).as_long()
            assert value == policy.grant(concrete, Ledger(17, 11), 9), (name, layout)
