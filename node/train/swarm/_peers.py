"""Finding the run's other peers through the coordinator, as Psyche's clients learn theirs.

A node advertises its dialable addresses in its signed ``join``; the coordinator hands every
peer's addresses out in the round records of the run state. :class:`PeerFinder` reads the state
every DISCOVERY_POLL_S and dials whoever it lists that this node is not connected to: the members
of the current and last round (so the gossip mesh forms among them, headers flow, and a late
joiner finds the holders of a checkpoint) and the coordinator's own gossip node when it runs one.
``--bootstrap`` peers are dialed too, but nothing depends on them.
See specs/coordinator.md#peer-addresses and specs/training.md#finding-peers.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import psutil
import structlog
import trio

from cnode.node.coordinator import (
    AddressError,
    CoordinatorClient,
    RunState,
    is_private_addr,
    parse_peer_addr,
)
from cnode.node.coordinator import limits as coordinator_limits
from cnode.node.p2p import P2PError, P2PNode

from .. import limits
from .._exceptions import TrainingConfigError
from ._reachability import note_reachability

__all__ = ["PeerFinder", "advertised_addrs", "discovery_poll_s"]

log = structlog.get_logger(__name__)


def _interface_ips() -> list[str]:
    """This machine's IPv4 addresses, loopback last."""
    ips = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family.name == "AF_INET"
    ]
    return sorted(set(ips), key=lambda ip: (ipaddress.ip_address(ip).is_loopback, ip))


def advertised_addrs(
    listen_addrs: Sequence[str],
    announce: Sequence[str],
    *,
    peer: str,
    allow_private: bool,
) -> list[str]:
    """The addresses this node tells the coordinator it can be dialed at.

    ``announce`` (``--announce-addr``, behind a port mapping) replaces what the node derives
    from its listen addresses; each is checked as the coordinator will check it, and a bad one
    is a :class:`TrainingConfigError`. Derived addresses expand a wildcard listen address to the
    machine's interface addresses (loopback only when there is no other), and leave out private
    ones unless the run allows them.
    """
    if announce:
        out: list[str] = []
        for text in announce:
            try:
                normal, ip = parse_peer_addr(text, peer)
            except AddressError as exc:
                raise TrainingConfigError(f"--announce-addr: {exc}") from exc
            if is_private_addr(ip) and not allow_private:
                raise TrainingConfigError(
                    f"--announce-addr {text} is a private address, and this run accepts only "
                    "public ones (run config [network] allow_private_addrs)"
                )
            out.append(normal)
        return out[: coordinator_limits.MAX_PEER_ADDRS]
    out = []
    refused: dict[str, str] = {}  # address -> why the run's coordinator would not accept it
    for listen in listen_addrs:
        parts = listen.split("/")
        if len(parts) < 5 or parts[1] != "ip4" or parts[3] != "tcp":
            refused[listen] = "not an /ip4/ADDR/tcp/PORT address (the form peers dial)"
            continue
        ips = [parts[2]]
        if parts[2] == "0.0.0.0":
            every = _interface_ips()
            ips = [ip for ip in every if not ipaddress.ip_address(ip).is_loopback] or every
        for ip in ips:
            text = f"/ip4/{ip}/tcp/{parts[4]}"
            try:
                normal, parsed = parse_peer_addr(text, peer)
            except AddressError:
                refused[text] = "unspecified address or port 0: nobody can dial it"
                continue
            if not allow_private and is_private_addr(parsed):
                refused[text] = "private or loopback address, and the run is public"
            elif normal not in out:
                out.append(normal)
    if not out:
        # Said once, at join, with the fix: the swarm cannot dial this node. It goes on as a
        # fetch-only peer (specs/training.md#finding-peers): it dials the others, and they fetch
        # from it over the connections it opened; a round in which it reaches nobody stops it.
        log.warning(
            "unreachable_at_join",
            refused=refused or {"(none)": "no listen address"},
            fix="give --announce-addr with an address the others can dial (a public address "
            "or port mapping), or set the run's [network] allow_private_addrs (cnode "
            "coordinator --allow-private-addrs) for a LAN or one machine",
        )
    return out[: coordinator_limits.MAX_PEER_ADDRS]


def listed_addrs(state: RunState) -> dict[str, list[str]]:
    """Peer -> addresses of everyone the state's current and last round list."""
    addrs: dict[str, list[str]] = {}
    for record in (state.last_round, state.round):
        if record is not None:
            addrs.update(record.addrs)
    return addrs


def discovery_poll_s(listed: int) -> float:
    """Seconds to the next read of the run state by ``follow``, with ``listed`` peers in it:
    DISCOVERY_POLL_S per DISCOVERY_PEERS_PER_POLL listed peers, at most DISCOVERY_POLL_MAX_S.
    The swarm's reads then stay about constant in n instead of growing with it (issue 27); a
    round's own members are dialed from its record anyway, and bans also come by gossip."""
    scale = max(1.0, listed / limits.DISCOVERY_PEERS_PER_POLL)
    return min(limits.DISCOVERY_POLL_S * scale, limits.DISCOVERY_POLL_MAX_S)


