"""Loading pydantic-validated YAML files with one-line errors that name the offending field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def derived(model: BaseModel, name: str, inputs: tuple[Any, ...], compute: Callable[[], T]) -> T:
    """`compute()`, once per model instance and inputs (the fields it is derived from).

    Kept in the instance's __dict__ beside the fields, as functools.cached_property keeps its value: pydantic
    neither dumps, compares nor hashes it. Computed again when any input is not the very object it was computed
    from: `model_copy(update=...)` copies the __dict__, so a copy with a changed input would otherwise hand back
    the original's value. An unchanged copy (or a deep copy, whose inputs and value are copied together) keeps it.
    """
    held = model.__dict__.get(name)
    if held is not None and len(held[0]) == len(inputs) and all(a is b for a, b in zip(held[0], inputs, strict=True)):
        return held[1]  # type: ignore[no-any-return]
    value = compute()
    model.__dict__[name] = (inputs, value)  # a frozen model's fields stay frozen; this is not one
    return value


def first_error(exc: ValidationError, *, skip_loc: int = 0) -> str:
    """'where: what' for the first error, on one line (pydantic's 'Value error, ' prefix dropped)."""
    err = exc.errors()[0]
    where = ".".join(_printable(str(p)) for p in err["loc"][skip_loc:])
    message = err["msg"].removeprefix("Value error, ").replace("\n", " ")
    return f"{where}: {message}" if where else message


def _printable(key: str) -> str:
    """A key as it can be read on one line: odd keys (empty, control characters, dots) quoted and escaped."""
    if key and key.isprintable() and "." not in key and " " not in key:
        return key
    return repr(key)


def read_text(path: Path, what: str, error: type[ValueError]) -> str:
    """A YAML file's text, or one line naming it: missing, a directory, unreadable, not UTF-8."""
    if path.is_dir():
        raise error(f"{what} {path} is a directory, expected a YAML file")
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path}: not UTF-8 text (byte {exc.start}), expected YAML") from None
    except OSError as exc:
        raise error(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None


def load_yaml_model(
    text: str, model: type[M], *, origin: str, error: type[ValueError], context: dict[str, Any] | None = None
) -> M:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML ({exc})".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise error(f"{origin}: expected a mapping at the top level")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(f"{origin}: {first_error(exc)}") from None
