"""cnode.node.train: the training loop of a run.

A tiny GPT-2-style model built from the run's config, the shipped corpus with its locally trained
byte-level BPE tokenizer, one shard per peer, local steps whose parameter delta is the update,
deterministic aggregation into a state every honest node agrees on (by its state CID),
checkpoints with their aggregation record, and replay. Spec: specs/training.md.
"""

from ._config import DataConfig as DataConfig
from ._config import ModelConfig as ModelConfig
from ._config import TrainingConfig as TrainingConfig
from ._data import TextData as TextData
from ._exceptions import CatchUpError as CatchUpError
from ._exceptions import PeerUpdateError as PeerUpdateError
from ._exceptions import ReplayMismatchError as ReplayMismatchError
from ._exceptions import StateMismatchError as StateMismatchError
from ._exceptions import TrainingConfigError as TrainingConfigError
from ._exceptions import TrainingError as TrainingError
from ._local import LocalResult as LocalResult
from ._local import evaluate as evaluate
from ._local import train_local as train_local
from ._model import build_model as build_model
from ._model import load_state as load_state
from ._model import model_state as model_state

__all__ = [
    "CatchUpError",
    "DataConfig",
    "LocalResult",
    "ModelConfig",
    "PeerUpdateError",
    "ReplayMismatchError",
    "StateMismatchError",
    "TextData",
    "TrainingConfig",
    "TrainingConfigError",
    "TrainingError",
    "build_model",
    "evaluate",
    "load_state",
    "model_state",
    "train_local",
]
