"""Dial-back at join: which of a joiner's advertised addresses the coordinator can reach.

A node behind a home router, a campus firewall or a cloud NAT advertises addresses nobody can
dial (its LAN address, or a public one with no port forwarded). Each round every member that
dialed them waited out a timeout (issue 37: 35-37 failed dials per NATed node in 4 rounds). At
join the coordinator opens a TCP connection to each advertised address, all at once, within
DIAL_BACK_TIMEOUT_S; only the addresses that accepted are stored and handed to other members.
A joiner with none left is ``outbound-only``: nobody dials it, and its blocks travel over the
connections it opens itself (specs/coordinator.md#reachability).

An address counts when a libp2p listener answers there (multistream-select's header): that
proves the port is open to the coordinator, not that the listener is the joiner; a wrong one
fails the libp2p handshake of whoever dials it (the peer id is part of the address), as a stale
address always could. The coordinator stands in for "the internet": a member on the same LAN
as another but not the coordinator's reach is outbound-only to the whole run.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence

from .. import limits

__all__ = ["Reachability", "dial_back"]


class Reachability(enum.StrEnum):
    """What the dial-back found: some advertised address accepted (``public``), or none did."""

    PUBLIC = "public"
    OUTBOUND_ONLY = "outbound-only"

    @classmethod
    def of(cls, reachable_addrs: Sequence[str]) -> Reachability:
        return cls.PUBLIC if reachable_addrs else cls.OUTBOUND_ONLY


# multistream-select 1.0.0's header, length-prefixed: what a libp2p TCP listener answers with.
MULTISTREAM_HEADER = b"\x13/multistream/1.0.0\n"


def _host_port(addr: str) -> tuple[str, int]:
    # Checked by check_peer_addrs already: /ip4|ip6/ADDR/tcp/PORT/p2p/PEER.
    parts = addr.split("/")
    return parts[2], int(parts[4])


async def _accepts(addr: str, timeout_s: float) -> bool:
    """Whether a libp2p listener answers at ``addr``: a TCP connection, then multistream-select's
    header both ways. A bare TCP accept is not enough: a proxy or middlebox on the path may
    accept any connection (this sandbox's egress proxy does)."""
    host, port = _host_port(addr)
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(MULTISTREAM_HEADER)
            await writer.drain()
            answer = await reader.readexactly(len(MULTISTREAM_HEADER))
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        if writer is not None:
            writer.close()
    return answer == MULTISTREAM_HEADER


async def dial_back(
    addrs: Sequence[str], timeout_s: float = limits.DIAL_BACK_TIMEOUT_S
) -> list[str]:
    """The addresses of ``addrs`` (checked, normalized) that accept a TCP connection within
    ``timeout_s``, in the order given. All are dialed at once: a join waits one timeout at most."""
    if not addrs:
        return []
    accepted = await asyncio.gather(*(_accepts(a, timeout_s) for a in addrs))
    return [a for a, ok in zip(addrs, accepted, strict=True) if ok]
