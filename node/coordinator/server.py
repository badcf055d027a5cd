"""The coordinator's server side: what ``cnode coordinator serve`` (and a test) runs.

Kept out of ``cnode.node.coordinator`` so that a training node, which only talks to a
coordinator, never imports the HTTP server, the run state machine or SQLite.

- :class:`CoordinatorServer`: the aiohttp server of one run, in this process (asyncio).
- :class:`CoordinatorProcess`: ``cnode coordinator serve`` in its own process.
- :class:`StateGossip`: its libp2p node that gossips the signed state.
- :class:`ServeSettings`: what one server serves.
- :class:`EvidenceChecker`, :class:`BadEvidence`: how it recomputes a partition result from
  evidence (the training package provides the function, which returns a
  ``cnode.node.coordinator.PartitionVerdict``).
- :class:`EvidenceTiming`: the waits and rates of evidence checks (named limits by default).
- :class:`ReputationChecker`: how it checks a reputation-ban report on the score records it
  holds (the training package provides the function; a ``ReputationVerdict``).
"""

from ._bans._evidence import EvidenceChecker as EvidenceChecker
from ._bans._reputation import ReputationChecker as ReputationChecker
from ._exceptions import BadEvidence as BadEvidence
from ._gossip import StateGossip as StateGossip
from ._http._server import CoordinatorServer as CoordinatorServer
from ._http._server import ServeSettings as ServeSettings
from ._http._slots import EvidenceTiming as EvidenceTiming
from ._process import CoordinatorProcess as CoordinatorProcess

__all__ = [
    "BadEvidence",
    "CoordinatorProcess",
    "CoordinatorServer",
    "EvidenceChecker",
    "EvidenceTiming",
    "ReputationChecker",
    "ServeSettings",
    "StateGossip",
]
