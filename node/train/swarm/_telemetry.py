"""What a node tells the coordinator's dashboard: held-out loss per round and its catch-up.

Sent as signed ``report`` requests (specs/coordinator.md#reports), best effort: a refused or slow
report is logged and dropped, never fails a round. The figures are the same ones the node writes
to its own report file (_report.py), so the dashboard and ``cnode demo``'s report agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import structlog
import trio

from cnode.node.coordinator import CatchUpSource, CoordinatorClient, CoordinatorError, ReportKind
from cnode.node.coordinator import limits as coordinator_limits

from .. import limits

__all__ = ["catch_up_report", "round_report", "send_report"]

log = structlog.get_logger(__name__)


def round_report(round_: int, loss: float, state: str, holds: str | None) -> dict[str, Any] | None:
    """The report after a round: None when the loss is not finite (CBOR carries no NaN)."""
    if not math.isfinite(loss):
        return None
    report: dict[str, Any] = {"kind": str(ReportKind.ROUND), "round": round_, "loss": float(loss)}
    report["state"] = state
    if holds is not None:
        report["holds"] = holds
    return report


def catch_up_report(caught: Mapping[str, Any]) -> dict[str, Any]:
    """The report of a ``caught_up`` event (its fields, as _catch_up.py writes them)."""
    per_holder = {str(k): int(v) for k, v in dict(caught.get("bytes_per_holder", {})).items()}
    # Bounded like every request: the holders that served the most bytes.
    top = sorted(per_holder.items(), key=lambda kv: -kv[1])[: coordinator_limits.MAX_REPORT_HOLDERS]
    return {
        "kind": str(ReportKind.CATCH_UP),
        "round": int(caught["round"]),
        "manifest": str(caught["manifest"]),
        "seconds": float(caught["seconds"]),
        "bytes": int(caught.get("bytes", 0)),
        "source": str(
            CatchUpSource.HUB if caught.get("source") == CatchUpSource.HUB else CatchUpSource.PEERS
        ),
        "bytes_per_holder": dict(top),
    }


async def send_report(client: CoordinatorClient, report: Mapping[str, Any] | None) -> None:
    if report is None:
        return
    with trio.move_on_after(limits.REPORT_WAIT_S):
        try:
            await client.report(report)
        except CoordinatorError as exc:
            log.info("report_refused", kind=report.get("kind"), error=str(exc))
        return
    log.info("report_timed_out", kind=report.get("kind"))