def _peer_of(address: str) -> str:
    return address.rsplit("/p2p/", 1)[-1]


class PeerFinder:
    """Dials the peers the coordinator lists, with a backoff per peer that could not be dialed."""

    def __init__(self, node: P2PNode, refused: Callable[[str], bool]) -> None:
        self.node = node
        self.refused = refused  # banned peers are never dialed
        self._backoff: dict[str, tuple[float, float]] = {}  # peer -> (next try, delay)
        self.last_error: dict[str, str] = {}  # peer -> why its last dial failed

    def why_unreached(self, peer: str, addrs: Sequence[str]) -> str:
        """Why ``peer`` (listed with ``addrs``) is not connected, in words for the log."""
        if not addrs:
            return "the coordinator lists no address for it (it advertised none it accepts)"
        return self.last_error.get(peer, "not dialed yet")[: limits.MAX_REASON_CHARS]

    async def dial(self, addrs: Mapping[str, Sequence[str]]) -> None:
        """Connect to every peer in ``addrs`` (peer -> its addresses) not yet connected."""
        connected = set(self.node.connected_peers())
        now = time.monotonic()
        todo = {
            peer: list(a)
            for peer, a in addrs.items()
            if peer != self.node.peer_id
            and peer not in connected
            and not self.refused(peer)
            and self._backoff.get(peer, (0.0, 0.0))[0] <= now
        }
        if todo:
            async with trio.open_nursery() as nursery:
                for peer, peer_addrs in todo.items():
                    nursery.start_soon(self._dial_one, peer, peer_addrs)

    def say_unreached(
        self, round_: int, members: Sequence[str], addrs: Mapping[str, Sequence[str]]
    ) -> dict[str, str]:
        """The round's other members this node is not connected to, and why; when that is
        every one of them, one warning names them (within the round, not at its end)."""
        me = self.node.peer_id
        connected = set(self.node.connected_peers())
        others = [m for m in members if m != me]
        unreached = {
            m: self.why_unreached(m, addrs.get(m, [])) for m in others if m not in connected
        }
        if others and len(unreached) == len(others):
            log.warning(
                "round_members_unreachable", round=round_, members=dict(sorted(unreached.items()))
            )
        return unreached

    async def _dial_one(self, peer: str, addrs: list[str]) -> None:
        errors = []
        for address in addrs[: coordinator_limits.MAX_PEER_ADDRS]:
            try:
                with trio.fail_after(limits.DIAL_TIMEOUT_S):
                    await self.node.connect(address)
            except (P2PError, trio.TooSlowError) as exc:
                errors.append(f"{address}: {exc or 'timed out'}")
                continue
            self._backoff.pop(peer, None)
            self.last_error.pop(peer, None)
            log.debug("peer_dialed", remote=peer[-8:], address=address)
            return
        _, delay = self._backoff.get(peer, (0.0, limits.DIAL_BACKOFF_FIRST_S / 2))
        delay = min(2 * delay, limits.DIAL_BACKOFF_MAX_S)
        self._backoff[peer] = (time.monotonic() + delay, delay)
        self.last_error[peer] = "; ".join(errors) or "no address to dial"
        log.info("peer_not_dialed", remote=peer[-8:], retry_in_s=delay, errors=errors)

    async def dial_listed(self, addrs: Mapping[str, Sequence[str]]) -> None:
        """Dial the members of a round now, ignoring backoff: the round needs them."""
        for peer in addrs:
            self._backoff.pop(peer, None)
        await self.dial(addrs)

    async def dial_state(self, client: CoordinatorClient) -> None:
        """Dial every peer the run state lists now (a joiner about to fetch a checkpoint)."""
        await self.dial_listed(listed_addrs(await client.run_state()))

    async def follow(
        self,
        client: CoordinatorClient,
        bootstrap: Iterable[str],
        on_state: Callable[[RunState], None],
    ) -> None:
        """Every DISCOVERY_POLL_S: read the signed run state, hand it to ``on_state`` (bans),
        and dial whoever it lists. Runs until cancelled."""
        extra: dict[str, list[str]] = {}
        for address in bootstrap:
            extra.setdefault(_peer_of(address), []).append(address)
        while True:
            state = await client.run_state()
            on_state(state)
            wanted = dict(extra)
            for address in state.p2p_addrs:  # the coordinator's gossip node
                wanted.setdefault(_peer_of(address), []).append(address)
            listed = listed_addrs(state)
            wanted.update(listed)
            for record in (state.last_round, state.round):
                if record is not None and record.members:
                    note_reachability(self.node, record.members, record.addrs)
            await self.dial(wanted)
            await trio.sleep(discovery_poll_s(len(listed)))
