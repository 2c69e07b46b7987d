"""The manifest: the verdict expected of every obligation, and why for each failure.

``proofs/manifest.toml`` has two tables of proof verdicts. ``[expected]`` maps every
obligation name (``profile/layout/check``) to ``"holds"`` or ``"fails"``; ``[why]`` gives
one line for each expected failure: the finding about the policy. ``dualbudget prove``
fails when a verdict differs from it (a new failure and an unexpected pass alike), when
an obligation has no entry, and when an entry names no obligation.

``[outside_model]`` holds what the proofs cannot say: breaks of a contract item seen on
live vLLM steps (by the reference and the contract monitor alike) that come from
behaviour the spec does not model. Each row is named by its cause and gives where it
breaks (``profile/layout/contract item`` keys; ``*`` for a profile or a layout when the
behaviour is vLLM's under every profile or every method), the condition on the config
under which it does (``when``, ``proofs.causes``) and why, naming the behaviour the proofs
leave out.
A proof verdict of ``holds`` on the same key is true of the spec's model and not of
vLLM; the fuzz reports such a break as known.

``[when]`` narrows an expected failure to the configs its cause needs (the obligation's
name, a condition): a live break on that key under a config that meets no known
finding's condition is new (``causes``).
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.spec.contract import CONTRACT_IDS
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import PROFILES

from .causes import Cause, Condition, parse_condition
from .obligations import catalog

MANIFEST = Path(__file__).with_name("manifest.toml")
VERDICTS = ("holds", "fails")


@dataclass(frozen=True)
class Manifest:
    entries: Mapping[str, str]
    why: Mapping[str, str]
    outside_model: Mapping[str, Mapping[str, Any]]
    """Per cause's name, its row: ``where`` (keys), ``when`` (a condition) and ``why``."""
    when: Mapping[str, str] = field(default_factory=dict)
    """Per expected failure's name, the condition its cause needs of a config."""

    def expected(self, name: str) -> str:
        return self.entries.get(name, "missing")

    def problems(self, names: Iterable[str]) -> list[str]:
        """What is wrong with the manifest itself, against the full catalog's names."""
        names = list(names)
        found = []
        for name in names:
            if name not in self.entries:
                found.append(f"{name}: no manifest entry")
        known = set(names)
        for name, verdict in self.entries.items():
            if name not in known:
                found.append(f"{name}: manifest entry names no obligation")
            if verdict not in VERDICTS:
                found.append(f"{name}: expected verdict {verdict!r} is not holds/fails")
            if verdict == "fails" and not self.why.get(name, "").strip():
                found.append(f"{name}: expected failure without a why")
        for name in self.why:
            if self.entries.get(name) != "fails":
                found.append(f"{name}: a why for an obligation not expected to fail")
        for name, row in self.outside_model.items():
            where, why = row.get("where"), row.get("why")
            if (
                not isinstance(where, list)
                or not where
                or not all(_is_key(key) for key in where)
                or not isinstance(why, str)
                or not why.strip()
            ):
                found.append(
                    f"[outside_model] {name}: not where = [profile/layout/item, ...] with a why"
                )
            found += _condition_problems(f"[outside_model] {name}", row.get("when"))
        for name, condition in self.when.items():
            if self.entries.get(name) != "fails":
                found.append(f"[when] {name}: a condition for an obligation not expected to fail")
            found += _condition_problems(f"[when] {name}", condition)
        return found

    def causes(self) -> tuple[Cause, ...]:
        """Every known finding with its cause: each expected failure of a step check (the
        obligation named by its contract item alone: C3, C4, C5), narrowed by its
        ``[when]``, then each ``[outside_model]`` row on each of its keys."""
        found = [
            Cause(ob.name, (ob.profile, ob.layout, ob.contract), _when(self.when.get(ob.name)))
            for ob in catalog()
            if ob.check == ob.contract and self.expected(ob.name) == "fails"
        ]
        for name, row in self.outside_model.items():
            when = _when(row.get("when"))
            found += [Cause(f"outside_model.{name}", key, when) for key in _expanded(row["where"])]
        return tuple(found)


def _is_key(key: object) -> bool:
    if not isinstance(key, str) or len(key.split("/")) != 3:
        return False
    profile, layout, item = key.split("/")
    return (
        item in CONTRACT_IDS
        and (profile == "*" or profile in PROFILES)
        and (layout == "*" or layout in LAYOUT_NAMES)
    )


def _expanded(where: Iterable[str]) -> list[tuple[str, str, str]]:
    """The keys of an ``[outside_model]`` row, a ``*`` standing for every profile or
    every layout."""
    found = []
    for key in where:
        profile, layout, item = _split(key)
        profiles = tuple(PROFILES) if profile == "*" else (profile,)
        layouts = LAYOUT_NAMES if layout == "*" else (layout,)
        found += [(each, one, item) for each in profiles for one in layouts]
    return found


def _split(key: str) -> tuple[str, str, str]:
    profile, layout, item = key.split("/")
    return profile, layout, item


def _when(condition: object) -> Condition | None:
    return None if condition is None else parse_condition(str(condition))


def _condition_problems(where: str, condition: object) -> list[str]:
    if condition is None:
        return []
    if not isinstance(condition, str):
        return [f"{where}: when is not a string"]
    try:
        parse_condition(condition)
    except BadInput as err:
        return [f"{where}: {err}"]
    return []


def load_manifest(path: Path = MANIFEST) -> Manifest:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise BadInput(f"manifest {str(path)!r}: {err}") from None
    expected = data.get("expected", {})
    why = data.get("why", {})
    return Manifest(
        dict(expected), dict(why), dict(data.get("outside_model", {})), dict(data.get("when", {}))
    )


def expected_findings() -> frozenset[tuple[str, str, str]]:
    """``(profile, layout, contract item)`` of every failure ``proofs/manifest.toml``
    expects: the known findings, the one list the fuzz and the tests read. The item is
    the obligation's ``contract``."""
    manifest = load_manifest()
    return frozenset(
        (ob.profile, ob.layout, ob.contract)
        for ob in catalog()
        if manifest.expected(ob.name) == "fails" and ob.contract in CONTRACT_IDS
    )


def outside_model_findings() -> frozenset[tuple[str, str, str]]:
    """``(profile, layout, contract item)`` of every break seen live outside the spec's
    model (``[outside_model]``): known to the fuzz, never a proof verdict."""
    rows = load_manifest().outside_model.values()
    return frozenset(key for row in rows for key in _expanded(row["where"]))


@functools.cache
def causes() -> tuple[Cause, ...]:
    """The known findings with their causes (``Manifest.causes``), read once."""
    return load_manifest().causes()
