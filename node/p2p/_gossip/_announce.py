"""Signed announcements on one gossipsub topic per run (specs/announce.md).

An announcement is an auth envelope (payload type ``cnode/announce/v1``) saying "I hold manifest
X (all blocks, or these layers)", "I hold update U for round r", or "I am leaving". The topic
validator (:class:`EnvelopeValidator`) drops anything oversized, unsigned or badly signed,
malformed, replayed, from a signer other than the publisher, or from a peer not on the
allowlist, and logs why. :class:`HolderTable` keeps, per CID, who said they hold it.
"""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from cnode.auth import EnvelopeError, Opened, ReplayError, ReplayGuard, open_envelope
from cnode.storage import CID, InvalidCIDError

from .. import limits
from .._exceptions import RejectedMessage

log = structlog.get_logger(__name__)

PAYLOAD_TYPE = "cnode/announce/v1"


def announce_topic(run: str) -> str:
    """The gossipsub topic of run ``run``'s announcements."""
    return f"/cnode/run/{run}/announce/1"


class AnnounceKind(enum.StrEnum):
    """What an announcement says (specs/announce.md#messages)."""

    HOLD = "hold"  # I hold manifest `cid` (all its blocks, or only `layers`)
    UPDATE = "update"  # I hold update `cid` for round `round`
    DEPARTURE = "departure"  # I am leaving: forget me as a holder


@dataclass(frozen=True)
class Announcement:
    """The payload of a ``cnode/announce/v1`` envelope."""

    run: str  # the run id; announcements of other runs are dropped
    kind: AnnounceKind
    counter: int  # strictly increasing per signer and run (replay protection)
    at: int  # signer's clock, unix seconds; more than MAX_ANNOUNCE_SKEW_S off is dropped
    cid: CID | None = None  # HOLD/UPDATE: the manifest's CID; DEPARTURE: absent
    layers: tuple[str, ...] | None = None  # HOLD: only these layers; None = every block
    round: int | None = None  # UPDATE: the round the update belongs to

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "run": self.run,
            "kind": str(self.kind),
            "counter": self.counter,
            "at": self.at,
        }
        if self.cid is not None:
            payload["cid"] = str(self.cid)
        if self.layers is not None:
            payload["layers"] = list(self.layers)
        if self.round is not None:
            payload["round"] = self.round
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Announcement:
        """Decode and check the schema; RejectedMessage("malformed: ...") on any fault."""
        allowed = {"run", "kind", "counter", "at", "cid", "layers", "round"}
        extra = set(payload) - allowed
        if extra:
            raise RejectedMessage(f"malformed: unknown fields {sorted(extra)}")
        run, counter, at = payload.get("run"), payload.get("counter"), payload.get("at")
        if not isinstance(run, str) or not 0 < len(run) <= limits.MAX_ANNOUNCE_STRING:
            raise RejectedMessage("malformed: run must be a short string")
        if type(counter) is not int or counter < 0 or type(at) is not int:
            raise RejectedMessage("malformed: counter and at must be integers")
        try:
            kind = AnnounceKind(str(payload.get("kind")))
        except ValueError as exc:
            raise RejectedMessage(f"malformed: unknown kind {payload.get('kind')!r}") from exc
        cid = None
        if kind is not AnnounceKind.DEPARTURE:
            text = payload.get("cid")
            if not isinstance(text, str):
                raise RejectedMessage(f"malformed: {kind} needs a cid")
            try:
                cid = CID.parse(text)
            except InvalidCIDError as exc:
                raise RejectedMessage(f"malformed: {exc}") from exc
        layers = payload.get("layers")
        if layers is not None:
            if kind is not AnnounceKind.HOLD or not isinstance(layers, list):
                raise RejectedMessage("malformed: layers only in hold, as a list")
            if len(layers) > limits.MAX_ANNOUNCED_LAYERS or not all(
                isinstance(n, str) and len(n) <= limits.MAX_ANNOUNCE_STRING for n in layers
            ):
                raise RejectedMessage("malformed: too many or bad layer names")
            layers = tuple(layers)
        rnd = payload.get("round")
        if (kind is AnnounceKind.UPDATE) != (type(rnd) is int) or (rnd is not None and rnd < 0):
            raise RejectedMessage("malformed: round belongs to update, as an integer >= 0")
        return cls(run, kind, counter, at, cid, layers, rnd)


# Validator check: given the opened envelope, None to accept or a reason to drop.
Check = Callable[[Opened], str | None]


