"""Every setting of the one table (``reference/formats/settings.py``) is loud: a trace that holds
it at a value the reference does not replay is refused by name, one line and exit 2, by
``replay`` and by ``simulate --trace`` alike; a trace written before the table gained a
row reads it at vLLM's default; ``dualbudget settings --json`` lists every row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget import TRACES
from dualbudget.cli import main
from dualbudget.reference.formats.settings import SETTING_NAMES, SETTINGS, Setting
from dualbudget.reference.formats.trace import TraceError, read_trace
from dualbudget.reference.runs.replay import check_settings
from dualbudget.spec.profiles import profile_named, release_profile
from dualbudget.spec.releases import RELEASE_VERSIONS, RELEASES, Release

BASE = TRACES / "engine-draft-model-k3-prefix.ndjson"
"""vLLM 0.32, draft model K = 3, prefix caching on: a trace written before the table
gained its optional rows."""

SLIDING = TRACES / "scheduler-async-0.33-gpt-oss-eagle3.ndjson.gz"
"""vLLM 0.33, sliding-window and full-attention groups, prefix caching on."""

MAMBA = TRACES / "scheduler-async-0.33-qwen3-next-mtp.ndjson.gz"
"""vLLM 0.33, a Mamba group in align mode beside full attention, prefix caching on."""

BASE_OF = {"prefix_cache_retention_interval": SLIDING, "mamba_prefill_checkpoint_blocks": MAMBA}
"""Rows whose cases need a layout ``BASE`` lacks (a sliding-window or Mamba group): the
trace each is set on instead."""

OTHER_VALUE: dict[str, Any] = {
    "enable_prefix_caching": False,
    "max_num_active_seqs": 3,
    "watermark": 0.01,
    "cache_aware_admission_window": 8,
    "scheduler_reserve_full_isl": False,
    "long_prefill_token_threshold_adaptive": True,
    "prefill_schedule_interval": 2,
    "num_speculative_tokens_per_batch_size": [[1, 8, 2]],
    "num_nextn_predict_layers": 3,
    "disable_eagle_block_drop": True,
    "disable_lookahead_block_hashes": True,
    "kv_cache_groups": ["FullAttentionSpec", "SlidingWindowSpec"],
    "prefix_cache_retention_interval": 0,
    "mamba_prefill_checkpoint_blocks": 1,
    "prefix_replay_tokens": 128,
    "prefix_match_unit": 8,
    "enable_mamba_shared_prefix_checkpoint": True,
    "enable_lora": True,
    "kv_connector": "OffloadingConnector",
    "pipeline_parallel_size": 2,
    "decode_context_parallel_size": 2,
    "disable_chunked_mm_input": True,
    "enable_return_routed_experts": True,
    "structured_outputs": True,
    "skip_reading_prefix_cache": True,
    "mm_encoder_inputs": True,
    "repetition_detection": True,
}
"""A value other than vLLM's default for every row; for a row not modelled, one the
reference does not replay on ``BASE``."""


CAPPING = next(r for r in RELEASES.values() if r.caps_hits_for_routed_experts)
UNCAPPING = next(r for r in RELEASES.values() if not r.caps_hits_for_routed_experts)
RECORDED_BY: dict[str, Release] = {"enable_return_routed_experts": CAPPING}
"""Rows whose refusal depends on the release: the one ``BASE`` is relabelled as."""


def with_setting(tmp_path: Path, setting: Setting, value: Any, base: Path | None = None) -> str:
    """``base`` (``BASE_OF``'s trace for the row, else ``BASE``) with ``setting`` at
    ``value``: in the header, or on the first request (and from the release
    ``RECORDED_BY`` names, if any)."""
    base = base or BASE_OF.get(setting.name, BASE)
    with gzip.open(base, "rt") if base.suffix == ".gz" else base.open() as stream:
        lines = stream.read().splitlines()
    header = json.loads(lines[0])
    if setting.name in RECORDED_BY:
        header["vllm_version"] = f"{RECORDED_BY[setting.name].version}.0"
    if setting.scope == "engine":
        header["settings"][setting.name] = value
    else:
        first = next(i for i, line in enumerate(lines) if '"add_request"' in line)
        request = json.loads(lines[first])
        request["settings"] = {setting.name: value}
        lines[first] = json.dumps(request)
    path = tmp_path / "t.ndjson"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return str(path)


def test_every_row_has_a_case() -> None:
    assert set(OTHER_VALUE) == set(SETTING_NAMES)
    assert all(OTHER_VALUE[s.name] != s.default for s in SETTINGS)


def test_every_row_is_read_from_a_live_vllm() -> None:
    """The live test of the recorder (``tests/live/test_settings_live.py``) sets every row on
    the objects vLLM built; a new row without a way to set it fails here too, outside the
    vLLM environments."""
    from tests.settings_changes import CHANGES

    assert set(CHANGES) == set(SETTING_NAMES)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if not s.modelled], ids=lambda s: s.name)
def test_replay_and_simulate_refuse_it_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: Setting
) -> None:
    path = with_setting(tmp_path, setting, OTHER_VALUE[setting.name])
    named = f"recorded with {setting.name} = {json.dumps(OTHER_VALUE[setting.name])}"
    for argv in (["replay", path], ["simulate", "--trace", path, "--quiet"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err and "does not model" in err, err


RETENTION = next(s for s in SETTINGS if s.name == "prefix_cache_retention_interval")


@pytest.mark.parametrize("value", [None, 0, 64])
def test_the_recorded_retention_reaches_the_replayed_config(tmp_path: Path, value: Any) -> None:
    """The header's value is the engine config's, which the sliding-window group's
    caching reads (``SlidingWindowManager.reachable_block_mask``), and is written back to the header
    only."""
    trace = read_trace(with_setting(tmp_path, RETENTION, value))
    assert trace.header.config.prefix_cache_retention_interval == value
    written = trace.header.to_json()
    assert written["settings"]["prefix_cache_retention_interval"] == value
    assert "prefix_cache_retention_interval" not in written["config"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (24, "(24) must be >= 0 and a multiple of the scheduler block size (16)"),
        (-16, "(-16) must be >= 0 and a multiple of the scheduler block size (16)"),
    ],
)
def test_a_retention_vllm_refuses_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: int, words: str
) -> None:
    """vLLM's coordinator raises on these (``_validate_prefix_cache_retention_interval``):
    ``replay`` and ``simulate --trace`` exit 2 naming the setting, in one line."""
    path = with_setting(tmp_path, RETENTION, value)
    for argv in (["replay", path], ["simulate", "--trace", path, "--quiet"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"prefix_cache_retention_interval: {words}" in err, err


def test_a_positive_retention_without_a_sliding_window_group_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only 0 is accepted where no group is sliding-window or Mamba (vLLM: retention has
    no effect there); 0 replays as recorded on such a trace."""
    assert main(["replay", with_setting(tmp_path, RETENTION, 0, base=BASE)]) == 0
    capsys.readouterr()
    assert main(["replay", with_setting(tmp_path, RETENTION, 32, base=BASE)]) == 2
    err = capsys.readouterr().err
    assert "prefix_cache_retention_interval: is 32, but no kv_group is sliding-window" in err


def test_routed_experts_replay_where_the_release_caps_no_hit(tmp_path: Path) -> None:
    (setting,) = [s for s in SETTINGS if s.name == "enable_return_routed_experts"]
    lines = with_setting(tmp_path, setting, True)
    trace = read_trace(lines)
    check_settings(trace, release_profile(UNCAPPING))
    with pytest.raises(TraceError, match="enable_return_routed_experts = true"):
        check_settings(trace, release_profile(CAPPING))


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.modelled], ids=lambda s: s.name)
def test_a_modelled_row_replays_every_value(tmp_path: Path, setting: Setting) -> None:
    for value in (setting.default, OTHER_VALUE[setting.name]):
        trace = read_trace(with_setting(tmp_path, setting, value))
        check_settings(trace, profile_named("vllm-0.32"))


