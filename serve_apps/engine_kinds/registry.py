"""The table of engine kinds by name, and the campaign's `engine:` union built from it."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from serve_apps.engine_kinds.base import EngineConfigBase, EngineKind

_KINDS: dict[str, EngineKind] = {}
# Models with an `engine:` field typed by the union: rebuilt when a kind registers after they were defined.
_BOUND: list[type[BaseModel]] = []


def register(kind: EngineKind) -> EngineKind:
    if kind.name in _KINDS:
        raise ValueError(f"engine kind {kind.name} is already registered")
    _KINDS[kind.name] = kind
    _rebind()
    return kind


def unregister(name: str) -> None:
    del _KINDS[name]
    _rebind()


def kinds() -> dict[str, EngineKind]:
    return dict(_KINDS)


def kind_of(config: EngineConfigBase) -> EngineKind:
    return _KINDS[config.kind]


def config_union() -> Any:
    """The discriminated union of every registered kind's config (a validation error names the known kinds)."""
    members = tuple(kind.config for kind in _KINDS.values())
    return Annotated[Union[members], Field(discriminator="kind")]  # noqa: UP007 (a tuple of types, built here)


def bind_engine_field(model: type[BaseModel]) -> None:
    _BOUND.append(model)


def _rebind() -> None:
    if not _BOUND:
        return
    union = config_union()
    for model in _BOUND:
        model.model_fields["engine"] = FieldInfo.from_annotation(union)
        model.model_rebuild(force=True)
