"""Regression tests for upstream: each finding the installed vLLM exhibits, as a
standalone pytest file in vLLM's own scheduler-test conventions.

An exhibit is one finding (a contract item a release breaks, ``proofs/manifest.toml``
``[expected]``) or one mirrored crash (a state where vLLM fails its own assertion,
``proofs/manifest.toml`` ``[crashes]``), written as a test: a scheduler built inside the
file from vLLM's public classes (``ModelConfig`` over a folder holding only a
``config.json``, ``SchedulerConfig``, ``CacheConfig``, ``SpeculativeConfig``,
``VllmConfig``, a one-group ``KVCacheConfig``, ``Scheduler``), requests added, steps
driven, the contract item asserted with a message that says why. A file imports nothing
of dualbudget and nothing of vLLM's tests (they are not in the wheel), so it can be
dropped into vLLM's ``tests/v1/core/``.

The contract item is asserted, not a recorded outcome: each test passes on a scheduler
that follows the contract (such as the ``pr-53080`` split draft budget); a crash test
passes on a scheduler that does not fail its assertion. ``write_upstream`` runs every
exhibit against the installed vLLM in a pytest subprocess and keeps those that fail with
their own message (confirmed by running, not by the proofs alone); the manifest beside
them (``upstream-manifest.json``) names each and says why. ``check_junit`` compares a
later pytest run's JUnit XML with that manifest: exactly the predicted failures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.proofs.manifest import MANIFEST, load_manifest
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import layout_named
from dualbudget.spec.profiles import PROFILES, release_profile
from dualbudget.spec.releases import release_of

from .live import ENVIRONMENT, MODEL_CONFIGS, require_vllm
from .vllm_source import active_source

MANIFEST_NAME = "upstream-manifest.json"
MANIFEST_FORMAT = "dualbudget-upstream"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Crash:
    """One mirrored crash, as ``proofs/manifest.toml`` ``[crashes.NAME]`` records it."""

    name: str
    releases: tuple[str, ...]
    """The vLLM releases whose scheduler fails the assertion."""
    assertion: str
    """vLLM's assertion, where it is."""
    config: str
    """The accepted configs that reach it."""
    traffic: str
    """The requests and steps that lead there in the engine."""
    why: str
    test: str | None = None
    """The project's live test that reaches it (``FILE::FUNCTION``), for a crash whose
    scheduler a generated test cannot build (it builds one full-attention group); None:
    an ``Exhibit`` writes its test."""


def load_crashes(path: Path = MANIFEST) -> dict[str, Crash]:
    """The mirrored crashes with their reachability, beside the contract findings."""
    try:
        table = tomllib.loads(path.read_text()).get("crashes", {})
        return {
            name: Crash(
                name,
                tuple(entry["releases"]),
                entry["assertion"],
                entry["config"],
                entry["traffic"],
                entry["why"],
                entry.get("test"),
            )
            for name, entry in table.items()
        }
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as err:
        raise BadInput(f"manifest {str(path)!r} [crashes]: {err}") from None


