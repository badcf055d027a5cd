"""The root of every cnode exception tree.

Each subpackage draws its own tree in its ``_exceptions.py``; all of them hang from here::

    CnodeError
    ├── cnode.auth:        AuthError, ...
    ├── cnode.storage:     StorageError, ...
    ├── cnode.aggregation: AggregationError, ...
    └── cnode.node:        NodeError (node/_exceptions.py: ConfigError, UsageError, InitError)
                           ├── TrainingError, ...     cnode.node.train
                           ├── HubError, ...          cnode.node.hub
                           ├── P2PError, ...          cnode.node.p2p
                           └── CoordinatorError, ...  cnode.node.coordinator

Each name says whose fault it was: a remote peer's (``PeerProtocolError``, ``BadRunState``), the
user's input (``UsageError``), a local file (``ConfigError``), the network (``DialError``,
``CoordinatorUnavailable``). ``tests/test_exports.py`` checks that every package's errors hang
from its root and every root from here.

The command line prints ``str(error)`` of any ``CnodeError`` as one line and exits non-zero, so
messages must name what was wrong (the file, the CID, the peer) and never contain secrets.
"""


class CnodeError(Exception):
    """Raised by cnode when an operation cannot be done; the message says why."""
