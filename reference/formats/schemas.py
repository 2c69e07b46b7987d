"""What every file format's schema shares: strict JSON objects, bad input as one line naming
the field, defaults read from the dataclass they fill, and the Markdown table of a schema.

The formats (``scenario.py``'s ``ScenarioJson``, ``trace_schema.py``) are pydantic
models; their fields, defaults and descriptions are the one home of what a
file may hold: the readers validate against them and docs/design.md §4 renders its tables
from them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dualbudget.spec.config import KVGroup


class Schema(BaseModel):
    """A JSON object of a format. Types are strict (``1.0`` is no integer, ``"1"`` no
    number, ``true`` neither) and an unknown key is an error, so that a typo is never a
    silent default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class FieldError(ValueError):
    """A validator's finding about one of the model's own fields: ``field`` is its path below
    the model (``prompt_token_ids``, ``requests[1].id``), which the one-line error names."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def dataclass_default(cls: type[Any], name: str) -> Any:
    """The default of the dataclass ``cls``'s field ``name``: a schema's default is read from
    the dataclass it fills (``EngineConfig``'s defaults are vLLM's), never restated."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{name} has no default")
    return field.default


# -- bad input as one line ---------------------------------------------------------------
_MESSAGES = {
    "missing": "missing",
    "extra_forbidden": "unknown key",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "greater_than_equal": "must be >= {ge}",
    "less_than_equal": "must be <= {le}",
    "too_short": "must hold at least {min_length}, holds {actual_length}",
    "literal_error": "must be {expected}",
    "union_tag_invalid": "must be one of {expected_tags}",
    "union_tag_not_found": "missing",
    "string_pattern_mismatch": "must match {pattern}",
    "json_invalid": "corrupt JSON: {error}",
}
"""Pydantic's error types in the project's words (the value found is appended)."""
_NO_VALUE = frozenset(
    {"missing", "extra_forbidden", "union_tag_not_found", "too_short", "json_invalid"}
)


def first_error(err: ValidationError, prefix: str = "", root: str = "") -> tuple[str, str]:
    """The first error of ``err`` as ``(field path, message)``, one line (pydantic's own
    message spans several). The path is in the file's own terms, ``requests[0].prompt_len``,
    under ``prefix`` (the validated object's own path, if any); ``root`` names the object
    itself when the error is about the whole of it."""
    error = err.errors(include_url=False)[0]
    kind, ctx = error["type"], error.get("ctx", {})
    parts: list[str | int] = [prefix] if prefix else []
    # A dict key's error is located at the key itself, which pydantic marks "[key]".
    parts += [part for part in error["loc"] if part != "[key]"]
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        parts.append(ctx["discriminator"].strip("'"))
    if kind == "value_error" and isinstance(ctx.get("error"), FieldError):
        parts.append(ctx["error"].field)
    path = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" if i else part
        for i, part in enumerate(parts)
    )
    path = path or root
    if kind == "value_error":
        return path, str(ctx["error"])
    template = _MESSAGES.get(kind)
    if template is None:
        return path, f"{error['msg']}, got {_shown(error['input'])}"
    message = template.format(**ctx)
    if kind in _NO_VALUE:
        return path, message
    if kind == "union_tag_invalid":
        return path, f"{message}, got {ctx['tag']!r}"
    return path, f"{message}, got {_shown(error['input'])}"


def _shown(value: object) -> str:
    """A value as an error quotes it: a container by its JSON type, anything else itself."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


# -- the documentation -------------------------------------------------------------------
def schema_table(model: type[BaseModel], skip: tuple[str, ...] = ()) -> str:
    """``model``'s fields as a Markdown table: key, required or its default, description."""
    lines = ["| key | | what it holds |", "|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        default = info.default
        if info.is_required():
            presence = "required"
        elif default is None:
            presence = "optional"
        elif info.default_factory is not None:
            presence = f"default `{json.dumps(info.default_factory())}`"  # type: ignore[call-arg]
        else:
            shown = (
                default.model_dump(exclude_none=True) if isinstance(default, BaseModel) else default
            )
            presence = f"default `{json.dumps(shown)}`"
        text = " ".join((info.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {presence} | {text} |")
    return "\n".join(lines) + "\n"


def schema_heading(model: type[BaseModel]) -> str:
    """The first paragraph of ``model``'s docstring, on one line, RST literals as Markdown."""
    doc = model.__doc__ or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`")


def schemas_markdown(models: Sequence[type[BaseModel]]) -> str:
    """Each model's heading (its docstring's first paragraph), then its table."""
    return "\n".join(f"{schema_heading(model)}\n\n{schema_table(model)}" for model in models)


_group = partial(dataclass_default, KVGroup)


# -- shared models -----------------------------------------------------------------------
class KVGroupJson(Schema):
    """``config.kv_groups[i]``: one of vLLM's KV cache groups (``spec/config.py``
    ``KVGroup``), its spec's fields in vLLM's names; every group draws on the one pool."""

    kind: str = Field(
        description="vLLM's `KVCacheSpecKind`: `full_attention`, `mla_attention`,"
        " `sliding_window`, `sliding_window_mla`, `chunked_local_attention` or `mamba`"
    )
    block_size: int = Field(description="tokens per block of this group")
    sliding_window: int | None = Field(
        default=_group("sliding_window"), description="the window, for sliding-window kinds"
    )
    attention_chunk_size: int | None = Field(
        default=_group("attention_chunk_size"),
        description="the chunk, for `chunked_local_attention`",
    )
    mamba_cache_mode: str = Field(
        default=_group("mamba_cache_mode"),
        description="for `mamba`: `none` or `align`, the modes of vLLM's `MambaCacheMode`"
        " in 0.32 and 0.33 (neither has an `all`)",
    )
    is_eagle_group: bool = Field(
        default=_group("is_eagle_group"),
        description="the group holds the drafter's layers (EAGLE's last-block drop)",
    )
    is_draft: bool = Field(
        default=_group("is_draft"), description="the drafter's own spec (DFlash, DSpark)"
    )
    spec_variant: int = Field(
        default=_group("spec_variant"),
        description="which spec of its kind and fields: groups whose vLLM specs differ only"
        " in fields that decide no blocks (a head size) are looked up apart",
    )

    def kv_group(self) -> KVGroup:
        return KVGroup(**dict(self))
