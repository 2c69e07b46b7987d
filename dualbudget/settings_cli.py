"""``dualbudget settings [--json]``: every vLLM setting that can change a scheduling
decision, where each release's vLLM reads it, its default there, and whether the reference
models it, refuses it by name, or replays some of its values (``reference/formats/settings.py``,
the one table)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dualbudget.reference.formats.settings import SETTINGS, replayed_words, setting_json
from dualbudget.spec.releases import RELEASE_VERSIONS


@dataclass(frozen=True, kw_only=True)
class SettingsOptions:
    """One ``dualbudget settings`` run; the command line fills it from its flags."""

    json: bool = False
    """The table as one JSON document on standard output instead of text."""


def settings_command(options: SettingsOptions) -> int:
    if options.json:
        document = {
            "releases": list(RELEASE_VERSIONS),
            "settings": [setting_json(setting) for setting in SETTINGS],
        }
        print(json.dumps(document, indent=2))
        return 0
    for setting in SETTINGS:
        replays = replayed_words(setting).replace("`", "")
        print(f"{setting.name} ({setting.scope}): {setting.status}; replays {replays}")
        for release in RELEASE_VERSIONS:
            home = setting.home_in(release)
            where = "no such setting" if home is None else home
            print(f"  vLLM {release}: {where}, default {json.dumps(setting.default)}")
        print(f"  changes: {setting.changes}")
    return 0
