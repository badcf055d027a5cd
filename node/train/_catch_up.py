"""Getting the state a round needs, and keeping the checkpoints' Hub copy.

A node that is behind (a late joiner, a restarted node) takes the coordinator's checkpoint of
the round before the one it was placed in: from every peer that holds it, every block verified,
or, when no peer serves it, from the Hub commit the coordinator recorded, verified against the
same manifest CID. A checkpointer started with ``--hf-repo`` uploads each checkpoint there.
See specs/training.md#late-join and #hugging-face-fallback.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog
import trio

from cnode.node._logging import bind_context
from cnode.node.coordinator import CheckpointRecord, CoordinatorClient
from cnode.node.hub import (
    HubError,
    HubLogin,
    HubRevision,
    download_checkpoint,
    upload_checkpoint,
)
from cnode.node.p2p import FetchError, GatewayHolder, P2PNode, fetch_purpose, gateway_client
from cnode.storage import CID, HFFolderError

from . import limits
from ._exceptions import CatchUpError
from ._report import Event, Reporter
from ._trainer import NodeTrainer
from .swarm import KnownBans, leave_round

__all__ = ["CatchUp"]

log = structlog.get_logger(__name__)


@dataclass
class CatchUp:
    """The checkpoints one node takes in and gives out."""

    run: str
    trainer: NodeTrainer
    reporter: Reporter
    bans: KnownBans
    every: int  # the run's checkpoint_every
    workdir: Path  # temporary Hub folders go here (as big as the model)
    login: HubLogin | None  # `cnode init --hf-login`, if any
    hf_repo: str | None  # --hf-repo: upload each checkpoint there
    gateways: tuple[str, ...] = ()  # --fetch-gateway: trustless gateways, after peers
    # Dials the peers the run state lists, before a fetch (a joiner may not know them yet).
    connect_peers: Callable[[], Awaitable[None]] | None = None

    async def state_for(self, client: CoordinatorClient, node: P2PNode, round_: int) -> int:
        """Get the state a round needs; return the round to train (not always ``round_``).

        Round ``round_`` needs the state of ``round_ - 1``. When the coordinator holds no
        checkpoint of that round (``checkpoint_every`` > 1, or the swarm moved on meanwhile),
        the node leaves ``round_``, waits for the next checkpoint and joins the round after it
        (its Warmup lets joiners in): it waits rather than replays, see
        specs/training.md#late-join.
        """
        for _ in range(limits.CATCH_UP_ATTEMPTS):
            record = await self._checkpoint_for(client, round_ - 1)
            if record is not None and record.round == round_ - 1:
                await self._fetch(node, record)
                return round_
            await leave_round(client, round_)
            have = -1 if record is None else record.round
            # Older: wait for the next checkpoint round. Newer (the swarm moved on while this
            # node waited): join the current round at once, it needs that checkpoint.
            want = have if have >= round_ - 1 else -(-(round_ - 1) // self.every) * self.every
            self.reporter.event(Event.WAITING_FOR_CHECKPOINT, round=round_, have=have, want=want)
            log.info("waiting_for_checkpoint", round=round_, have=have, want=want)
            with trio.fail_after(limits.CHECKPOINT_WAIT_S):
                while have < want:
                    await trio.sleep(limits.SLOW_POLL_S)
                    state = await client.run_state()
                    self.bans.take(state.bans)
                    have = -1 if state.checkpoint is None else state.checkpoint.round
            round_ = await client.join_round()
            bind_context(round=round_)
        raise CatchUpError(
            f"no checkpoint matched the round this node was placed in after "
            f"{limits.CATCH_UP_ATTEMPTS} tries (last: round {round_})"
        )

    async def _checkpoint_for(
        self, client: CoordinatorClient, need: int
    ) -> CheckpointRecord | None:
        """The coordinator's checkpoint of round ``need``, or the latest (None: none yet) if
        none of ``need`` will come.

        A checkpoint of ``need`` comes when ``need`` is a multiple of ``checkpoint_every`` (the
        coordinator's Cooldown waits for it); for other rounds there is none to wait for.
        """
        with trio.fail_after(limits.CATCH_UP_FETCH_S):
            while True:
                state = await client.run_state()
                self.bans.take(state.bans)
                record = state.checkpoint
                if need % self.every or (record is not None and record.round >= need):
                    return record
                await trio.sleep(limits.POLL_INTERVAL_S)

    async def _fetch(self, node: P2PNode, record: CheckpointRecord) -> None:
        """Fetch ``record``'s checkpoint from peers, then gateways, then the Hub; verify, adopt."""
        began = time.monotonic()
        cid = CID.parse(record.manifest)
        if self.connect_peers is not None:
            await self.connect_peers()
        # Blocks are verified whoever serves them, but banned peers are not asked at all.
        peers = [p for p in node.connected_peers() if p not in self.bans]
        try:
            with fetch_purpose("catch_up"):
                fetched = await self._from_peers_then_gateways(node, cid, peers)
        except (FetchError, trio.TooSlowError) as exc:
            if record.hf_repo is None or record.hf_revision is None:
                raise CatchUpError(
                    f"cannot fetch checkpoint {cid} of round {record.round}: {exc}"
                ) from exc
            log.warning("catch_up_from_hub", manifest=str(cid), peers_error=str(exc))
            where = HubRevision(record.hf_repo, record.hf_revision)
            fetched = await self._download(cid, where, reason=str(exc))
        await trio.to_thread.run_sync(self.trainer.adopt_checkpoint, cid)
        await node.announce_hold(cid)
        self.reporter.event(
            Event.CAUGHT_UP,
            round=record.round,
            manifest=str(cid),
            seconds=time.monotonic() - began,
            **fetched,
        )

    async def _from_peers_then_gateways(
        self, node: P2PNode, cid: CID, peers: list[str]
    ) -> dict[str, object]:
        """Peers first; if they cannot finish, gateways (with the peers still in the mix)."""
        source = "peers"
        try:
            with trio.fail_after(limits.CATCH_UP_FETCH_S):
                report = await node.fetch(cid, holders=peers)
        except (FetchError, trio.TooSlowError) as exc:
            if not self.gateways:
                raise
            log.warning("catch_up_from_gateways", manifest=str(cid), peers_error=str(exc))
            source = "gateways"
            async with gateway_client() as http:
                holders = [GatewayHolder(url, http) for url in self.gateways]
                with trio.fail_after(limits.CATCH_UP_FETCH_S):
                    report = await node.fetch(cid, holders=peers, gateways=holders)
        return {
            "source": source,
            "fetch_seconds": report.seconds,
            "bytes": report.bytes,
            "bytes_per_holder": dict(report.per_holder_bytes),
            "dropped": dict(report.dropped),
        }

    async def _download(self, cid: CID, where: HubRevision, *, reason: str) -> dict[str, object]:
        """The fallback when no peer serves the checkpoint: the Hub commit the coordinator named.

        The bytes are checked slice by slice against ``cid`` (signed by the coordinator), so
        the Hub is trusted for availability only.
        """
        token = self.login.token if self.login is not None else None

        def download() -> int:
            store = self.trainer.store
            return download_checkpoint(store, cid, where, workdir=self.workdir, token=token)

        began = time.monotonic()
        try:
            with trio.fail_after(limits.CATCH_UP_FETCH_S):
                # Abandoned on timeout: what it stores later is verified, and harmless. (mypy
                # cannot match a keyword after trio's Unpack[Ts] *args: hence the ignore.)
                size = await trio.to_thread.run_sync(
                    download,
                    abandon_on_cancel=True,  # type: ignore[call-arg]
                )
        except (HubError, HFFolderError, trio.TooSlowError) as exc:
            raise CatchUpError(
                f"cannot fetch checkpoint {cid}: no peer served it ({reason}), and from "
                f"{where.repo}@{where.revision[:12]}: {exc}"
            ) from exc
        return {
            "source": "hub",
            "hub": f"{where.repo}@{where.revision}",
            "fetch_seconds": time.monotonic() - began,
            "bytes": size,
            "bytes_per_holder": {},
            "dropped": {},
            "peers_error": reason,
        }

    async def archive(self, round_: int, manifest: CID) -> HubRevision | None:
        """With ``--hf-repo``: upload the checkpoint; a Hub failure is logged, never fatal.

        The swarm does not need the Hub (peers serve checkpoints); a checkpoint without its Hub
        copy only loses the fallback for joiners that find no peer.
        """
        if self.hf_repo is None or self.login is None:
            return None
        repo = self.hf_repo
        began = time.monotonic()
        try:
            where = await trio.to_thread.run_sync(
                partial(
                    upload_checkpoint,
                    self.trainer.store,
                    manifest,
                    repo=repo,
                    token=self.login.token,
                    message=f"cnode run {self.run} round {round_}: {manifest}",
                    workdir=self.workdir,
                )
            )
        except HubError as exc:
            log.warning("hub_upload_failed", round=round_, repo=repo, error=str(exc))
            self.reporter.event(Event.HUB_UPLOAD_FAILED, round=round_, repo=repo, error=str(exc))
            return None
        self.reporter.event(
            Event.HUB_UPLOADED,
            round=round_,
            repo=repo,
            revision=where.revision,
            seconds=time.monotonic() - began,
        )
        return where