@dataclass(frozen=True)
class Exhibit:
    """One finding or crash as a test: the scheduler's settings and the test body."""

    name: str
    """The test's name (``test_NAME`` in ``test_NAME.py``)."""
    finding: str
    """``LAYOUT/CHECK`` of a contract finding (the obligation name under a release's
    profile), or ``crash/NAME`` of ``[crashes]``."""
    marker: str
    """The start of the assertion message: a failure that does not carry it is not this
    exhibit's (a config vLLM refuses, a different error)."""
    method: str
    num_speculative_tokens: int
    max_num_batched_tokens: int
    body: str
    """The test function's statements; ``scheduler`` is built before them."""
    parallel_drafting: bool = False
    draft: str | None = None
    """The draft model's config (``live.MODEL_CONFIGS`` key), for a model-based drafter."""
    long_prefill_token_threshold: int = 0
    max_num_seqs: int = 16
    """Capped at ``max_num_batched_tokens``, as vLLM requires."""
    runner_v2: bool = False
    """vLLM's model runner V1 refuses DSpark: it is built under V2 (the scheduler never
    runs a kernel, so vLLM's Triton check is forced off where the CPU build lacks it)."""
    constants: Mapping[str, int] = field(default_factory=dict)
    """Module-level constants the body reads, with the reason as a comment."""
    notes: Mapping[str, str] = field(default_factory=dict)

    def predicted(self, version: str) -> bool:
        """Whether the proofs (or the crash record) say vLLM ``version`` exhibits it."""
        return self.predicted_under(release_profile_of(version))

    def predicted_under(self, profile: str | None) -> bool:
        """Whether the proofs say a scheduler deciding as ``profile`` exhibits it; for a
        crash, whether the crash record names the release ``profile`` runs on (a source
        tree keeps its base release's code outside the budget). None: no prediction."""
        if profile is None:
            return False
        if self.finding.startswith("crash/"):
            crash = load_crashes()[self.finding.removeprefix("crash/")]
            return PROFILES[profile].release.version in crash.releases
        return load_manifest().expected(f"{profile}/{self.finding}") == "fails"

    def why(self, version: str) -> str:
        return self.why_under(release_profile_of(version))

    def why_under(self, profile: str | None) -> str:
        if self.finding.startswith("crash/"):
            crash = load_crashes()[self.finding.removeprefix("crash/")]
            return f"{crash.why} Reached with {crash.config}; traffic: {crash.traffic}"
        if profile is None:
            return self.finding
        return load_manifest().why.get(f"{profile}/{self.finding}", self.finding)


def release_profile_of(version: str) -> str | None:
    """The profile of the release ``version`` belongs to; None for an unknown one."""
    release = release_of(version)
    return None if release is None else release_profile(release).name


def _k_rows(layout: str, k: int, q: int) -> int:
    return int(layout_named(layout).draft_rows(q, k))


def exhibits() -> tuple[Exhibit, ...]:
    """Every finding and crash the generator can write, each on the smallest config that
    shows it (the manifest's minimal witnesses, scaled to a scheduler vLLM accepts)."""
    return _budget_exhibits() + _stall_and_crash_exhibits()


def _budget_exhibits() -> tuple[Exhibit, ...]:
    """The budgets' findings: draft rows past the buffer (C3), capacity left unused (C5)."""
    fill_in_k, fill_in_b = 2, 8
    dflash_k, dflash_b = 2, 16
    ngram_k, ngram_b = 3, 16
    return (
        Exhibit(
            name="dspark_fill_in_draft_rows_fit_max_num_batched_tokens",
            finding="dspark-fill-in/C3",
            marker="C3 buffer peak:",
            method="dspark",
            draft="dflash-fill-in",
            runner_v2=True,
            num_speculative_tokens=fill_in_k,
            max_num_batched_tokens=fill_in_b,
            constants={
                "DRAFT_ROWS_PER_REQUEST": _k_rows("dspark-fill-in", fill_in_k, 1),
                "NUM_REQUESTS": fill_in_b,
            },
            notes={
                "DRAFT_ROWS_PER_REQUEST": "DSpark fill-in reads K + 1 draft rows whatever"
                " the request's query length"
            },
            body="""
            for request in create_requests(NUM_REQUESTS, num_tokens=1):
                scheduler.add_request(request)
            output = scheduler.schedule()
            target_rows = output.total_num_scheduled_tokens
            draft_rows = DRAFT_ROWS_PER_REQUEST * len(output.num_scheduled_tokens)
            assert max(target_rows, draft_rows) <= MAX_NUM_BATCHED_TOKENS, (
                f"C3 buffer peak: {len(output.num_scheduled_tokens)} one-token requests"
                f" scheduled, each reading {DRAFT_ROWS_PER_REQUEST} draft rows, so the"
                f" drafter's forward needs {draft_rows} rows of the model runner's"
                f" {MAX_NUM_BATCHED_TOKENS}-row input buffer (max_num_batched_tokens):"
                " the budget charged each request fewer rows than its draft pass reads"
            )
            """,
        ),
        Exhibit(
            name="dflash_long_prompt_gets_the_whole_budget",
            finding="dflash/C5",
            marker="C5 tightness:",
            method="dflash",
            draft="dflash",
            num_speculative_tokens=dflash_k,
            max_num_batched_tokens=dflash_b,
            constants={
                "DRAFT_ROWS": _k_rows("dflash", dflash_k, dflash_b),
                "PROMPT_LEN": 4 * dflash_b,
            },
            notes={"DRAFT_ROWS": "DFlash's draft pass reads K + 1 rows whatever q is"},
            body=_C5_BODY,
        ),
        Exhibit(
            name="ngram_parallel_long_prompt_gets_the_whole_budget",
            finding="ngram-parallel/C5",
            marker="C5 tightness:",
            method="ngram",
            parallel_drafting=True,
            num_speculative_tokens=ngram_k,
            max_num_batched_tokens=ngram_b,
            constants={
                "DRAFT_ROWS": _k_rows("ngram-parallel", ngram_k, ngram_b),
                "PROMPT_LEN": 4 * ngram_b,
            },
            notes={"DRAFT_ROWS": "ngram runs no draft forward"},
            body=_C5_BODY,
        ),
    )


