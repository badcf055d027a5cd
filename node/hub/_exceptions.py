"""Errors of ``cnode.node.hub`` (checkpoints on a Hugging Face Hub repo).

The tree::

    cnode.node.NodeError              (under cnode.CnodeError; node/_exceptions.py)
     └── HubError                 a checkpoint could not be uploaded to or downloaded from a Hub
          ├── HubLoginError       this node has no usable Hub login (run cnode init --hf-login)
          └── HubUnavailable      the Hub could not be reached, or refused (status in the message)

Bytes that a Hub serves but that do not match the manifest are not a HubError: they are
``cnode.storage.HFFolderError`` raised by the verified import, naming the layer.
"""

from __future__ import annotations

from cnode.node._exceptions import NodeError

__all__ = ["HubError", "HubLoginError", "HubUnavailable"]


class HubError(NodeError):
    """Raised when a checkpoint cannot be moved to or from a Hugging Face Hub repo."""


class HubLoginError(HubError):
    """Raised when this node's stored Hub login is missing or unusable."""


class HubUnavailable(HubError):
    """Raised when the Hub cannot be reached or answers with an error status."""
