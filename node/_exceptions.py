"""Errors of ``cnode.node``: the root every node package's tree hangs from, and its own.

The tree::

    cnode.CnodeError
     └── NodeError                anything cnode.node reports
          ├── ConfigError         this node's config.toml or key file is missing, unreadable or
          │                       holds a bad value (fix the file)
          ├── UsageError          a command was given a wrong argument: a CID, a path, a peer
          │                       address, a conflicting option (the user's input)
          ├── InitError           ``cnode init`` cannot set up the home folder
          ├── TrainingError       cnode.node.train (its tree: node/train/_exceptions.py)
          ├── HubError            cnode.node.hub (node/hub/_exceptions.py)
          ├── P2PError            cnode.node.p2p (node/p2p/_exceptions.py)
          └── CoordinatorError    cnode.node.coordinator (node/coordinator/_exceptions.py)

The command line prints any of them as one line, ``cnode: error: <message>``, and exits 1.
"""

from __future__ import annotations

from cnode import CnodeError

__all__ = ["ConfigError", "InitError", "NodeError", "UsageError"]


class NodeError(CnodeError):
    """Raised by cnode.node when a node operation cannot be done; the root of node's errors."""


class ConfigError(NodeError):
    """Raised when ``config.toml`` (or the key file it names) is missing, unreadable or bad."""


class UsageError(NodeError):
    """Raised by a command when its input is wrong: the message says which and why."""


class InitError(NodeError):
    """Raised by ``cnode init`` when the home folder cannot be set up; nothing was changed."""