class EnvelopeValidator:
    """Validates pubsub messages carrying auth envelopes; one instance per subscribed topic.

    Args:
        payload_type: the only envelope type accepted.
        allow: ``allow(signer) -> bool``, the allowlist.
        replay: if given, payloads must carry ``run`` (str) and ``counter`` (int), and a counter
            not above the signer's last one is a replay.
        check: extra payload check returning a reason to drop, or None.

    :meth:`validate` raises RejectedMessage with the reason; the node logs it and drops.
    """

    def __init__(
        self,
        payload_type: str,
        *,
        allow: Callable[[str], bool],
        replay: ReplayGuard | None = None,
        check: Check | None = None,
    ) -> None:
        self.payload_type = payload_type
        self.allow = allow
        self.replay = replay
        self.check = check

    def validate(self, data: bytes, source: str) -> Opened:
        if len(data) > limits.MAX_ANNOUNCEMENT_SIZE:
            raise RejectedMessage(f"oversized: {len(data)} bytes > MAX_ANNOUNCEMENT_SIZE")
        try:
            opened = open_envelope(data, expected_type=self.payload_type)
        except EnvelopeError as exc:
            raise RejectedMessage(f"bad envelope: {type(exc).__name__}: {exc}") from exc
        if opened.signer != source:
            raise RejectedMessage("signer is not the publisher")
        if not self.allow(opened.signer):
            raise RejectedMessage("signer is not on the allowlist")
        if self.check is not None:
            reason = self.check(opened)
            if reason is not None:
                raise RejectedMessage(reason)
        if self.replay is not None:
            run, counter = opened.payload.get("run"), opened.payload.get("counter")
            if not isinstance(run, str) or type(counter) is not int:
                raise RejectedMessage("malformed: no run/counter for replay protection")
            try:
                self.replay.check(opened.signer, run, counter)
            except ReplayError as exc:
                raise RejectedMessage(f"replayed: {exc}") from exc
        return opened


def announcement_validator(
    run: str, allow: Callable[[str], bool], clock: Callable[[], float] = time.time
) -> EnvelopeValidator:
    """The validator of run ``run``'s announcement topic."""

    def check(opened: Opened) -> str | None:
        try:
            ann = Announcement.from_payload(opened.payload)
        except RejectedMessage as exc:
            return str(exc)
        if ann.run != run:
            return f"wrong run {ann.run!r}"
        if abs(ann.at - clock()) > limits.MAX_ANNOUNCE_SKEW_S:
            return "stale or future timestamp"
        return None

    return EnvelopeValidator(PAYLOAD_TYPE, allow=allow, replay=ReplayGuard(), check=check)


class HolderTable:
    """Who holds which CID, from announcements; bounded (oldest CIDs forgotten first).

    A ``hold`` without ``layers`` (and every ``update``) makes its signer a holder of every
    block of the CID; a ``hold`` with ``layers`` makes it a holder of those layers only
    (specs/announce.md#interaction, step 7). A signer's latest announcement for a CID replaces
    its earlier one. :meth:`holders` lists full holders only, unless asked about one layer.
    """

    def __init__(self) -> None:
        # cid -> {peer: the layers it named, or None for every block}
        self._by_cid: collections.OrderedDict[CID, dict[str, frozenset[str] | None]] = (
            collections.OrderedDict()
        )

    def apply(self, signer: str, ann: Announcement) -> None:
        if ann.kind is AnnounceKind.DEPARTURE:
            self.forget(signer)
            return
        assert ann.cid is not None  # checked by from_payload
        self.add(signer, ann.cid, None if ann.layers is None else frozenset(ann.layers))

    def add(self, peer: str, cid: CID, layers: frozenset[str] | None) -> None:
        """Record ``peer`` as a holder of ``cid`` (of ``layers`` only, unless None)."""
        peers = self._by_cid.setdefault(cid, {})
        self._by_cid.move_to_end(cid)
        if peer in peers or len(peers) < limits.MAX_HOLDERS_PER_CID:
            peers[peer] = layers
        while len(self._by_cid) > limits.MAX_HOLDER_TABLE_CIDS:
            self._by_cid.popitem(last=False)

    def forget(self, peer: str) -> None:
        for peers in self._by_cid.values():
            peers.pop(peer, None)

    def holders(self, cid: CID, layer: str | None = None) -> set[str]:
        """Peers that hold every block of ``cid``; with ``layer``, also those that hold that
        layer of it (partial holders naming it)."""
        return {
            peer
            for peer, layers in self._by_cid.get(cid, {}).items()
            if layers is None or (layer is not None and layer in layers)
        }

    def announced(self, cid: CID) -> dict[str, frozenset[str] | None]:
        """Every peer that announced ``cid``, with the layers it named (None: all of them)."""
        return dict(self._by_cid.get(cid, {}))
