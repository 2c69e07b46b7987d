"""The executor flags: one declaration (``cli._executor_flags``) for every command on the
seam, each parsing into its own options' fields; ``--campaign`` only where a command
keeps its units."""

from __future__ import annotations

import dataclasses

import pytest

from dualbudget.cli import build_parser, options_from
from tests.paths import REPO

ON_THE_SEAM = {
    "fuzz": [],
    "mutate": [],
    "simulate": ["--sweep"],
    "diff": ["--search"],
    "prove": ["--reach"],
}
"""Each command whose units the executor runs, with the flag that makes it run them."""
CAMPAIGNS = {"fuzz", "mutate"}


@pytest.mark.parametrize("command", sorted(ON_THE_SEAM))
def test_every_command_on_the_seam_reads_the_same_flags(command: str) -> None:
    argv = [command, *ON_THE_SEAM[command], "--executor", "ray", "--jobs", "3"]
    args = build_parser().parse_args([*argv, "--ray-address", "auto"])
    options = options_from(args, args.options)
    assert (options.executor, options.jobs, options.ray_address) == ("ray", 3, "auto")
    fields = {field.name for field in dataclasses.fields(options)}
    assert ("campaign" in fields) == (command in CAMPAIGNS)


@pytest.mark.parametrize("command", sorted(ON_THE_SEAM))
def test_an_unknown_executor_is_refused_by_every_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--executor", "dask"])
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "argument --executor: invalid choice: 'dask'" in line


def test_one_declaration_serves_them_all() -> None:
    source = (REPO / "dualbudget" / "cli.py").read_text()
    assert source.count('"--executor"') == 1
    assert source.count('"--ray-address"') == 1
    assert source.count('"--jobs"') == 1
    assert source.count('"--campaign"') == 1
