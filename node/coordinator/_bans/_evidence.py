"""Evidence against a wrong partition result: what the coordinator's recomputation must show.

The recomputation is the server's ``ServeSettings.evidence_checker`` (``cnode coordinator
serve`` gives ``cnode.node.train.check_partition_evidence``, which pulls torch; the coordinator
package never imports the training package), run by the HTTP layer (``_http/_evidence.py``) in a
worker thread. This module judges its verdict against the recorded result. See
specs/coordinator.md#evidence-of-a-wrong-result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._store._rows import ResultRow
from ._verdicts import PartitionVerdict

__all__ = ["EvidenceChecker", "judge_partition_verdict"]


class EvidenceChecker(Protocol):
    """Recompute a partition result from a CAR of evidence blocks; raise :class:`BadEvidence`
    when the evidence is malformed (``cnode.node.train.check_partition_evidence``, translated)."""

    def __call__(
        self,
        car: bytes,
        header: str,
        *,
        run: str,
        round_: int,
        partition: int,
        training: Mapping[str, Any],
    ) -> PartitionVerdict: ...


def judge_partition_verdict(
    verdict: PartitionVerdict, recorded: ResultRow, n: int, partition: int
) -> None:
    """Refuse evidence whose recomputation does not show the recorded result wrong: a header of
    another partition, or signed by another peer than the recorded one (409 bad_evidence), or a
    result the recomputation confirms (409 result_correct)."""
    if verdict.partition != partition:
        raise RequestRefused(
            E.BAD_EVIDENCE,
            f"the header is for partition {verdict.partition}, not {partition}",
        )
    if verdict.signer != recorded.peer:
        raise RequestRefused(
            E.BAD_EVIDENCE,
            f"the header is signed by {verdict.signer}; the result was recorded from "
            f"{recorded.peer}",
        )
    if verdict.correct:
        raise RequestRefused(
            E.RESULT_CORRECT,
            f"the recomputation of partition {partition} of round {n} gives {verdict.recomputed},"
            f" as the header says: the result is correct (no ban, nothing recorded)",
        )
