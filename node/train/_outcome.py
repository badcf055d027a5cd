"""What one round gives a node: its own update, and what the round did to its state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cnode.aggregation import BanRecommendation
from cnode.storage import CID

from ._round import RoundResult, UpdateHeader
from .model import LocalResult

__all__ = ["OwnUpdate", "RoundOutcome", "finite_params"]


@dataclass(frozen=True)
class OwnUpdate:
    """This node's contribution to a round."""

    round: int
    header: UpdateHeader
    envelope: bytes  # the signed header as published
    header_cid: CID
    local: LocalResult
    seconds_store: float


@dataclass(frozen=True)
class RoundOutcome:
    """What a round did to this node's state."""

    round: int
    result: RoundResult
    members: tuple[str, ...]  # peers whose update was aggregated
    dropped: dict[str, str]  # peer -> why its update was not used (missing, bad header, ...)
    bans: list[BanRecommendation]
    seconds: float
    # Nothing could be exchanged: no partition had a result, every one kept its parent. The
    # state is the parent's; the round is no progress and is not checkpointed.
    empty: bool = False


def finite_params(params: Mapping[str, Any]) -> dict[str, Any]:
    # DAG-CBOR has no NaN/Infinity: keep such derived figures as text.
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = repr(value)
        else:
            out[key] = value
    return out
