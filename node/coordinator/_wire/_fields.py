"""Reading the fields of a signed payload: each missing or mistyped field is a BadRunState
naming it. Shared by the wire messages of ``_protocol.py`` and ``_ban_records.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import BadRunState

__all__ = ["optional", "required", "strings"]


def required(payload: Mapping[str, Any], key: str, typ: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is int):
        raise BadRunState(f"signed state field {key!r} is missing or has the wrong type")
    return value


def optional(payload: Mapping[str, Any], key: str, typ: type) -> Any:
    value = payload.get(key)
    return None if value is None else required(payload, key, typ)


def strings(payload: Mapping[str, Any], key: str) -> list[str]:
    value = required(payload, key, list)
    if not all(isinstance(v, str) for v in value):
        raise BadRunState(f"signed state field {key!r} must be a list of strings")
    return list(value)
