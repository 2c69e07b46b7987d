"""PNG plots of simulation results (matplotlib, Agg backend, imported only here)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dualbudget.reference.runs.simulate import SimResult
from dualbudget.reference.runs.sweep import CellVerdict, SweepRow, cell_label

MAX_POINTS = 4000
"""Long runs are drawn as per-bucket means (and maxima for rows) of at most this many
points, so that the PNG stays readable; the bucket size is in the axis label."""


STYLES = ("-", "--", ":")
"""Profiles that decide alike draw the same curve: distinct styles keep each visible."""


def _buckets(values: Sequence[int], how: str) -> tuple[list[int], list[float], int]:
    size = max(1, -(-len(values) // MAX_POINTS))
    xs: list[int] = []
    ys: list[float] = []
    for start in range(0, len(values), size):
        chunk = values[start : start + size]
        xs.append(start)
        ys.append(max(chunk) if how == "max" else sum(chunk) / len(chunk))
    return xs, ys, size


def write_plots(results: Sequence[SimResult], directory: Path, prefix: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    # Target and draft rows per step, one panel per profile, against the B line.
    fig, axes = plt.subplots(
        len(results), 1, figsize=(10, 2.6 * len(results) + 0.6), squeeze=False, sharex=True
    )
    for ax, r in zip(axes[:, 0], results, strict=True):
        xs, target, size = _buckets(r.target_per_step, "max")
        _, draft, _ = _buckets(r.draft_per_step, "max")
        # B under the rows (a policy that fills the buffer draws T on the B line).
        ax.axhline(r.budget, color="red", ls="--", lw=1.0, label=f"B = {r.budget}", zorder=1)
        ax.plot(xs, target, label="target rows T", lw=1.6, color="tab:blue", zorder=3)
        ax.plot(xs, draft, label="draft rows D", lw=1.0, color="tab:orange", zorder=2)
        ax.set_ylim(0, max(r.budget, r.peak_rows) * 1.15)
        ax.set_title(f"{r.profile}: {r.steps} steps, peak max(T, D) = {r.peak_rows}", fontsize=10)
        ax.set_ylabel("rows")
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("step" + (f" (max over buckets of {size} steps)" if size > 1 else ""))
    fig.tight_layout()
    written.append(_save(fig, directory / f"{prefix}rows_per_step.png", plt))

    # Requests scheduled per step, all profiles on one axis.
    fig, ax = plt.subplots(figsize=(10, 4))
    size = 1
    for i, r in enumerate(results):
        xs, ys, size = _buckets(r.requests_per_step, "mean")
        ax.plot(xs, ys, label=r.profile, lw=2.2 - 0.6 * (i % 3), ls=STYLES[i % len(STYLES)])
    ax.set_xlabel("step" + (f" (mean over buckets of {size} steps)" if size > 1 else ""))
    ax.set_ylabel("requests scheduled")
    ax.set_title("requests per step")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, directory / f"{prefix}requests_per_step.png", plt))

    # TTFT distribution (in steps), one step histogram per profile.
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, r in enumerate(results):
        ttft = r.ttft_steps()
        if ttft:
            ax.hist(
                ttft,
                bins=60,
                histtype="step",
                lw=2.2 - 0.6 * (i % 3),
                ls=STYLES[i % len(STYLES)],
                label=r.profile,
            )
    ax.set_xlabel("TTFT (steps from arrival to first output token)")
    ax.set_ylabel("requests")
    ax.set_title("TTFT distribution (identical profiles overlap)")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, directory / f"{prefix}ttft.png", plt))
    return written


def _save(fig: object, path: Path, plt: object) -> Path:
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path


MARKERS = ("o", "s", "^", "D", "v", "P", "X")
"""One marker per profile of a sweep plot: profiles that tie stay visible."""


def write_sweep_plots(
    rows: Sequence[SweepRow],
    cells: Sequence[CellVerdict],
    directory: Path,
    differ_above: float,
) -> list[Path]:
    """One PNG per workload of a sweep (``sweep-WORKLOAD.png``): per cell, each profile's
    milliseconds per output token, the best profile's name above it, and the cells where
    the profiles differ by more than ``differ_above`` shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    workloads = list(dict.fromkeys(v.workload for v in cells))
    profiles = list(dict.fromkeys(r.profile for r in rows))
    for workload in workloads:
        mine = [v for v in cells if v.workload == workload]
        index = {v.cell: i for i, v in enumerate(mine)}
        fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(mine) + 3), 5))
        for i, v in enumerate(mine):
            if v.differs:
                ax.axvspan(i - 0.45, i + 0.45, color="gold", alpha=0.3, lw=0)
        for p, profile in enumerate(profiles):
            points = [
                (index[r.cell], 1000 * r.time_per_output_token)
                for r in rows
                if r.workload == workload and r.profile == profile and r.refused is None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(
                    xs, ys, ls="none", marker=MARKERS[p % len(MARKERS)], ms=8 - p,
                    label=profile, alpha=0.85,
                )  # fmt: skip
        top = max(
            (1000 * r.time_per_output_token for r in rows if r.workload == workload),
            default=1.0,
        )
        for i, v in enumerate(mine):
            if v.best is not None:
                ax.annotate(
                    v.best, (i, top * 1.04), ha="center", va="bottom", fontsize=7, rotation=90
                )
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([cell_label(v.cell) for v in mine], rotation=60, ha="right", fontsize=7)
        ax.set_ylim(0, top * 1.45 if top > 0 else 1.0)
        ax.set_ylabel("ms per output token (calibrated model)")
        ax.set_title(
            f"{workload}: best profile per cell (named above); shaded: profiles differ by"
            f" more than {100 * differ_above:g}%",
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        written.append(_save(fig, directory / f"sweep-{workload}.png", plt))
    return written
