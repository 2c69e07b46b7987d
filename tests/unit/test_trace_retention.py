"""The shipped traces recorded at vLLM's engine default ``prefix_cache_retention_interval``
= 0 (a sliding-window group caches only the blocks a replay or a shared-prefix junction
resumes at): each replays as recorded, and replayed with every sliding-window block
cached (None) the reference diverges, so each pins the retention mask."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dualbudget import TRACES
from dualbudget.cli import main
from dualbudget.reference.formats.trace import read_trace

DENSE_DIVERGES_AT = {
    # The CPU engine (0.32): a tiny Llama of sliding-window and full-attention layers.
    "engine-draft-model-k3-sliding-window.ndjson": 23,
    # vLLM's own AsyncScheduler of each release, gpt-oss + EAGLE3's groups.
    "scheduler-async-0.32-gpt-oss-eagle3-retention-0.ndjson.gz": 3,
    "scheduler-async-0.33-gpt-oss-eagle3-retention-0.ndjson.gz": 3,
}
"""Each trace at retention 0 and the first step the reference decides otherwise when it is
replayed at None."""


def lines_of(path: Path) -> list[str]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as stream:
        return stream.read().splitlines()


@pytest.mark.parametrize("name", sorted(DENSE_DIVERGES_AT))
def test_it_holds_a_sliding_window_group_at_retention_0(name: str) -> None:
    header = read_trace(TRACES / name).header
    assert header.settings["kv_cache_groups"] == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert header.enable_prefix_caching
    assert header.config.prefix_cache_retention_interval == 0


def test_they_replay_with_hits(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    paths = [str(TRACES / name) for name in sorted(DENSE_DIVERGES_AT)]
    assert main(["replay", "--json", str(out), *paths]) == 0
    for summary in json.loads(out.read_text())["traces"]:
        assert summary["divergence"] is None and summary["violations"] == [], summary
        assert summary["free_blocks_divergence"] is None
        assert summary["prefix_hits"] > 0 and summary["natural_stops"] > 0, summary


@pytest.mark.parametrize("name", sorted(DENSE_DIVERGES_AT))
def test_dense_retention_diverges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    lines = lines_of(TRACES / name)
    header = json.loads(lines[0])
    header["settings"]["prefix_cache_retention_interval"] = None
    dense = tmp_path / "dense.ndjson"
    dense.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    out = tmp_path / "replay.json"
    assert main(["replay", "--json", str(out), str(dense)]) == 1, capsys.readouterr().err
    (summary,) = json.loads(out.read_text())["traces"]
    assert summary["divergence"]["step"] == DENSE_DIVERGES_AT[name], summary["divergence"]
