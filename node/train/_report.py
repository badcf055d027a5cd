"""The node's report: one JSON line per event, for people and for ``cnode demo``.

Every figure the demo prints comes from these lines, written by the nodes as things happen.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["Reporter", "read_report"]


class Reporter:
    """Append JSON lines to a file (or nowhere); each line flushed at once."""

    def __init__(self, path: Path | None, *, peer: str) -> None:
        self.path = path
        self.peer = peer
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "t": time.time(), "peer": self.peer, **fields})
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def read_report(path: Path) -> list[dict[str, Any]]:
    """The events written so far; a partly written last line is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
