"""The model and what one node does with it alone: build it, shard the data, train K local steps,
keep the error-feedback residual, name a state by its CID, and check the model fits this machine's
memory.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._corrupt import DATA_ATTACKS as DATA_ATTACKS
from ._corrupt import corrupt_data as corrupt_data
from ._data import TextData as TextData
from ._device import DEVICE_CHOICES as DEVICE_CHOICES
from ._device import Placement as Placement
from ._device import autocast as autocast
from ._device import resolve_device as resolve_device
from ._local import InnerMoments as InnerMoments
from ._local import LocalResult as LocalResult
from ._local import evaluate as evaluate
from ._local import train_local as train_local
from ._memory import MemoryNeed as MemoryNeed
from ._memory import check_model_fits as check_model_fits
from ._memory import memory_need as memory_need
from ._model import State as State
from ._model import build_model as build_model
from ._model import load_state as load_state
from ._model import model_state as model_state
from ._outer import MOMENTUM_PREFIX as MOMENTUM_PREFIX
from ._outer import adopted_momentum as adopted_momentum
from ._outer import join_momentum as join_momentum
from ._outer import outer_step as outer_step
from ._outer import outer_step_flat as outer_step_flat
from ._outer import split_momentum as split_momentum
from ._outer import uses_momentum as uses_momentum
from ._outer import zero_momentum as zero_momentum
from ._residual import Residual as Residual
from ._residual import drop_residual as drop_residual
from ._residual import load_residual as load_residual
from ._residual import save_residual as save_residual
from ._residual import with_residual as with_residual
from ._state import layer_chunk_cids as layer_chunk_cids
from ._state import state_cid as state_cid
from ._state import state_cid_from_layers as state_cid_from_layers
