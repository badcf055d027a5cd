"""cnode.node.train: the training loop of a run.

A tiny GPT-2-style model built from the run's config, the shipped corpus with its locally trained
byte-level BPE tokenizer, one shard per peer, local steps whose parameter delta is the update,
deterministic aggregation into a state every honest node agrees on (by its state CID),
checkpoints with their aggregation record, and replay. Spec: specs/training.md.
"""

from ._checkpoint import ReplayReport as ReplayReport
from ._checkpoint import SignedUpdates as SignedUpdates
from ._checkpoint import check_signed_updates as check_signed_updates
from ._checkpoint import replay_checkpoint as replay_checkpoint
from ._checkpoint import store_checkpoint as store_checkpoint
from ._config import DataConfig as DataConfig
from ._config import ModelConfig as ModelConfig
from ._config import TrainingConfig as TrainingConfig
from ._corrupt import DATA_ATTACKS as DATA_ATTACKS
from ._data import TextData as TextData
from ._demo import DemoSettings as DemoSettings
from ._demo import run_demo as run_demo
from ._exceptions import BannedError as BannedError
from ._exceptions import CatchUpError as CatchUpError
from ._exceptions import MalformedUpdateError as MalformedUpdateError
from ._exceptions import MissingUpdatesError as MissingUpdatesError
from ._exceptions import PartitionEvidenceError as PartitionEvidenceError
from ._exceptions import PeerUpdateError as PeerUpdateError
from ._exceptions import ReplayMismatchError as ReplayMismatchError
from ._exceptions import RoundStalledError as RoundStalledError
from ._exceptions import StateMismatchError as StateMismatchError
from ._exceptions import TrainingConfigError as TrainingConfigError
from ._exceptions import TrainingError as TrainingError
from ._headers import HeaderCollector as HeaderCollector
from ._local import LocalResult as LocalResult
from ._local import evaluate as evaluate
from ._local import train_local as train_local
from ._loop import NODE_ATTACKS as NODE_ATTACKS
from ._loop import TrainSettings as TrainSettings
from ._loop import run_node as run_node
from ._model import build_model as build_model
from ._model import load_state as load_state
from ._model import model_state as model_state
from ._partition_evidence import PartitionVerdict as PartitionVerdict
from ._partition_evidence import build_partition_evidence as build_partition_evidence
from ._partition_evidence import check_partition_evidence as check_partition_evidence
from ._partition_evidence import model_numel as model_numel
from ._partition_fetch import fetch_update_segments as fetch_update_segments
from ._partitioned import PARTITION_RESULT_TYPE as PARTITION_RESULT_TYPE
from ._partitioned import PartitionResult as PartitionResult
from ._partitioned import input_segments as input_segments
from ._partitioned import open_partition_result as open_partition_result
from ._partitioned import partition_result_cid as partition_result_cid
from ._partitioned import recompute_partition as recompute_partition
from ._partitioned import seal_partition_result as seal_partition_result
from ._partitioned import state_numel as state_numel
from ._replay_fetch import ReplayInputs as ReplayInputs
from ._replay_fetch import fetch_replay_inputs as fetch_replay_inputs
from ._reputation_evidence import ReputationVerdict as ReputationVerdict
from ._reputation_evidence import check_reputation_evidence as check_reputation_evidence
from ._round import UPDATE_HEADER_TYPE as UPDATE_HEADER_TYPE
from ._round import UpdateHeader as UpdateHeader
from ._round import aggregate_round as aggregate_round
from ._round import header_cid as header_cid
from ._round import open_update_header as open_update_header
from ._round import seal_update_header as seal_update_header
from ._score_records import SCORE_RECORD_TYPE as SCORE_RECORD_TYPE
from ._score_records import ScoreRecord as ScoreRecord
from ._score_records import open_score_record as open_score_record
from ._score_records import score_record_cid as score_record_cid
from ._score_records import seal_score_record as seal_score_record
from ._scores import RoundScoring as RoundScoring
from ._state import state_cid as state_cid
from ._state import state_cid_from_layers as state_cid_from_layers
from ._topics import updates_topic as updates_topic
from ._trainer import NodeTrainer as NodeTrainer

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/node/train/test_exports.py)
    "BannedError",
    "CatchUpError",
    "DATA_ATTACKS",
    "DataConfig",
    "DemoSettings",
    "HeaderCollector",
    "LocalResult",
    "MalformedUpdateError",
    "MissingUpdatesError",
    "ModelConfig",
    "NODE_ATTACKS",
    "NodeTrainer",
    "PARTITION_RESULT_TYPE",
    "PartitionEvidenceError",
    "PartitionResult",
    "PartitionVerdict",
    "PeerUpdateError",
    "ReplayInputs",
    "ReplayMismatchError",
    "ReplayReport",
    "ReputationVerdict",
    "RoundScoring",
    "RoundStalledError",
    "SCORE_RECORD_TYPE",
    "ScoreRecord",
    "SignedUpdates",
    "StateMismatchError",
    "TextData",
    "TrainSettings",
    "TrainingConfig",
    "TrainingConfigError",
    "TrainingError",
    "UPDATE_HEADER_TYPE",
    "UpdateHeader",
    "aggregate_round",
    "build_model",
    "build_partition_evidence",
    "check_partition_evidence",
    "check_reputation_evidence",
    "check_signed_updates",
    "evaluate",
    "fetch_replay_inputs",
    "fetch_update_segments",
    "header_cid",
    "input_segments",
    "load_state",
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
    "store_checkpoint",
    "train_local",
    "updates_topic",
]
