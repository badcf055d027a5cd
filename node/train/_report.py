"""The node's report: one JSON line per event, for people and for ``cnode demo``.

Every figure the demo prints comes from these lines, written by the nodes as things happen.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["EventObserver", "Reporter", "read_report"]


class EventObserver(Protocol):
    """Something that learns from the node's events as they are written (its metrics)."""

    def observe(self, event: str, fields: dict[str, Any]) -> None: ...


class Reporter:
    """Append JSON lines to a file (or nowhere); each line flushed at once."""

    def __init__(self, path: Path | None, *, peer: str) -> None:
        self.path = path
        self.peer = peer
        # The latest fields of each event, for whoever reports them on (the dashboard).
        self.last: dict[str, dict[str, Any]] = {}
        self.observers: list[EventObserver] = []  # told of every event (the node's /metrics)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, event: str, **fields: Any) -> None:
        self.last[event] = fields
        for observer in self.observers:
            observer.observe(event, fields)
        line = _human(event, fields)
        if line is not None:
            print(line, flush=True)  # stdout: one line per round for the person running it
        if self.path is None:
            return
        line = json.dumps({"event": event, "t": time.time(), "peer": self.peer, **fields})
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _human(event: str, f: dict[str, Any]) -> str | None:
    if event == "round":
        return (
            f"round {f['round']}: held-out loss {f['loss']:.4f}, {len(f['members'])} members, "
            f"state {f['state_cid']} (train {f['train_s']:.1f} s, publish {f['publish_s']:.1f} s, "
            f"fetch {f['fetch_s']:.1f} s, aggregate {f['aggregate_s']:.1f} s)"
        )
    if event == "caught_up":
        return (
            f"caught up: checkpoint of round {f['round']} ({f['bytes']:,} bytes from "
            f"{sum(1 for n in f['bytes_per_holder'].values() if n)} holders in "
            f"{f['fetch_seconds']:.2f} s, every block verified)"
        )
    if event == "ban_reported":
        return f"reported {f['accused'][-8:]} for a ban: {f['reason']} (banned: {f['banned']})"
    if event in ("left", "resumed"):
        return f"{event} (round {f.get('round')})"
    return None


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
