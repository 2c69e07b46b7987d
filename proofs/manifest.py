"""The manifest: the verdict expected of every obligation, and why for each failure.

``proofs/manifest.toml`` has two tables of proof verdicts. ``[expected]`` maps every
obligation name (``profile/layout/check``) to ``"holds"`` or ``"fails"``; ``[why]`` gives
one line for each expected failure: the finding about the policy. ``dualbudget prove``
fails when a verdict differs from it (a new failure and an unexpected pass alike), when
an obligation has no entry, and when an entry names no obligation.

``[outside_model]`` holds what the proofs cannot say: breaks of a contract item seen on
live vLLM steps (by the reference and the contract monitor alike) that come from
behaviour the spec does not model, keyed ``profile/layout/contract item``, each with why
and which behaviour the proofs leave out. A proof verdict of ``holds`` on the same key
is true of the spec's model and not of vLLM; the fuzz reports such a break as known.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dualbudget.spec.contract import CONTRACT_IDS
from dualbudget.spec.errors import BadInput

from .obligations import catalog

MANIFEST = Path(__file__).with_name("manifest.toml")
VERDICTS = ("holds", "fails")


@dataclass(frozen=True)
class Manifest:
    entries: Mapping[str, str]
    why: Mapping[str, str]
    outside_model: Mapping[str, str]

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
        for key, why in self.outside_model.items():
            parts = key.split("/")
            if len(parts) != 3 or parts[2] not in CONTRACT_IDS or not why.strip():
                found.append(f"[outside_model] {key}: not profile/layout/item with a why")
        return found


def load_manifest(path: Path = MANIFEST) -> Manifest:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise BadInput(f"manifest {str(path)!r}: {err}") from None
    expected = data.get("expected", {})
    why = data.get("why", {})
    return Manifest(dict(expected), dict(why), dict(data.get("outside_model", {})))


def expected_findings() -> frozenset[tuple[str, str, str]]:
    """``(profile, layout, contract item)`` of every failure ``proofs/manifest.toml``
    expects: the known findings, the one list the fuzz and the tests read. The item is
    the obligation's ``contract`` (an obligation of no contract item, such as
    ``compiled``, is no finding about a policy)."""
    manifest = load_manifest()
    return frozenset(
        (ob.profile, ob.layout, ob.contract)
        for ob in catalog()
        if manifest.expected(ob.name) == "fails" and ob.contract in CONTRACT_IDS
    )


def outside_model_findings() -> frozenset[tuple[str, str, str]]:
    """``(profile, layout, contract item)`` of every break seen live outside the spec's
    model (``[outside_model]``): known to the fuzz, never a proof verdict."""
    keys = load_manifest().outside_model
    return frozenset((p, lay, item) for p, lay, item in (k.split("/", 2) for k in keys))