def _stall_and_crash_exhibits() -> tuple[Exhibit, ...]:
    """An empty step with a runnable request (C4), and a step vLLM's own assertion fails."""
    return (
        Exhibit(
            name="ngram_parallel_small_budget_schedules_a_token",
            finding="ngram-parallel/C4",
            marker="C4 progress:",
            method="ngram",
            parallel_drafting=True,
            num_speculative_tokens=4,
            max_num_batched_tokens=3,
            body="""
            scheduler.add_request(create_requests(1, num_tokens=1)[0])
            output = scheduler.schedule()
            assert output.total_num_scheduled_tokens > 0, (
                "C4 progress: an empty step with one runnable one-token request and a"
                f" free KV pool: max_num_batched_tokens = {MAX_NUM_BATCHED_TOKENS} was"
                f" accepted with K - 1 = {NUM_SPECULATIVE_TOKENS - 1} parallel-drafting"
                " slots charged per request, so the budget never admits it, although"
                " ngram runs no draft forward"
            )
            """,
        ),
        Exhibit(
            name="padded_decode_cut_by_long_prefill_threshold",
            finding="crash/padded-decode-cut-by-long-prefill-threshold",
            marker="vLLM's own assertion:",
            method="ngram",
            num_speculative_tokens=2,
            max_num_batched_tokens=64,
            long_prefill_token_threshold=1,
            body="""
            scheduler.add_request(create_requests(1, num_tokens=1)[0])
            step(scheduler)
            # A one-token prompt joins the decode batch: vLLM pads it to 1 + K rows,
            # then long_prefill_token_threshold (< 1 + K) cuts it.
            scheduler.add_request(create_requests(1, num_tokens=1, first_id=1)[0])
            try:
                output = scheduler.schedule()
            except AssertionError as err:
                pytest.fail(
                    "vLLM's own assertion: a new one-token request padded to 1 + K ="
                    f" {1 + NUM_SPECULATIVE_TOKENS} rows was cut to"
                    f" long_prefill_token_threshold = {LONG_PREFILL_TOKEN_THRESHOLD},"
                    f" which the config accepted; schedule() fails {err!r}"
                )
            assert output.total_num_scheduled_tokens <= MAX_NUM_BATCHED_TOKENS
            """,
        ),
    )


_C5_BODY = """
scheduler.add_request(create_requests(1, num_tokens=PROMPT_LEN)[0])
output = scheduler.schedule()
granted = output.num_scheduled_tokens["0"]
assert granted == MAX_NUM_BATCHED_TOKENS, (
    f"C5 tightness: a {PROMPT_LEN}-token prompt alone in the step was granted {granted}"
    f" tokens although T = {MAX_NUM_BATCHED_TOKENS} target rows and D = {DRAFT_ROWS}"
    f" draft rows both fit max_num_batched_tokens = {MAX_NUM_BATCHED_TOKENS}: the budget"
    " charged draft slots that do not grow with the request as if they did"
)
"""


_HEADER = '''\
"""{title}

{why}

Generated by `dualbudget report --upstream` against vLLM {version}, where it fails.
Standalone, in the conventions of vLLM's own scheduler tests: the scheduler
is built here from vLLM's public classes over a folder holding only a model's
config.json (no weights are read); requests are added and steps driven through the
Scheduler's own API. It passes on a scheduler that follows the contract.
"""

import json

{pytest}import torch
import vllm.config.vllm
import vllm.triton_utils
from vllm.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
'''

