"""``dualbudget matrix``: every vLLM release of ``requirements/matrix.txt`` (or
``--releases``) in an environment of its own, detected by its decisions and fuzzed, one
row each in docs/release-matrix.md (``integration/matrix.py``); ``--render DIR``
re-renders that table from kept JSON files alone.

The command line fills what ``integration/`` may not read itself: the proofs' known
findings (``fuzz_cli.known_findings``), handed to each release's unit as a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualbudget.campaign.executor import DEFAULT_EXECUTOR
from dualbudget.spec.errors import BadInput

MATRIX_EXAMPLES = 24
"""Examples of each release's fuzz: a short run, about a minute a release here."""


@dataclass(frozen=True, kw_only=True)
class MatrixOptions:
    """One ``dualbudget matrix`` run; the command line fills it from its flags."""

    releases: str | None = None
    """Comma-separated versions (``0.27.1,0.31.0``) or pins; None: every listed one."""
    examples: int = MATRIX_EXAMPLES
    seed: int = 0
    campaign: str | None = None
    """The campaign folder; None: ``out/release-matrix/<key>``, one per sources and options."""
    executor: str = DEFAULT_EXECUTOR
    jobs: int = 1
    """Releases at once (each release's fuzz runs in one process)."""
    ray_address: str | None = None
    keep_envs: bool = False
    """Keep each release's environment (about 2 GB) for the next run."""
    cache_dir: str = ".venv-matrix"
    json_dir: str = "docs/release-matrix"
    doc: str = "docs/release-matrix.md"
    render: str | None = None
    """Only re-render ``doc``'s table from the JSON files of this folder."""


def command_line(options: MatrixOptions) -> str:
    """The run's command, as the table records it (the flags its results depend on)."""
    words = ["dualbudget", "matrix"]
    if options.releases is not None:
        words += ["--releases", options.releases]
    words += ["--examples", str(options.examples), "--seed", str(options.seed)]
    return " ".join(words)


def matrix_command(options: MatrixOptions) -> int:
    from dualbudget.campaign.executor import ExecutorUnavailable
    from dualbudget.integration import matrix

    if options.render is not None:
        print(matrix.render_doc(options.render, options.doc))
        return 0
    from dualbudget.fuzz_cli import known_findings

    releases = matrix.parse_releases(options.releases, matrix.listed_releases())
    try:
        matrix.run_matrix(
            releases,
            examples=options.examples,
            seed=options.seed,
            known_findings=known_findings(),
            command=command_line(options),
            campaign_dir=options.campaign,
            executor=options.executor,
            jobs=options.jobs,
            ray_address=options.ray_address,
            keep_envs=options.keep_envs,
            cache_dir=options.cache_dir,
            json_dir=options.json_dir,
        )
    except ExecutorUnavailable as err:
        raise BadInput(str(err)) from None
    block = matrix.render_doc(options.json_dir, options.doc)
    print(f"dualbudget matrix: {options.doc} rendered from {options.json_dir}")
    print(block)
    return 0
