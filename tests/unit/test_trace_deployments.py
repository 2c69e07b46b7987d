"""The shipped scheduler traces of the served families (``reference/formats/deployments.py``):
each was recorded at its family's vLLM defaults (its KV cache groups, drafter and K,
async scheduling as the release runs the drafter, prefix caching on), in both releases,
and ``replay --json`` shows every decision agreeing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dualbudget import TRACES
from dualbudget.cli import main
from dualbudget.reference.formats.deployments import DEPLOYMENTS, Deployment
from dualbudget.reference.formats.trace import Trace, read_trace
from dualbudget.spec.config import SpeculativeConfig, runs_async
from dualbudget.spec.releases import RELEASE_VERSIONS, release_of
from tests.paths import REPO

SHIPPED = sorted(TRACES.glob("*.ndjson*"))
FAMILY_TRACES = {
    path: trace for path in SHIPPED if "deployment" in (trace := read_trace(path)).header.notes
}
"""Every shipped trace recorded as a family of the deployment table."""


def family_of(trace: Trace) -> Deployment:
    note = str(trace.header.notes["deployment"])
    (deployment,) = [d for d in DEPLOYMENTS if note.startswith(f"{d.family} at ")]
    return deployment


def test_families_beyond_one_full_attention_group_ship_in_every_release() -> None:
    shipped: dict[str, set[str]] = {}
    for trace in FAMILY_TRACES.values():
        release = release_of(trace.header.vllm_version)
        assert release is not None
        shipped.setdefault(family_of(trace).family, set()).add(release.version)
    layouts = {d.family: [name for name, _ in d.groups] for d in DEPLOYMENTS}
    assert any(layouts[family] != ["FullAttentionSpec"] for family in shipped)
    assert all(versions == set(RELEASE_VERSIONS) for versions in shipped.values()), shipped


@pytest.mark.parametrize("path", sorted(FAMILY_TRACES), ids=lambda p: p.name)
def test_a_family_trace_holds_its_familys_defaults(path: Path) -> None:
    trace = FAMILY_TRACES[path]
    header, deployment = trace.header, family_of(trace)
    release = release_of(header.vllm_version)
    assert release is not None
    config = header.config
    assert header.settings["kv_cache_groups"] == [name for name, _ in deployment.groups]
    assert config.groups == deployment.config(release).groups
    spec = config.speculative_config
    assert spec is not None and spec.num_speculative_tokens == deployment.num_speculative_tokens
    if spec.method != deployment.method:
        # A drafter that cannot be built here is stood in for, and the notes say so.
        assert f"stands in for {deployment.method}" in str(header.notes["stand_in"])
    assert config.async_scheduling == runs_async(spec, release) == header.async_scheduling
    assert header.settings["enable_prefix_caching"] is True
    assert config.enable_prefix_caching


def test_replay_json_shows_every_family_trace_agreeing(tmp_path: Path) -> None:
    assert FAMILY_TRACES
    out = tmp_path / "replay.json"
    assert main(["replay", "--json", str(out), *map(str, FAMILY_TRACES)]) == 0
    summaries = json.loads(out.read_text())["traces"]
    assert len(summaries) == len(FAMILY_TRACES)
    for summary, trace in zip(summaries, FAMILY_TRACES.values(), strict=True):
        assert summary["divergence"] is None and summary["violations"] == [], summary
        assert summary["steps_checked"] == trace.steps > 0
        # Recorded in version 4: vLLM's pool after every step, matched by the reference's.
        assert summary["free_blocks_divergence"] is None
        assert summary["free_blocks_checked"] == trace.steps, summary["path"]
        assert summary["prefix_hits"] > 0, summary["path"]
        assert summary["natural_stops"] > 0, summary["path"]


def test_record_gpu_presets_serve_their_familys_drafter_and_k() -> None:
    """``scripts/record-gpu.sh --preset FAMILY`` records a GPU deployment of a family of
    the table: its speculative config names the family's method and K."""
    script = (REPO / "scripts" / "record-gpu.sh").read_text()
    presets = dict(re.findall(r"\n    ([a-z0-9-]+)\)\n(?:.*\n)*?\s*speculative='([^']*)'", script))
    assert set(presets) == {"gpt-oss-eagle3", "deepseek-mtp", "qwen3-next-mtp"}
    for preset, speculative in presets.items():
        prefix = preset.rsplit("-", 1)[0]
        family = next(
            d for d in DEPLOYMENTS if not d.settings and d.family.lower().startswith(prefix)
        )
        config = json.loads(speculative)
        assert config["method"] == family.method, preset
        assert config["num_speculative_tokens"] == family.num_speculative_tokens, preset


def test_a_stand_in_drafter_must_be_scheduled_alike() -> None:
    from dualbudget.integration.scheduler_trace import check_stands_in, deployment_config
    from dualbudget.reference.runs.workload import preset
    from dualbudget.spec.errors import BadInput
    from dualbudget.spec.releases import RELEASES

    base = preset("chat-system-prompt").scenario(0).config
    for release in RELEASES.values():
        config, notes = deployment_config(
            base, "Qwen3-Next + MTP, Triton prefill", "eagle", release
        )
        spec = config.speculative_config
        assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle", 2)
        assert "stands in for mtp" in notes["stand_in"] and config.enable_prefix_caching
        assert {g.mamba_cache_mode for g in config.groups if g.kind == "mamba"} == {"align"}
        off, notes = deployment_config(
            base, "Qwen3-Next + MTP, Triton prefill", "eagle", release, False
        )
        assert not off.enable_prefix_caching and "off" in notes["prefix_caching"]
        assert {g.mamba_cache_mode for g in off.groups if g.kind == "mamba"} == {"none"}
        with pytest.raises(BadInput, match="--stand-in 'dflash'"):
            check_stands_in(SpeculativeConfig("mtp", 2), "dflash", release)
    with pytest.raises(BadInput, match="no deployment 'Falcon'"):
        deployment_config(base, "Falcon", None, RELEASES["0.33"])
