"""What the coordinator's injected checks return: the verdict of a partition recomputation and
of a reputation replay (specs/coordinator.md#bans).

The checks themselves are the training package's (``check_partition_evidence``,
``check_reputation_evidence``), which the coordinator never imports; they build these types,
which live here, on the client side of the package, so that a training node can build them
without importing the server.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PartitionVerdict", "ReputationVerdict"]


@dataclass(frozen=True)
class PartitionVerdict:
    """What recomputing a partition result from its evidence showed."""

    signer: str  # the aggregator that signed the partition result header
    partition: int  # the partition the header is for
    claimed: str  # the output CID the signed result names ("" when it names none)
    recomputed: str  # the output CID the inputs give ("" when none)
    correct: bool  # claimed == recomputed


@dataclass(frozen=True)
class ReputationVerdict:
    """What the replay of the score records found about a reputation-ban report."""

    decided: bool  # False: the records alone cannot decide (the reason says why)
    correct: bool  # decided, and the report's figures are what the records give
    reason: str  # what did not match, or why undecided; "" when correct
