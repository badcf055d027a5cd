"""cnode.aggregation: deterministic, Byzantine-robust aggregation of peers' updates.

Pure functions on torch tensors, no I/O. ``aggregate()`` validates every update, runs the
configured rule (CenteredClip by default) and returns the aggregate with a per-peer record;
``BanPolicy`` turns records into ban recommendations; ``ATTACKS`` is the attack harness used by
``bench/robustness.py`` and ``cnode train --attack``. Spec: specs/aggregation.md.
"""

from ._aggregate import aggregate as aggregate
from ._attacks import ATTACKS as ATTACKS
from ._attacks import ATTACKS_DATA_LEVEL as ATTACKS_DATA_LEVEL
from ._attacks import Attack as Attack
from ._attacks import alie_z as alie_z
from ._attacks import flip_labels as flip_labels
from ._attacks import new_attack as new_attack
from ._ban import BanPolicy as BanPolicy
from ._ban import BanRecommendation as BanRecommendation
from ._ban import EvidenceKind as EvidenceKind
from ._codec import CODECS as CODECS
from ._codec import decode_update_tensor as decode_update_tensor
from ._codec import encode_update_tensor as encode_update_tensor
from ._codec import encoded_nbytes as encoded_nbytes
from ._codec import result_codec as result_codec
from ._codec import wire_codec as wire_codec
from ._decision import Admission as Admission
from ._decision import RoundDecision as RoundDecision
from ._decision import RoundEvidence as RoundEvidence
from ._decision import admission as admission
from ._decision import decide_round as decide_round
from ._decision import partition_quorum as partition_quorum
from ._exceptions import AggregationError as AggregationError
from ._exceptions import AggregationInputError as AggregationInputError
from ._exceptions import AggregatorConfigError as AggregatorConfigError
from ._exceptions import NotEnoughUpdatesError as NotEnoughUpdatesError
from ._exceptions import UpdateEncodingError as UpdateEncodingError
from ._kernels import tree_sum as tree_sum
from ._momentum import worker_momentum as worker_momentum
from ._partition import PARTITION_TENSOR as PARTITION_TENSOR
from ._partition import aggregate_partition as aggregate_partition
from ._partition import assign_partitions as assign_partitions
from ._partition import backup_aggregators as backup_aggregators
from ._partition import combine_records as combine_records
from ._partition import flat_segments as flat_segments
from ._partition import partition_count as partition_count
from ._partition import partition_segments as partition_segments
from ._partition import segment_ranges as segment_ranges
from ._partition import unflatten_segments as unflatten_segments
from ._partition import verification_choice as verification_choice
from ._scores import ReputationPolicy as ReputationPolicy
from ._scores import Standing as Standing
from ._scores import UpdateScore as UpdateScore
from ._scores import admit as admit
from ._scores import ban_bound as ban_bound
from ._scores import draw_indices as draw_indices
from ._scores import left_out_reason as left_out_reason
from ._scores import loss_in_range as loss_in_range
from ._scores import loss_score as loss_score
from ._scores import median_spread as median_spread
from ._scores import own_floor as own_floor
from ._scores import record_loss as record_loss
from ._scores import round_standing as round_standing
from ._scores import score_assignment as score_assignment
from ._scores import score_seed as score_seed
from ._scores import score_update as score_update
from ._scores import scored_config as scored_config
from ._scores import update_reputation as update_reputation
from ._types import AGGREGATORS as AGGREGATORS
from ._types import AggregationResult as AggregationResult
from ._types import AggregatorConfig as AggregatorConfig
from ._types import PeerRecord as PeerRecord
from ._types import TensorSpec as TensorSpec
from ._validate import validate_update as validate_update

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/aggregation/test_exports.py)
    "AGGREGATORS",
    "ATTACKS",
    "ATTACKS_DATA_LEVEL",
    "Admission",
    "AggregationError",
    "AggregationInputError",
    "AggregationResult",
    "AggregatorConfig",
    "AggregatorConfigError",
    "Attack",
    "BanPolicy",
    "BanRecommendation",
    "CODECS",
    "EvidenceKind",
    "NotEnoughUpdatesError",
    "PARTITION_TENSOR",
    "PeerRecord",
    "ReputationPolicy",
    "RoundDecision",
    "RoundEvidence",
    "Standing",
    "TensorSpec",
    "UpdateEncodingError",
    "UpdateScore",
    "admission",
    "admit",
    "aggregate",
    "aggregate_partition",
    "alie_z",
    "assign_partitions",
    "backup_aggregators",
    "ban_bound",
    "combine_records",
    "decide_round",
    "decode_update_tensor",
    "draw_indices",
    "encode_update_tensor",
    "encoded_nbytes",
    "flat_segments",
    "flip_labels",
    "left_out_reason",
    "loss_in_range",
    "loss_score",
    "median_spread",
    "new_attack",
    "own_floor",
    "partition_count",
    "partition_quorum",
    "partition_segments",
    "record_loss",
    "result_codec",
    "round_standing",
    "score_assignment",
    "score_seed",
    "score_update",
    "scored_config",
    "segment_ranges",
    "tree_sum",
    "unflatten_segments",
    "update_reputation",
    "validate_update",
    "verification_choice",
    "wire_codec",
    "worker_momentum",
]
