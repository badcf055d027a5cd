"""The root of every cnode exception tree.

Each subpackage draws its own tree in its ``_exceptions.py``; all of them hang from here::

    CnodeError
    ├── cnode.auth:        AuthError, ...
    ├── cnode.storage:     StorageError, ...
    ├── cnode.aggregation: AggregationError, ...
    └── cnode.node:        NodeError, PeerProtocolError, ...

The command line prints ``str(error)`` of any ``CnodeError`` as one line and exits non-zero, so
messages must name what was wrong (the file, the CID, the peer) and never contain secrets.
"""


class CnodeError(Exception):
    """Raised by cnode when an operation cannot be done; the message says why."""
