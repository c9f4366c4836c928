"""Loading pydantic-validated YAML files with one-line errors that name the offending field."""

from __future__ import annotations

from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


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


def load_yaml_model(text: str, model: type[M], *, origin: str, error: type[ValueError]) -> M:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML ({exc})".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise error(f"{origin}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{origin}: {first_error(exc)}") from None
