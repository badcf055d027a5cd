"""Defect 17 of py-libp2p 0.8.1 (the list is in this package's ``__init__``): a malformed
pubsub frame from any peer kills the host.

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

from libp2p.abc import IHost
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub

from ._host import guard_handler

__all__ = ["guard_pubsub_handlers"]


def guard_pubsub_handlers(host: IHost, pubsub: Pubsub, router: GossipSub) -> None:
    """Guard the stream handler ``Pubsub.__init__`` set for each of ``router``'s protocols."""
    for protocol in router.get_protocols():
        host.set_stream_handler(protocol, guard_handler(str(protocol), pubsub.stream_handler))
