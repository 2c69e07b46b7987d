"""What-if sweeps: ``simulate`` over a grid of configs, profiles and workloads, as units.

A sweep is the product of a grid (each key one of vLLM's config names, ``GRID_KEYS``, with
its values), the profiles and the workloads. Each (workload, cell, profile) is one
``SweepUnit``; ``run_unit`` is a pure function of it (the workload preset at the unit's
seed, the cell's values over the preset's config, ``simulate`` under the profile), so a
unit's row is the same whichever process or machine runs it, and a table merged in unit
order (``sweep_units``' order) is the same for any executor and width.

Steps, output tokens and their ratio are exact consequences of the policies; the seconds
come from the calibration's step-time model (``simulate.StepTimeModel``), carried in the
unit so that a worker needs nothing but the unit.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dualbudget.spec.errors import BadInput

from ..formats.scenario import Scenario, validate
from .simulate import StepTimeModel, simulate
from .workload import preset

GRID_KEYS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "num_speculative_tokens",
    "max_num_scheduled_tokens",
    "num_gpu_blocks",
)
"""The keys a grid may vary: vLLM's config names (``num_speculative_tokens`` is the
``speculative_config``'s)."""

GRID_ALIASES = {"B": "max_num_batched_tokens", "K": "num_speculative_tokens"}
"""The contract's short names, accepted for the two it uses."""

Cell = tuple[tuple[str, int], ...]
"""One grid point: ``(key, value)`` pairs in the grid's key order."""


@dataclass(frozen=True)
class Grid:
    """Keys (vLLM's names, in the order given) and each key's values."""

    axes: tuple[tuple[str, tuple[int, ...]], ...]

    def cells(self) -> list[Cell]:
        """Every point, the last key varying fastest; one empty cell for no keys."""
        keys = [key for key, _ in self.axes]
        return [
            tuple(zip(keys, values, strict=True))
            for values in itertools.product(*(values for _, values in self.axes))
        ]

    def to_json(self) -> dict[str, list[int]]:
        return {key: list(values) for key, values in self.axes}


def parse_grid(items: Sequence[str]) -> Grid:
    """``KEY=V1,V2,...`` items into a ``Grid``; an unknown key, a repeated key or a value
    that is no positive integer raises BadInput naming it."""
    axes: list[tuple[str, tuple[int, ...]]] = []
    seen: set[str] = set()
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        key = GRID_ALIASES.get(name, name)
        if not sep or not text.strip():
            raise BadInput(f"--grid: {item!r} is not KEY=V1,V2,...")
        if key not in GRID_KEYS:
            known = ", ".join((*GRID_KEYS, *GRID_ALIASES))
            raise BadInput(f"--grid: unknown key {name!r} (known: {known})")
        if key in seen:
            raise BadInput(f"--grid: key {key!r} given twice")
        seen.add(key)
        values: list[int] = []
        for part in text.split(","):
            try:
                value = int(part)
            except ValueError:
                raise BadInput(f"--grid: {key}: {part.strip()!r} is not an integer") from None
            if value < 1:
                raise BadInput(f"--grid: {key}: {value} must be >= 1")
            if value not in values:
                values.append(value)
        axes.append((key, tuple(values)))
    return Grid(tuple(axes))


@dataclass(frozen=True)
class SweepUnit:
    """One simulation of a sweep: everything its row depends on."""

    workload: str
    """A preset of ``workload.PRESETS``."""
    seed: int
    num_requests: int | None
    """At most this many of the preset's requests; None: all of them."""
    cell: Cell
    profile: str
    model: StepTimeModel
    max_steps: int | None = None


def sweep_units(
    grid: Grid,
    profiles: Sequence[str],
    workloads: Sequence[str],
    *,
    seed: int,
    model: StepTimeModel,
    num_requests: int | None = None,
    max_steps: int | None = None,
) -> list[SweepUnit]:
    """The units in table order: workload, then cell, then profile."""
    return [
        SweepUnit(workload, seed, num_requests, cell, profile, model, max_steps)
        for workload in workloads
        for cell in grid.cells()
        for profile in profiles
    ]


def cell_scenario(workload: str, seed: int, num_requests: int | None, cell: Cell) -> Scenario:
    """The preset's scenario at ``seed`` with the cell's values over its config (the
    profile's admission rules are checked by the caller)."""
    recipe = preset(workload)
    if num_requests is not None:
        recipe = replace(recipe, num_requests=min(recipe.num_requests, num_requests))
    scenario = recipe.scenario(seed)
    values: dict[str, Any] = dict(cell)
    config = scenario.config
    k = values.pop("num_speculative_tokens", None)
    if k is not None:
        if config.speculative_config is None:
            raise BadInput(f"--grid: num_speculative_tokens: workload {workload} drafts nothing")
        spec = replace(config.speculative_config, num_speculative_tokens=k)
        config = replace(config, speculative_config=spec)
    return replace(scenario, config=replace(config, **values))


