"""Checkpoints of a run: store one, replay one, fetch what a replay needs, and the agreement
check of this node's checkpoint against the swarm's.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._agreement import agree_on_checkpoint as agree_on_checkpoint
from ._checkpoint import RoundLog as RoundLog
from ._checkpoint import genesis_state as genesis_state
from ._checkpoint import read_training_checkpoint as read_training_checkpoint
from ._checkpoint import store_checkpoint as store_checkpoint
from ._replay import ReplayReport as ReplayReport
from ._replay import replay_checkpoint as replay_checkpoint
from ._replay_fetch import ReplayInputs as ReplayInputs
from ._replay_fetch import fetch_replay_inputs as fetch_replay_inputs
from ._signed import SignedUpdates as SignedUpdates
from ._signed import check_signed_updates as check_signed_updates