_HELPERS = '''

def model_dir(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def create_scheduler(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if MODEL_RUNNER_V2 else "0")
    # Only the scheduler is built: no kernel runs, so Triton is not needed (model runner
    # V2 asks for it, and so does the CPU platform of later releases).
    if MODEL_RUNNER_V2:
        monkeypatch.setattr(vllm.config.vllm, "HAS_TRITON", True, raising=False)
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True, raising=False)
    model_config = ModelConfig(
        model=model_dir(tmp_path, "target", TARGET_CONFIG),
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
        dtype="bfloat16",
    )
    speculative_kwargs = {
        "method": METHOD,
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
    }
    if DRAFT_CONFIG is not None:
        speculative_kwargs["model"] = model_dir(tmp_path, "draft", DRAFT_CONFIG)
    if METHOD in ("ngram", "eagle", "eagle3", "draft_model"):
        speculative_kwargs["parallel_drafting"] = PARALLEL_DRAFTING
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_num_seqs=MAX_NUM_SEQS,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=True,
            long_prefill_token_threshold=LONG_PREFILL_TOKEN_THRESHOLD,
            is_encoder_decoder=False,
        ),
        cache_config=cache_config(),
        speculative_config=SpeculativeConfig(
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
            **speculative_kwargs,
        ),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layers.0"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=32, dtype=torch.bfloat16
                ),
            )
        ],
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=False,
    )


def cache_config():
    config = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="auto", enable_prefix_caching=False)
    config.num_gpu_blocks = NUM_BLOCKS
    return config


def create_requests(num_requests, num_tokens, first_id=0):
    return [
        Request(
            request_id=str(first_id + i),
            prompt_token_ids=[11] * num_tokens,
            sampling_params=SamplingParams(max_tokens=16, ignore_eos=True),
            pooling_params=None,
        )
        for i in range(num_requests)
    ]


def step(scheduler):
    """One scheduled step answered by a model that samples one token per request."""
    output = scheduler.schedule()
    req_ids = list(output.num_scheduled_tokens)
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=req_ids,
{index}            sampled_token_ids=[[12] for _ in req_ids],
        ),
    )
    return output

'''


_REQUEST_INDEX = "            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},\n"
"""The ``ModelRunnerOutput`` field mapping each request id to its output."""


def indexes_requests() -> bool:
    """Whether the installed vLLM's ``ModelRunnerOutput`` takes ``req_id_to_index``
    (later releases index the outputs by ``req_ids``)."""
    from vllm.v1.outputs import ModelRunnerOutput

    from .vllm_api import has_field

    return has_field(ModelRunnerOutput, "req_id_to_index")


def source(exhibit: Exhibit, version: str, why: str, request_index: bool = True) -> str:
    """The test file of ``exhibit``, as written for vLLM ``version`` (whose
    ``ModelRunnerOutput`` takes ``req_id_to_index`` where ``request_index``)."""
    title = exhibit.name.replace("_", " ").capitalize() + f" ({exhibit.finding})."
    wrapped = "\n".join(textwrap.wrap(why, 88, break_on_hyphens=False))
    settings: list[tuple[str, Any, str | None]] = [
        ("METHOD", exhibit.method, None),
        ("NUM_SPECULATIVE_TOKENS", exhibit.num_speculative_tokens, None),
        ("PARALLEL_DRAFTING", exhibit.parallel_drafting, None),
        ("MODEL_RUNNER_V2", exhibit.runner_v2, None),
        ("MAX_NUM_BATCHED_TOKENS", exhibit.max_num_batched_tokens, None),
        ("MAX_NUM_SEQS", min(exhibit.max_num_seqs, exhibit.max_num_batched_tokens), None),
        ("MAX_MODEL_LEN", 256, None),
        ("LONG_PREFILL_TOKEN_THRESHOLD", exhibit.long_prefill_token_threshold, None),
        ("BLOCK_SIZE", 16, None),
        ("NUM_BLOCKS", 256, None),
        *((k, v, exhibit.notes.get(k)) for k, v in exhibit.constants.items()),
    ]
    uses_pytest = "pytest." in exhibit.body
    header = _HEADER.format(
        title=title, why=wrapped, version=version, pytest="import pytest\n" if uses_pytest else ""
    )
    lines = [header]
    lines.append("# A tiny model: vLLM reads its config.json only.")
    lines.append(f"TARGET_CONFIG = {_literal(MODEL_CONFIGS['target'])}")
    draft = None if exhibit.draft is None else MODEL_CONFIGS[exhibit.draft]
    lines.append(f"DRAFT_CONFIG = {_literal(draft)}")
    lines.append("")
    for name, value, note in settings:
        if note:
            lines.append(f"# {note}.")
        lines.append(f"{name} = {_py(value)}")
    lines.append(_HELPERS.replace("{index}", _REQUEST_INDEX if request_index else ""))
    body = textwrap.indent(textwrap.dedent(exhibit.body).strip("\n"), "    ")
    lines.append(
        f"def test_{exhibit.name}(tmp_path, monkeypatch):\n"
        "    scheduler = create_scheduler(tmp_path, monkeypatch)\n"
        f"{body}\n"
    )
    return "\n".join(lines)