def test_a_trace_older_than_a_row_reads_it_at_vllms_default() -> None:
    header = json.loads(BASE.read_text().splitlines()[0])
    optional = [s for s in SETTINGS if s.optional]
    assert optional and not any(s.name in header["settings"] for s in optional)
    settings = read_trace(BASE).header.settings
    assert all(settings[s.name] == s.default for s in optional)


def test_settings_json_lists_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in document["settings"]}
    assert list(rows) == list(SETTING_NAMES)
    for setting in SETTINGS:
        row = rows[setting.name]
        assert row["status"] == setting.status in ("modelled", "refused", "partly")
        assert set(row["releases"]) == set(RELEASE_VERSIONS)
        for release in RELEASE_VERSIONS:
            assert row["releases"][release]["default"] == setting.default
            assert row["releases"][release]["home"] == setting.home_in(release)
    assert rows["disable_lookahead_block_hashes"]["releases"]["0.32"]["home"] is None


DEPLOYMENT_SETTINGS = {
    "kv_connector": "refused",
    "pipeline_parallel_size": "refused",
    "decode_context_parallel_size": "refused",
    "disable_chunked_mm_input": "modelled",
    "enable_return_routed_experts": "partly",
    "kv_cache_groups": "partly",
    "mm_encoder_inputs": "refused",
    "repetition_detection": "refused",
}
"""Settings served deployments turn on (P/D disaggregation and KV offloading, pipeline and
decode context parallelism, multimodal inputs, routed-experts output, hybrid KV groups,
repetition detection), each with the status users are told."""


def test_settings_json_gives_each_deployment_setting_its_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["settings", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["settings"]}
    assert {name: rows[name]["status"] for name in DEPLOYMENT_SETTINGS} == DEPLOYMENT_SETTINGS


def test_settings_text_names_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    for setting in SETTINGS:
        assert f"{setting.name} ({setting.scope}): {setting.status}" in out


def test_ngram_gpu_takes_the_ngram_row_and_runs_async_in_both_releases() -> None:
    from dualbudget.spec.config import SpeculativeConfig, runs_async
    from dualbudget.spec.methods import layout_for
    from dualbudget.spec.releases import RELEASES

    assert layout_for("ngram_gpu", False, None).name == "ngram"
    spec = SpeculativeConfig("ngram_gpu", 3)
    assert all(runs_async(spec, release) for release in RELEASES.values())
