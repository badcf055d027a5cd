"""/cnode/admit/1.0.0: in a run, blocks are served only to peers that showed a valid access token.

The policy (PeerAdmission) with a fake clock, then real hosts in one trio run: a holder that
requires tokens, and fetchers with no token, a valid one, someone else's, an expired one, and a
token of a peer banned since.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio
import trio.testing

from cnode.auth import Identity, TokenError, issue_access_token
from cnode.node.p2p import (
    FetchError,
    P2PSettings,
    PeerAdmission,
    limits,
    open_p2p_node,
)
from cnode.node.p2p._blocks._admission import present_token, serve_admit
from cnode.storage import BlockStore, CheckpointMeta, missing_blocks, save_checkpoint

RUN = "run-a"
NOW = 1_800_000_000
COORDINATOR = Identity.generate()


def _token(
    peer: Identity, *, expires_at: int = NOW + 600, run: str = RUN, by: Identity = COORDINATOR
) -> bytes:
    return issue_access_token(
        by, peer_id=peer.peer_id_str, username="u", run=run, expires_at=expires_at
    )


def _policy(
    token: bytes | None = None, *, banned: set[str] | None = None, now: float = NOW
) -> PeerAdmission:
    return PeerAdmission(
        coordinator=COORDINATOR.peer_id_str,
        run=RUN,
        credential=lambda: token,
        refused=lambda peer: peer in (banned or set()),
        clock=lambda: now,
    )


# -- the policy ----------------------------------------------------------------------------------


def test_a_valid_token_admits_its_peer_until_it_expires() -> None:
    peer = Identity.generate()
    policy = _policy()
    assert not policy.allow(peer.peer_id_str)
    assert policy.admit(peer.peer_id_str, _token(peer)) == NOW + 600
    assert policy.allow(peer.peer_id_str)
    later = _policy(now=NOW + 600)
    later.admit(peer.peer_id_str, _token(peer, expires_at=NOW + 601))
    later.clock = lambda: NOW + 601
    assert not later.allow(peer.peer_id_str)  # expired: must show a fresh token


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda p: _token(p, expires_at=NOW), TokenError, "expired"),
        (lambda p: _token(p, run="other"), TokenError, "for run 'other'"),
        (lambda p: _token(p, by=Identity.generate()), TokenError, "not issued by this run"),
        (lambda p: _token(Identity.generate()), PermissionError, "the token is"),
        (lambda p: b"\xa0", TokenError, "malformed"),
    ],
    ids=["expired", "other-run", "other-coordinator", "someone-elses", "garbage"],
)
def test_bad_tokens_are_refused(make, error, message) -> None:  # type: ignore[no-untyped-def]
    peer = Identity.generate()
    policy = _policy()
    with pytest.raises(error, match=message):
        policy.admit(peer.peer_id_str, make(peer))
    assert not policy.allow(peer.peer_id_str)


def test_a_banned_peer_is_refused_even_with_a_token_it_had_before() -> None:
    peer = Identity.generate()
    banned: set[str] = set()
    policy = _policy(banned=banned)
    policy.admit(peer.peer_id_str, _token(peer))
    banned.add(peer.peer_id_str)
    assert not policy.allow(peer.peer_id_str)
    with pytest.raises(PermissionError, match="banned"):
        policy.admit(peer.peer_id_str, _token(peer))


class _Conn:
    """Stands for a libp2p connection (only its identity matters)."""


def test_own_token_is_shown_once_per_connection_and_again_near_its_expiry() -> None:
    me = Identity.generate()
    token = _token(me)
    policy = _policy(token)
    conn = _Conn()
    assert policy.to_show("holder", [conn]) == token
    policy.shown("holder", NOW + 600, conn)
    assert policy.to_show("holder", [conn]) is None
    # The holder restarted (it forgot us): a new connection, so the token is shown again.
    assert policy.to_show("holder", [_Conn()]) == token
    policy.clock = lambda: NOW + 600 - limits.ADMIT_RENEW_S + 1
    assert policy.to_show("holder", [conn]) == token
    assert _policy(None).to_show("holder", [conn]) is None  # not joined: nothing to show


def test_the_admitted_table_is_bounded() -> None:
    policy = _policy()
    first = Identity.generate()
    policy.admit(first.peer_id_str, _token(first))
    for _ in range(limits.MAX_ADMITTED_PEERS):
        other = Identity.generate()
        policy._admitted[other.peer_id_str] = NOW + 600  # as admit() would, without signing
    policy.admit(first.peer_id_str, _token(first))  # re-admitted: newest again
    extra = Identity.generate()
    policy.admit(extra.peer_id_str, _token(extra))
    assert len(policy._admitted) == limits.MAX_ADMITTED_PEERS
    assert policy.allow(first.peer_id_str) and policy.allow(extra.peer_id_str)


# -- the stream, without a network ---------------------------------------------------------------


def test_the_exchange_over_a_memory_stream() -> None:
    peer = Identity.generate()
    holder = _policy()

    async def main() -> None:
        a, b = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_admit, _Bytes(b), peer.peer_id_str, holder)
            assert await present_token(_Bytes(a), "holder", _token(peer)) == NOW + 600
        assert holder.allow(peer.peer_id_str)

    trio.run(main)


class _Bytes:
    """trio's memory stream as the three-method ByteStream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def read(self, max_bytes: int) -> bytes:
        return bytes(await self.stream.receive_some(max_bytes))

    async def write(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def close(self) -> None:
        await self.stream.aclose()


# -- real hosts ----------------------------------------------------------------------------------


def _checkpoint(store: BlockStore) -> object:
    tensors = {"w": torch.arange(600_000, dtype=torch.float32)}  # 2.4 MB: three chunks
    return save_checkpoint(store, tensors, CheckpointMeta(run_id=RUN))


@pytest.mark.parametrize(
    ("token_of", "banned", "expect"),
    [
        ("own", False, None),
        (None, False, "did not admit us|FORBIDDEN"),
        ("other", False, "did not admit us: .*FORBIDDEN: the token is"),
        ("own", True, "did not admit us: .*banned"),
    ],
    ids=["valid", "no-token", "someone-elses", "banned"],
)
def test_a_holder_serves_only_admitted_peers(
    tmp_path: Path, token_of: str | None, banned: bool, expect: str | None
) -> None:
    holder_id, fetcher_id, other = Identity.generate(), Identity.generate(), Identity.generate()
    holder_store, fetcher_store = BlockStore(tmp_path / "h"), BlockStore(tmp_path / "f")
    root = _checkpoint(holder_store)
    refused = {fetcher_id.peer_id_str} if banned else set()
    holder_policy = PeerAdmission(
        coordinator=COORDINATOR.peer_id_str,
        run=RUN,
        credential=lambda: _token(holder_id, expires_at=2**40),
        refused=lambda peer: peer in refused,
    )
    shown = {"own": fetcher_id, "other": other}.get(token_of or "")
    fetcher_policy = PeerAdmission(
        coordinator=COORDINATOR.peer_id_str,
        run=RUN,
        credential=lambda: None if shown is None else _token(shown, expires_at=2**40),
    )

    async def main() -> None:
        async with (
            open_p2p_node(
                holder_id, holder_store, P2PSettings(), allow=bool, admission=holder_policy
            ) as holder,
            open_p2p_node(
                fetcher_id, fetcher_store, P2PSettings(), allow=bool, admission=fetcher_policy
            ) as fetcher,
        ):
            with trio.fail_after(30):
                peer = await fetcher.connect(holder.listen_addrs[0])
                if expect is None:
                    await fetcher.fetch(root, [peer])  # type: ignore[arg-type]
                    assert missing_blocks(fetcher_store, root) == []  # type: ignore[arg-type]
                    assert holder_policy.allow(fetcher_id.peer_id_str)
                else:
                    with pytest.raises(FetchError, match=expect):
                        await fetcher.fetch(root, [peer])  # type: ignore[arg-type]
                    assert fetcher_store.has(root) is False  # type: ignore[arg-type]
                    assert holder.server.bytes_sent == 0

    trio.run(main)


def test_a_holder_that_restarted_is_shown_the_token_again(tmp_path: Path) -> None:
    holder_id, fetcher_id = Identity.generate(), Identity.generate()
    holder_store, fetcher_store = BlockStore(tmp_path / "h"), BlockStore(tmp_path / "f")
    first = _checkpoint(holder_store)
    second = save_checkpoint(holder_store, {"v": torch.ones(300_000)}, CheckpointMeta(run_id=RUN))

    def policy(me: Identity) -> PeerAdmission:
        return PeerAdmission(
            coordinator=COORDINATOR.peer_id_str,
            run=RUN,
            credential=lambda: _token(me, expires_at=2**40),
        )

    fetcher_policy = policy(fetcher_id)

    async def main() -> None:
        async with open_p2p_node(
            fetcher_id, fetcher_store, P2PSettings(), allow=bool, admission=fetcher_policy
        ) as fetcher:
            for root in (first, second):  # the same holder identity, a fresh process each time
                async with open_p2p_node(
                    holder_id, holder_store, P2PSettings(), allow=bool, admission=policy(holder_id)
                ) as holder:
                    with trio.fail_after(30):
                        peer = await fetcher.connect(holder.listen_addrs[0])
                        await fetcher.fetch(root, [peer])  # type: ignore[arg-type]
                assert missing_blocks(fetcher_store, root) == []  # type: ignore[arg-type]
                with trio.fail_after(10):  # the old connection is gone before the restart
                    while holder_id.peer_id_str in fetcher.connected_peers():
                        await trio.sleep(0.05)

    trio.run(main)


def test_a_token_is_shown_once_per_connection_however_many_requests(tmp_path: Path) -> None:
    """Issue 41: every request showed the token again (11,341 admissions at 16 members)."""
    holder_id, fetcher_id = Identity.generate(), Identity.generate()
    holder_store, fetcher_store = BlockStore(tmp_path / "h"), BlockStore(tmp_path / "f")
    roots = [
        save_checkpoint(
            holder_store, {"w": torch.full((300_000,), float(i))}, CheckpointMeta(run_id=RUN)
        )
        for i in range(3)
    ]

    def policy(me: Identity) -> PeerAdmission:
        return PeerAdmission(
            coordinator=COORDINATOR.peer_id_str,
            run=RUN,
            credential=lambda: _token(me, expires_at=2**40),
        )

    async def main() -> None:
        async with (
            open_p2p_node(
                holder_id, holder_store, P2PSettings(), allow=bool, admission=policy(holder_id)
            ) as holder,
            open_p2p_node(
                fetcher_id, fetcher_store, P2PSettings(), allow=bool, admission=policy(fetcher_id)
            ) as fetcher,
        ):
            with trio.fail_after(30):
                peer = await fetcher.connect(holder.listen_addrs[0])
                for root in roots:
                    await fetcher.fetch(root, [peer])
                    assert missing_blocks(fetcher_store, root) == []
            stats = fetcher.traffic.exchange
            assert stats.requests >= 3
            assert stats.tokens_shown == 1
            assert holder.traffic.exchange.admissions == 1
            assert holder.traffic.exchange.admissions_by_peer == {fetcher_id.peer_id_str: 1}

    trio.run(main)