@dataclass(frozen=True)
class SweepRow:
    """One unit's result: the table's row. ``refused`` holds the reason a profile's
    admission rules (or vLLM's config checks) refuse the cell; its numbers are then 0."""

    workload: str
    cell: Cell
    profile: str
    refused: str | None
    steps: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    """Under the unit's step-time model."""
    violations: tuple[str, ...] = ()
    """The contract items broken on the way (``C3``, ...); ``C4 stall`` for a stall."""

    @property
    def output_tokens_per_step(self) -> float:
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def time_per_output_token(self) -> float:
        """Seconds per output token; 0 where none was produced."""
        return self.seconds / self.output_tokens if self.output_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            **dict(self.cell),
            "profile": self.profile,
            "refused": self.refused,
            "steps": self.steps,
            "output_tokens": self.output_tokens,
            "output_tokens_per_step": self.output_tokens_per_step,
            "seconds": self.seconds,
            "time_per_output_token_s": self.time_per_output_token,
            "violations": list(self.violations),
        }


ROW_COLUMNS = (
    "refused",
    "steps",
    "output_tokens",
    "output_tokens_per_step",
    "seconds",
    "time_per_output_token_s",
    "violations",
)
"""The columns of a row after the workload, the cell's keys and the profile."""


def run_unit(unit: SweepUnit) -> SweepRow:
    """Simulate one unit (pure: the same row for the same unit, anywhere)."""
    try:
        scenario = validate(
            replace(
                cell_scenario(unit.workload, unit.seed, unit.num_requests, unit.cell),
                profile=unit.profile,
            )
        )
    except BadInput as err:
        return SweepRow(unit.workload, unit.cell, unit.profile, refused=str(err))
    result = simulate(scenario, unit.profile, max_steps=unit.max_steps)
    broken = tuple(v["contract"] for v in result.violations)
    if result.stall:
        broken = (*broken, "C4 stall")
    return SweepRow(
        unit.workload,
        unit.cell,
        unit.profile,
        refused=None,
        steps=result.steps,
        output_tokens=result.output_tokens,
        seconds=result.timing(unit.model)["seconds"],
        violations=broken,
    )


@dataclass(frozen=True)
class CellVerdict:
    """Per workload and cell: the profile with the least time per output token, and the
    spread between the best and the worst profile that ran (``worst / best - 1``)."""

    workload: str
    cell: Cell
    best: str | None
    """None where every profile refused the cell or produced no output."""
    spread: float
    differs: bool
    """``spread`` above the sweep's threshold."""

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            **dict(self.cell),
            "best_profile": self.best,
            "spread": self.spread,
            "differs": self.differs,
        }


def verdicts(rows: Sequence[SweepRow], differ_above: float) -> list[CellVerdict]:
    """One verdict per (workload, cell), in the rows' order; ties go to the profile
    listed first, so the verdict does not depend on anything but the rows."""
    groups: dict[tuple[str, Cell], list[SweepRow]] = {}
    for row in rows:
        groups.setdefault((row.workload, row.cell), []).append(row)
    out = []
    for (workload, cell), group in groups.items():
        ran = [r for r in group if r.refused is None and r.output_tokens > 0]
        if not ran:
            out.append(CellVerdict(workload, cell, None, 0.0, False))
            continue
        best = min(ran, key=lambda r: r.time_per_output_token)
        worst = max(r.time_per_output_token for r in ran)
        low = best.time_per_output_token
        spread = worst / low - 1 if low else 0.0
        out.append(CellVerdict(workload, cell, best.profile, spread, spread > differ_above))
    return out


def cell_label(cell: Cell) -> str:
    """``B=512 max_num_seqs=16 K=3``: the contract's short names where it has them."""
    short = {full: alias for alias, full in GRID_ALIASES.items()}
    return " ".join(f"{short.get(key, key)}={value}" for key, value in cell) or "(workload's)"


def table_json(
    grid: Grid,
    rows: Sequence[SweepRow],
    differ_above: float,
    header: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``--json`` document: ``header`` (what was swept and under which calibration),
    the grid, every row in unit order and the verdict per cell. Nothing in it depends on
    the executor or on timings."""
    return {
        **header,
        "grid": grid.to_json(),
        "differ_above": differ_above,
        "rows": [r.to_json() for r in rows],
        "cells": [v.to_json() for v in verdicts(rows, differ_above)],
    }


def csv_rows(grid: Grid, rows: Sequence[SweepRow]) -> list[list[str]]:
    """The CSV table: a header row (workload, the grid's keys, profile, ``ROW_COLUMNS``),
    then one row per unit."""
    keys = [key for key, _ in grid.axes]
    out = [["workload", *keys, "profile", *ROW_COLUMNS]]
    for row in rows:
        data = row.to_json()
        cells = []
        for column in ROW_COLUMNS:
            value = data[column]
            if value is None:
                cells.append("")
            elif isinstance(value, list):
                cells.append(" ".join(value))
            else:
                cells.append(repr(value) if isinstance(value, float) else str(value))
        out.append([row.workload, *(str(v) for _, v in row.cell), row.profile, *cells])
    return out
