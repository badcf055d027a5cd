"""cnode.node.train: the training loop of a run.

A tiny GPT-2-style model built from the run's config, the shipped corpus with its locally trained
byte-level BPE tokenizer, one shard per peer, local steps whose parameter delta is the update,
deterministic aggregation into a state every honest node agrees on (by its state CID),
checkpoints with their aggregation record, and replay. Spec: specs/training.md.
"""

from ._config import DataConfig as DataConfig
from ._config import ModelConfig as ModelConfig
from ._config import TrainingConfig as TrainingConfig
from ._exceptions import BannedError as BannedError
from ._exceptions import CatchUpError as CatchUpError
from ._exceptions import DeviceError as DeviceError
from ._exceptions import MalformedUpdateError as MalformedUpdateError
from ._exceptions import MissingUpdatesError as MissingUpdatesError
from ._exceptions import PartitionEvidenceError as PartitionEvidenceError
from ._exceptions import PeerUpdateError as PeerUpdateError
from ._exceptions import ReplayMismatchError as ReplayMismatchError
from ._exceptions import RoundStalledError as RoundStalledError
from ._exceptions import StateMismatchError as StateMismatchError
from ._exceptions import TrainingConfigError as TrainingConfigError
from ._exceptions import TrainingError as TrainingError
from ._exceptions import UnreachableError as UnreachableError
from ._loop import NODE_ATTACKS as NODE_ATTACKS
from ._loop import TrainSettings as TrainSettings
from ._loop import run_node as run_node
from ._round import UPDATE_HEADER_TYPE as UPDATE_HEADER_TYPE
from ._round import UpdateHeader as UpdateHeader
from ._round import aggregate_round as aggregate_round
from ._round import encode_update as encode_update
from ._round import header_cid as header_cid
from ._round import load_update as load_update
from ._round import open_update_header as open_update_header
from ._round import seal_update_header as seal_update_header
from ._round import store_update as store_update
from ._segmented import SegmentedUpdate as SegmentedUpdate
from ._stop import NodeStopped as NodeStopped
from ._stop import StopReason as StopReason
from ._stop import stop_reason_of as stop_reason_of
from ._trainer import NodeTrainer as NodeTrainer
from .checkpoint import ReplayInputs as ReplayInputs
from .checkpoint import ReplayReport as ReplayReport
from .checkpoint import SignedUpdates as SignedUpdates
from .checkpoint import check_signed_updates as check_signed_updates
from .checkpoint import fetch_replay_inputs as fetch_replay_inputs
from .checkpoint import replay_checkpoint as replay_checkpoint
from .checkpoint import store_checkpoint as store_checkpoint
from .demo import DemoSettings as DemoSettings
from .demo import run_demo as run_demo
from .exchange import fetch_update_segments as fetch_update_segments
from .model import DATA_ATTACKS as DATA_ATTACKS
from .model import LocalResult as LocalResult
from .model import MemoryNeed as MemoryNeed
from .model import TextData as TextData
from .model import build_model as build_model
from .model import check_model_fits as check_model_fits
from .model import evaluate as evaluate
from .model import load_state as load_state
from .model import memory_need as memory_need
from .model import model_state as model_state
from .model import state_cid as state_cid
from .model import state_cid_from_layers as state_cid_from_layers
from .model import train_local as train_local
from .partition import PARTITION_RESULT_TYPE as PARTITION_RESULT_TYPE
from .partition import PartitionResult as PartitionResult
from .partition import build_partition_evidence as build_partition_evidence
from .partition import check_partition_evidence as check_partition_evidence
from .partition import input_segments as input_segments
from .partition import model_numel as model_numel
from .partition import open_partition_result as open_partition_result
from .partition import partition_result_cid as partition_result_cid
from .partition import recompute_partition as recompute_partition
from .partition import seal_partition_result as seal_partition_result
from .partition import state_numel as state_numel
from .scores import SCORE_RECORD_TYPE as SCORE_RECORD_TYPE
from .scores import RoundScoring as RoundScoring
from .scores import ScoreRecord as ScoreRecord
from .scores import check_reputation_evidence as check_reputation_evidence
from .scores import open_score_record as open_score_record
from .scores import score_record_cid as score_record_cid
from .scores import seal_score_record as seal_score_record
from .swarm import HeaderCollector as HeaderCollector
from .swarm import updates_topic as updates_topic

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/node/train/test_exports.py)
    "BannedError",
    "CatchUpError",
    "DATA_ATTACKS",
    "DataConfig",
    "DemoSettings",
    "DeviceError",
    "HeaderCollector",
    "LocalResult",
    "MalformedUpdateError",
    "MemoryNeed",
    "MissingUpdatesError",
    "ModelConfig",
    "NODE_ATTACKS",
    "NodeStopped",
    "NodeTrainer",
    "PARTITION_RESULT_TYPE",
    "PartitionEvidenceError",
    "PartitionResult",
    "PeerUpdateError",
    "ReplayInputs",
    "ReplayMismatchError",
    "ReplayReport",
    "RoundScoring",
    "RoundStalledError",
    "SCORE_RECORD_TYPE",
    "ScoreRecord",
    "SegmentedUpdate",
    "SignedUpdates",
    "StateMismatchError",
    "StopReason",
    "TextData",
    "TrainSettings",
    "TrainingConfig",
    "TrainingConfigError",
    "TrainingError",
    "UPDATE_HEADER_TYPE",
    "UnreachableError",
    "UpdateHeader",
    "aggregate_round",
    "build_model",
    "build_partition_evidence",
    "check_model_fits",
    "check_partition_evidence",
    "check_reputation_evidence",
    "check_signed_updates",
    "encode_update",
    "evaluate",
    "fetch_replay_inputs",
    "fetch_update_segments",
    "header_cid",
    "input_segments",
    "load_state",
    "load_update",
    "memory_need",
    "model_numel",
    "model_state",
    "open_partition_result",
    "open_score_record",
    "open_update_header",
    "partition_result_cid",
    "recompute_partition",
    "replay_checkpoint",
    "run_demo",
    "run_node",
    "score_record_cid",
    "seal_partition_result",
    "seal_score_record",
    "seal_update_header",
    "state_cid",
    "state_cid_from_layers",
    "state_numel",
    "stop_reason_of",
    "store_checkpoint",
    "store_update",
    "train_local",
    "updates_topic",
]
