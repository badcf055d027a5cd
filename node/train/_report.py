"""The node's report: one JSON line per event, for people and for ``cnode demo``.

Every figure the demo prints comes from these lines, written by the nodes as things happen.
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ._stop import StopReason

__all__ = ["Ending", "Event", "EventObserver", "Reporter", "read_report"]


class Event(StrEnum):
    """The events of the node's report (its ``event`` field): the one list the nodes write and
    ``cnode demo``, the metrics and the tests read."""

    STARTED = "started"  # the node is set up (device, precision, attack)
    JOINING = "joining"  # a late joiner's wait for its round is over
    LISTENING = "listening"  # its p2p host listens (addrs, advertised)
    METRICS = "metrics"  # its /metrics endpoint's URL
    GATEWAY = "gateway"  # its read-only HTTP gateway's URL
    RESUMED = "resumed"  # restarted from the state of a round it had pinned
    ROUND = "round"  # a round applied: loss, members, state CID, phase times
    ROUND_EXCHANGED_NOTHING = "round_exchanged_nothing"  # a partitioned round it had no part in
    ROUND_GIVEN_UP = "round_given_up"  # a round it could not complete (what was missing)
    BAN_SEEN = "ban_seen"  # bans it learned of (via the state or gossip)
    BAN_REPORTED = "ban_reported"  # ban evidence it sent, and the coordinator's answer
    WAITING_FOR_CHECKPOINT = "waiting_for_checkpoint"  # a joiner waits for a newer checkpoint
    CAUGHT_UP = "caught_up"  # a joiner adopted a checkpoint (bytes per holder, time)
    HUB_UPLOADED = "hub_uploaded"  # a checkpoint uploaded to the Hugging Face Hub
    HUB_UPLOAD_FAILED = "hub_upload_failed"  # an upload that failed (training goes on)
    LEFT = "left"  # it left the run at a signal
    STOPPED = "stopped"  # it stopped: why (``Ending`` or the evidence), its StopReason's value


class Ending(StrEnum):
    """The ``reason`` of a ``stopped`` event when the node ended by itself (any other reason is
    the evidence of its StopReason)."""

    DONE = "done"  # its rounds are done
    LEFT = "left"  # it left the run on SIGTERM/SIGINT


class EventObserver(Protocol):
    """Something that learns from the node's events as they are written (its metrics)."""

    def observe(self, event: Event, fields: dict[str, Any]) -> None: ...


class Reporter:
    """Append JSON lines to a file (or nowhere); each line flushed at once."""

    def __init__(self, path: Path | None, *, peer: str) -> None:
        self.path = path
        self.peer = peer
        # The latest fields of each event, for whoever reports them on (the dashboard).
        self.last: dict[Event, dict[str, Any]] = {}
        self.observers: list[EventObserver] = []  # told of every event (the node's /metrics)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, event: Event, **fields: Any) -> None:
        event = Event(event)  # a name outside the list is refused here, not written
        self.last[event] = fields
        for observer in self.observers:
            observer.observe(event, fields)
        line = _human(event, fields)
        if line is not None:
            print(line, flush=True)  # stdout: one line per round for the person running it
        if self.path is None:
            return
        line = json.dumps({"event": str(event), "t": time.time(), "peer": self.peer, **fields})
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _human(event: Event, f: dict[str, Any]) -> str | None:
    if event is Event.ROUND:
        return (
            f"round {f['round']}: held-out loss {f['loss']:.4f}, {len(f['members'])} members, "
            f"state {f['state_cid']} (train {f['train_s']:.1f} s, publish {f['publish_s']:.1f} s, "
            f"fetch {f['fetch_s']:.1f} s, aggregate {f['aggregate_s']:.1f} s)"
        )
    if event is Event.CAUGHT_UP:
        return (
            f"caught up: checkpoint of round {f['round']} ({f['bytes']:,} bytes from "
            f"{sum(1 for n in f['bytes_per_holder'].values() if n)} holders in "
            f"{f['fetch_seconds']:.2f} s, every block verified)"
        )
    if event is Event.BAN_REPORTED:
        return f"reported {f['accused'][-8:]} for a ban: {f['reason']} (banned: {f['banned']})"
    if event in (Event.LEFT, Event.RESUMED):
        return f"{event} (round {f.get('round')})"
    return None


def read_report(path: Path) -> list[dict[str, Any]]:
    """The events written so far, each ``event`` decoded to an :class:`Event` (a ``stopped``
    event's ``stop_reason`` to a :class:`StopReason`); a partly written last line, or one of an
    event this version does not know, is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
            event["event"] = Event(event["event"])
            if event["event"] is Event.STOPPED and "stop_reason" in event:
                event["stop_reason"] = StopReason(event["stop_reason"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        out.append(event)
    return out
