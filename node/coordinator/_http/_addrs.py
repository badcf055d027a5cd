"""Peer addresses as the coordinator accepts them in a join and hands them out in round records.

A node's ``join`` carries the libp2p addresses it can be dialed at; the request is signed, so the
addresses are the peer's own statement. The coordinator keeps at most ``MAX_PEER_ADDRS`` of them,
each a multiaddr of the one form py-libp2p 0.8.1's TCP transport dials
(``/ip4|ip6/ADDR/tcp/PORT[/p2p/PEER]``), never an unspecified or multicast address, and no
private, loopback or link-local address unless the run allows them
(``network.allow_private_addrs``). See specs/coordinator.md#peer-addresses.

The same checks serve the node when it picks which of its own addresses to advertise.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import multiaddr

from .. import limits
from .._exceptions import CoordinatorError

__all__ = ["AddressError", "check_peer_addrs", "is_private_addr", "parse_peer_addr"]


class AddressError(CoordinatorError, ValueError):
    """An address a peer advertises is not one the run accepts; the message names it."""


IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_peer_addr(text: Any, peer: str) -> tuple[str, IP]:
    """Check one advertised address; return it ending in ``/p2p/PEER`` and its IP."""
    if not isinstance(text, str):
        raise AddressError("an address must be a string")
    if len(text) > limits.MAX_ADDR_CHARS:
        raise AddressError(f"address {text[:40]!r}... is over MAX_ADDR_CHARS")
    try:
        normal = str(multiaddr.Multiaddr(text))
    # multiaddr refuses bad text with ParseError (a ValueError, as are the UnicodeError and
    # binascii.Error of its codecs); a lookup in its protocol tables or a codec's arguments may
    # fail with a LookupError or TypeError. Each is the sender's bad address.
    except (ValueError, LookupError, TypeError) as exc:
        raise AddressError(f"{text!r} is not a multiaddr: {exc}") from exc
    parts = normal.split("/")[1:]
    if len(parts) not in (4, 6) or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp":
        raise AddressError(
            f"{text!r} is not /ip4|ip6/ADDR/tcp/PORT[/p2p/PEER] (the form peers dial)"
        )
    if len(parts) == 6 and (parts[4] != "p2p" or parts[5] != peer):
        raise AddressError(f"{text!r} names another peer than the one joining ({peer})")
    ip = ipaddress.ip_address(parts[1])
    port = int(parts[3])
    if ip.is_unspecified or ip.is_multicast or not 0 < port < 65536:
        raise AddressError(f"{text!r} cannot be dialed (unspecified address, multicast or port 0)")
    return f"/{parts[0]}/{ip}/tcp/{port}/p2p/{peer}", ip


def is_private_addr(ip: IP) -> bool:
    """Loopback, private (RFC 1918, ULA), link-local, shared (CGNAT) or reserved."""
    shared = isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10")
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or shared


def check_peer_addrs(addrs: Any, peer: str, *, allow_private: bool) -> list[str]:
    """The addresses of a join, checked and normalized (``/p2p/PEER`` appended, duplicates
    removed, order kept); raise :class:`AddressError` naming the first bad one."""
    if not isinstance(addrs, Sequence) or isinstance(addrs, str | bytes):
        raise AddressError("addrs must be a list of multiaddr strings")
    if len(addrs) > limits.MAX_PEER_ADDRS:
        raise AddressError(f"{len(addrs)} addresses, over MAX_PEER_ADDRS ({limits.MAX_PEER_ADDRS})")
    out: list[str] = []
    for text in addrs:
        normal, ip = parse_peer_addr(text, peer)
        if not allow_private and is_private_addr(ip):
            raise AddressError(
                f"{text!r} is a private address, and this run accepts only public ones "
                "(run config [network] allow_private_addrs)"
            )
        if normal not in out:
            out.append(normal)
    return out