def _literal(value: Any) -> str:
    """A Python literal of a JSON-like value, one key a line, within 100 columns."""
    if value is None:
        return "None"
    items = [f"    {json.dumps(k)}: {_py(v)}," for k, v in value.items()]
    return "{\n" + "\n".join(items) + "\n}"


def _py(value: Any) -> str:
    if isinstance(value, bool):
        return repr(value)
    return json.dumps(value)


@dataclass(frozen=True)
class Outcome:
    """What pytest said of one test: ``passed``, ``failed`` or ``error``, and why."""

    test: str
    outcome: str
    message: str


def pytest_args(folder: Path, junit: Path) -> list[str]:
    """pytest's arguments for the files of ``folder``, standalone: no project config (so
    no plugin or option of ours reaches the files), the outcomes as JUnit XML."""
    return [
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.devnull,
        "--rootdir",
        str(folder),
        f"--junitxml={junit}",
        str(folder),
    ]


def run_pytest(folder: Path, junit: Path) -> dict[str, Outcome]:
    """Run every test file of ``folder`` with the running Python's pytest; its outcomes."""
    env = {**os.environ, **ENVIRONMENT}
    command = [sys.executable, "-m", "pytest", *pytest_args(folder, junit)]
    subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    return read_junit(junit)


def read_junit(junit: Path) -> dict[str, Outcome]:
    try:
        root = ElementTree.parse(junit).getroot()
    except (OSError, ElementTree.ParseError) as err:
        raise BadInput(f"--check-junit {str(junit)!r}: not a JUnit XML file ({err})") from None
    outcomes: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        failure = case.find("failure")
        error = case.find("error")
        if failure is not None:
            outcomes[name] = Outcome(name, "failed", _message(failure))
        elif error is not None:
            outcomes[name] = Outcome(name, "error", _message(error))
        elif case.find("skipped") is not None:
            outcomes[name] = Outcome(name, "skipped", _message(case.find("skipped")))
        else:
            outcomes[name] = Outcome(name, "passed", "")
    return outcomes


def _message(node: ElementTree.Element | None) -> str:
    if node is None:
        return ""
    return f"{node.get('message', '')}\n{node.text or ''}"


@dataclass
class UpstreamResult:
    version: str
    written: list[dict[str, Any]]
    not_exhibited: list[dict[str, Any]]
    mismatches: list[str]
    profile: str | None = None
    """The profile the predictions follow (None: none, what ran is the answer)."""
    how: str = "by its version"
    """How ``profile`` was chosen: the release's version, or a tree's decisions."""


def predicting_profile(version: str) -> tuple[str | None, str]:
    """(profile, how) the predictions follow: the installed release's own profile, or for
    a ``--vllm-src`` tree (whose version string says nothing of its code), the profile
    detected by its decisions; None where neither is known."""
    from .detect import detect

    if active_source() is None:
        return release_profile_of(version), "by its version"
    found = detect()
    return found.profile, found.how_chosen() if found.profile else "no profile matches"


