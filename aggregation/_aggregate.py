"""aggregate(): validate every update, run the configured rule, record what each peer got."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

import structlog
import torch

from . import limits
from ._exceptions import AggregationInputError, NotEnoughUpdatesError
from ._kernels import Stack
from ._rules import RULES
from ._types import AggregationResult, AggregatorConfig, PeerRecord, TensorSpec
from ._validate import check_expected, check_peer_id, check_weights, validate_update

__all__ = ["aggregate"]

log = structlog.get_logger(__name__)


def aggregate(
    updates: Mapping[str, Mapping[str, torch.Tensor]],
    *,
    expected: Mapping[str, TensorSpec],
    config: AggregatorConfig,
    weights: Mapping[str, float] | None = None,
    previous: Mapping[str, torch.Tensor] | None = None,
    by_layer: bool = False,
) -> AggregationResult:
    """Aggregate one round's updates, deterministically.

    Args:
        updates: peer id -> update (tensor name -> tensor). Order does not matter: peers are
            processed sorted by id, so any order of the same set gives bit-identical output.
        expected: name -> TensorSpec every update must match exactly.
        config: the rule and its parameters.
        weights: peer id -> weight (samples processed); used by weighted_mean (required) and
            centered_clip (optional, uniform otherwise). Ignored by the other rules.
        previous: the previous round's aggregate, used by centered_clip with start="previous".
        by_layer: read the updates one layer at a time, holding only that layer of each (see
            :class:`Stack`): with mappings that decode a layer when it is looked up, aggregating
            n updates holds n x one layer, not n whole updates. The same bits either way.

    Returns:
        AggregationResult with the aggregate in the expected dtypes, one PeerRecord per peer
        passed in (rejected ones with their reason) and the parameters used.

    Error handling:
        A peer's invalid update is recorded as rejected, never raised. The caller's own mistakes
        raise AggregationInputError; AggregatorConfigError for the config;
        NotEnoughUpdatesError when no valid update (or too few for the rule) remains.
    """
    if not isinstance(config, AggregatorConfig):
        raise AggregationInputError("config must be an AggregatorConfig")
    specs = check_expected(expected)
    peers, reasons = _validated(updates, specs)
    accepted = [p for p in peers if reasons[p] is None]
    if not accepted:
        raise NotEnoughUpdatesError(f"no valid update among {len(peers)} received")

    if config.name == "weighted_mean" and weights is None:
        raise AggregationInputError("weighted_mean needs weights (samples per peer)")
    use_weights = weights is not None and config.name in ("weighted_mean", "centered_clip")
    w = check_weights(weights, accepted) if use_weights else dict.fromkeys(accepted, 1.0)

    prev = None
    if previous is not None:
        why = validate_update(previous, specs)
        if why is not None:
            raise AggregationInputError(f"previous aggregate is invalid: {why}")
        prev = previous

    stack = Stack([updates[p] for p in accepted], specs, by_layer=by_layer)
    out = RULES[config.name](stack, [w[p] for p in accepted], config.params, prev)
    sq = out.sq_distances if out.sq_distances is not None else stack.sq_distances(out.vector)
    stack.release()
    distances = [math.sqrt(d) for d in sq.tolist()]
    typical = statistics.median(distances)
    records = _records(peers, reasons, accepted, distances, out.clip_weights, w, typical)
    params = {
        "aggregator": config.name,
        **out.params,
        "accepted": len(accepted),
        "rejected": len(peers) - len(accepted),
        "weighted": use_weights,
        "median_distance": typical,
    }
    log.debug(
        "aggregated",
        aggregator=config.name,
        accepted=len(accepted),
        rejected=len(peers) - len(accepted),
        outliers=sum(r.outlier for r in records.values()),
    )
    return AggregationResult(stack.finish(out.vector), records, params)


def _validated(
    updates: Mapping[str, Mapping[str, torch.Tensor]], specs: Mapping[str, TensorSpec]
) -> tuple[list[str], dict[str, str | None]]:
    """The peers sorted by id, and each one's reason for rejection (None: valid). The caller's
    own mistakes (not a mapping, too many, ids not strings) raise AggregationInputError."""
    if not isinstance(updates, Mapping):
        raise AggregationInputError("updates must be a mapping of peer id to update")
    if len(updates) > limits.MAX_UPDATES:
        raise AggregationInputError(
            f"{len(updates)} updates exceed MAX_UPDATES={limits.MAX_UPDATES}"
        )
    if any(not isinstance(p, str) for p in updates):
        raise AggregationInputError("peer ids must be strings")
    peers = sorted(updates)
    reasons: dict[str, str | None] = {}
    for peer in peers:
        reason = check_peer_id(peer) or validate_update(updates[peer], specs)
        reasons[peer] = reason
        if reason is not None:
            log.info("update_rejected", peer=peer, reason=reason)
    return peers, reasons


def _records(
    peers: list[str],
    reasons: Mapping[str, str | None],
    accepted: list[str],
    distances: list[float],
    clip_weights: list[float | None],
    weights: Mapping[str, float],
    typical: float,
) -> dict[str, PeerRecord]:
    """One PeerRecord per peer, sorted by id: a rejected one with its reason, an accepted one
    with its distance, clip weight, weight and score (distance / the median distance)."""
    records: dict[str, PeerRecord] = {}
    for peer in peers:
        if reasons[peer] is not None:
            records[peer] = PeerRecord(peer, None, None, reasons[peer], weight=0.0)
    for i, peer in enumerate(accepted):
        d = distances[i]
        score = d / typical if typical > 0 else (0.0 if d == 0 else math.inf)
        records[peer] = PeerRecord(
            peer,
            d,
            clip_weights[i],
            None,
            weight=weights[peer],
            score=score,
            outlier=score > limits.OUTLIER_SCORE,
        )
    return dict(sorted(records.items()))
