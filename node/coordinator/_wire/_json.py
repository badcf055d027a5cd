"""JSON read from the network, with its nesting bounded before the parser sees it.

Python's ``json`` parser recurses once per level: 100,000 ``[`` raise ``RecursionError``, which is
no ``ValueError`` and escapes every handler. Both sides read JSON through :func:`loads_bounded`:
the server (request bodies, ban-evidence figures) and the client (the coordinator's answers).
The bound is ``limits.MAX_JSON_DEPTH``.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from .. import limits

__all__ = ["JSONTooDeep", "json_depth", "loads_bounded"]

# A JSON string (escapes included); its brackets are text, not nesting. The closing quote is
# optional: an unterminated string runs to the end, so a failed match never restarts at the next
# quote (which made a quote followed by 30,000 escaped quotes take seconds: quadratic), and the
# scan stays linear.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONTooDeep(ValueError):
    """Raised by :func:`loads_bounded` when the text nests deeper than MAX_JSON_DEPTH."""


def json_depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` outside strings (0 for a scalar). Linear time,
    no recursion; for malformed text, an upper bound of what a parser would reach."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate((_STEP[c] for c in brackets), initial=0))


def loads_bounded(data: bytes | str, *, depth: int = limits.MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of ``data``, refusing more than ``depth`` levels of nesting first.

    Raises :class:`JSONTooDeep` (a ``ValueError``) past the bound, ``ValueError`` for text that
    is not JSON or not UTF-8; never ``RecursionError``.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    found = json_depth(text)
    if found > depth:
        raise JSONTooDeep(f"JSON nested {found} deep, over MAX_JSON_DEPTH ({depth})")
    return json.loads(text)