def write_upstream(out: Path) -> UpstreamResult:
    """Write the exhibits the vLLM this process runs fails to ``out``, with their manifest."""
    version = require_vllm()
    profile, how = predicting_profile(version)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--upstream {str(out)!r}: cannot create: {err.strerror}") from None
    candidates = exhibits()
    tree = active_source()
    with tempfile.TemporaryDirectory(prefix="dualbudget-upstream-") as tmp:
        folder = Path(tmp) / "tests"
        folder.mkdir()
        texts = {}
        index = indexes_requests()
        for exhibit in candidates:
            texts[exhibit.name] = source(exhibit, version, exhibit.why_under(profile), index)
            (folder / f"test_{exhibit.name}.py").write_text(texts[exhibit.name])
        outcomes = run_pytest(folder, Path(tmp) / "junit.xml")
    for exhibit in candidates:  # a test no longer exhibited must not stay behind
        (out / f"test_{exhibit.name}.py").unlink(missing_ok=True)
    result = UpstreamResult(version, [], [], [], profile, how)
    for exhibit in candidates:
        test = f"test_{exhibit.name}"
        outcome = outcomes.get(test, Outcome(test, "error", "not collected"))
        exhibited = outcome.outcome == "failed" and exhibit.marker in outcome.message
        predicted = exhibit.predicted_under(profile)
        entry: dict[str, Any] = {
            "file": f"{test}.py",
            "test": test,
            "finding": exhibit.finding,
            "marker": exhibit.marker,
            "why": exhibit.why_under(profile),
        }
        if exhibited:
            (out / f"{test}.py").write_text(texts[exhibit.name])
            result.written.append({**entry, "predicted": "fails"})
        else:
            result.not_exhibited.append(
                {**entry, "outcome": outcome.outcome, "message": _first_line(outcome)}
            )
        # A version of no known release has no prediction: what ran is the answer.
        if profile is not None and exhibited != predicted:
            said = "fails" if predicted else "holds"
            result.mismatches.append(
                f"{test} ({exhibit.finding}): predicted {said} on vLLM {version}"
                f" (profile {profile}), ran {outcome.outcome}: {_first_line(outcome)}"
            )
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "vllm_version": version,
        "profile": profile,
        "vllm_src": None if tree is None else str(tree.tree),
        "tests": result.written,
        "not_exhibited": result.not_exhibited,
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    return result


def _first_line(outcome: Outcome) -> str:
    lines = [line.strip() for line in outcome.message.splitlines() if line.strip()]
    return lines[0][:300] if lines else outcome.outcome


def load_upstream_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadInput(f"--upstream {str(folder)!r}: no readable {MANIFEST_NAME} ({err})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise BadInput(f"{path}: not a {MANIFEST_FORMAT} manifest")
    return data


def check_junit(folder: Path, junit: Path) -> list[str]:
    """What differs between a pytest run of ``folder`` (its JUnit XML) and the manifest:
    each listed test must fail carrying its marker, and no other test may fail."""
    manifest = load_upstream_manifest(folder)
    outcomes = read_junit(junit)
    problems = []
    predicted = {t["test"]: t for t in manifest["tests"]}
    for test, entry in predicted.items():
        outcome = outcomes.get(test)
        if outcome is None:
            problems.append(f"{test}: predicted to fail, not run")
        elif outcome.outcome != "failed" or entry["marker"] not in outcome.message:
            problems.append(
                f"{test}: predicted to fail with {entry['marker']!r}, {outcome.outcome}:"
                f" {_first_line(outcome)}"
            )
    for test, outcome in outcomes.items():
        if test not in predicted and outcome.outcome != "passed":
            problems.append(f"{test}: not predicted to fail, {outcome.outcome}")
    return problems


def summary_lines(result: UpstreamResult, out: Path) -> Sequence[str]:
    predicted = f"profile {result.profile}" if result.profile else "no prediction"
    lines = [
        f"vLLM {result.version} ({predicted}, {result.how}): {len(result.written)} upstream"
        f" tests written to {out} ({MANIFEST_NAME} beside them)"
    ]
    lines += [f"  fails: {t['test']} ({t['finding']})" for t in result.written]
    lines += [
        f"  not exhibited: {t['test']} ({t['finding']}): {t['outcome']}"
        for t in result.not_exhibited
    ]
    lines += [f"MISMATCH {m}" for m in result.mismatches]
    return lines
