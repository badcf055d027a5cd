"""What a node is given: its identity, its settings, and the addresses of peers to dial.

:func:`peer_info` is the one parser of peer addresses (``connect`` and the CLI's up-front check
use it), so a bad ``--peer`` is refused with what is wrong with it before anything is dialled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import multiaddr
from libp2p.crypto.keys import KeyPair
from libp2p.peer.peerinfo import InvalidAddrError, PeerInfo, info_from_p2p_addr

from cnode.node._config import NodeConfig

from ._exceptions import DialError

__all__ = ["NodeIdentity", "P2PSettings", "check_peer_address", "peer_info"]


class NodeIdentity(Protocol):
    """What the node needs of ``cnode.auth.Identity``."""

    @property
    def peer_id_str(self) -> str: ...

    def key_pair(self) -> KeyPair: ...


@dataclass(frozen=True)
class P2PSettings:
    """How a node listens, whom it dials first, and how much it uploads.

    ``corrupt_uploads_for_tests`` and ``busy_for_tests`` are TESTING AIDS ONLY (see
    BlockServer).
    """

    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: tuple[str, ...] = ()
    upload_rate_bytes_per_s: int = 0  # 0 = no cap
    run_id: str | None = None  # join this run's announcement topic
    corrupt_uploads_for_tests: bool = False
    busy_for_tests: float = 0.0

    @classmethod
    def from_config(cls, config: NodeConfig, *, run_id: str | None = None) -> P2PSettings:
        """Listen address, bootstrap peers and upload cap from the node's ``config.toml``."""
        return cls(
            listen=(config.listen,),
            bootstrap=tuple(config.bootstrap),
            upload_rate_bytes_per_s=config.upload_rate_bytes_per_s,
            run_id=run_id,
        )


def peer_info(address: str) -> PeerInfo:
    """The peer id and transport address of a multiaddr ending in ``/p2p/PEER_ID``.

    Error handling: DialError saying what is wrong with ``address`` (not a multiaddr, a bad IP,
    port or peer id, or no ``/p2p/PEER_ID`` at the end).
    """
    try:
        addr = multiaddr.Multiaddr(address)
    except (ValueError, multiaddr.exceptions.Error) as exc:
        reason = str(exc).split(": ", 1)[-1].split(" (string:")[0]
        raise DialError(f"bad peer address {address!r}: {reason}") from exc
    if [protocol.name for protocol in addr.protocols()][-1:] != ["p2p"]:
        raise DialError(f"bad peer address {address!r}: it names no peer; end it with /p2p/PEER_ID")
    try:
        return info_from_p2p_addr(addr)
    except (InvalidAddrError, ValueError) as exc:
        raise DialError(f"bad peer address {address!r}: {exc}") from exc


def check_peer_address(address: str) -> str:
    """The peer id ``address`` names; DialError saying what is wrong with it (nothing dialled)."""
    return str(peer_info(address).peer_id)
