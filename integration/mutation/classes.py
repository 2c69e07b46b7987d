"""Every mutant of the installed vLLM's scheduler as an importable class path.

The fuzz resolves its live scheduler from an import path in each worker process
(``live.scheduler_class``); a mutant has no module of its own, so this module makes one
on demand: ``dualbudget.integration.mutation.classes:<mutant name>`` is the class of that
mutant (``Site.name``), built from vLLM's source in the process that asks, and
``...classes:control`` the unmutated methods compiled the same way.
"""

from __future__ import annotations

import functools

from .loading import control_class, installed_vllm_source, mutant_class, sites

CONTROL = "control"


def path_of(name: str) -> str:
    """The import path of mutant ``name`` (or of ``CONTROL``)."""
    return f"{__name__}:{name}"


@functools.cache
def _class(name: str) -> type:
    source = installed_vllm_source()
    if name == CONTROL:
        return control_class(source)
    found = {site.name: site for site in sites(source)}
    if name not in found:
        raise AttributeError(f"no mutant {name!r} in {source.path}")
    return mutant_class(source, found[name])


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    return _class(name)
