"""Defects 17 and 18 of py-libp2p 0.8.1 (the list is in this package's ``__init__``): a
malformed pubsub frame from any peer kills the host; a peer pruned from the mesh is grafted
again at once, which its side takes for a GRAFT flood.

``Pubsub.continuously_read_stream`` parses each length-prefixed frame with
``rpc_pb2.RPC.ParseFromString`` and catches only stream errors: a frame that is not a valid
protobuf (a peer's garbage, or a frame cut short when its sender is killed mid-write) raises
``DecodeError`` into the handler, and from there, as defect 3, into the swarm's nursery: the
whole node stops with an internal error. Found by bench/soak.py, where a joiner died so when a
member was killed with SIGKILL. :func:`guard_pubsub_handlers` registers pubsub's handler again,
for each of the router's protocols, through :func:`guard_handler`: the stream is
reset and logged, the node lives on, and the peer may open a new stream.
"""

from __future__ import annotations

from typing import Any

from libp2p.abc import IHost
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub

from ._host import guard_handler

__all__ = ["back_off_pruned_peers", "guard_pubsub_handlers", "keep_mesh_peers"]


def guard_pubsub_handlers(host: IHost, pubsub: Pubsub, router: GossipSub) -> None:
    """Guard the stream handler ``Pubsub.__init__`` set for each of ``router``'s protocols."""
    for protocol in router.get_protocols():
        host.set_stream_handler(protocol, guard_handler(str(protocol), pubsub.stream_handler))


def back_off_pruned_peers(router: GossipSub) -> None:
    """Defect 18: record a backoff for every peer the heartbeat prunes, as the gossipsub v1.1
    spec (and go-libp2p's ``prunePeer``) does.

    ``GossipSub.mesh_heartbeat`` prunes an oversubscribed mesh down to D without a backoff on
    our side, so a later heartbeat (the mesh under D_low again, a second after) may graft the
    very peer it just pruned; that peer recorded our PRUNE and calls any GRAFT within 10 s a
    flood ("GRAFT flood detected", 426 at 16 members), penalises us and prunes us back. With
    the backoff (``prune_back_off``) we graft other peers instead, and the mesh settles.
    """
    heartbeat = router.mesh_heartbeat

    def mesh_heartbeat() -> tuple[Any, Any]:
        to_graft, to_prune = heartbeat()
        for peer, topics in to_prune.items():
            for topic in topics:
                router._add_back_off(peer, topic, False)
        return to_graft, to_prune

    router.mesh_heartbeat = mesh_heartbeat  # type: ignore[method-assign]


def keep_mesh_peers(router: GossipSub) -> None:
    """Defect 25: no mesh peer swapped for a better-scored one at every heartbeat.

    ``GossipSub.heartbeat`` ends with ``_maintain_mesh_quality``, whose
    ``_consider_peer_replacement`` prunes the worst-scored mesh peer and grafts any subscriber
    outside the mesh scoring 0.1 more, every heartbeat and topic. No gossipsub spec has it (v1.1
    grafts opportunistically, every minute, and only when the mesh's median score is low). With
    a handful of messages a minute the mesh peers' delivery counters fall short and a newcomer
    outscores them: each swap is a PRUNE, a GRAFT, a backoff, and the pruned peer's GRAFTs
    refused as floods. Switched off, a 32-member node sent 112 GRAFTs and 74 PRUNEs a round
    instead of 141 and 94 (issue 41; the rest is not explained yet, specs/announce.md). The
    degree bounds of ``mesh_heartbeat`` keep the mesh as the spec does.
    """

    async def consider_peer_replacement(topic: str) -> None:
        return None

    router._consider_peer_replacement = consider_peer_replacement  # type: ignore[method-assign]
