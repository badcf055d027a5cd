"""cnode.node.p2p: the libp2p host, block exchange, multi-holder fetch and announcements.

Protocols: ``/cnode/blocks/1.0.0`` and ``/cnode/admit/1.0.0`` (specs/blocks.md), signed
announcements over gossipsub (specs/announce.md), and the trustless HTTP gateway subset, served
and fetched from (specs/gateway.md). The py-libp2p 0.8.1 workarounds live in
``_defects/``; the asyncio bridge in ``_bridge.py``. Errors: ``_exceptions.py``.

Trio callers::

    async with open_p2p_node(identity, store, P2PSettings(), allow=allow) as node:
        await node.connect("/ip4/127.0.0.1/tcp/4001/p2p/12D3Koo...")
        report = await node.fetch(manifest_cid)
"""

from . import limits as limits
from ._blocks._admission import PeerAdmission as PeerAdmission
from ._blocks._wire import ADMIT_PROTOCOL_ID as ADMIT_PROTOCOL_ID
from ._blocks._wire import PROTOCOL_ID as BLOCKS_PROTOCOL_ID
from ._bridge import TrioPortal as TrioPortal
from ._bridge import trio_portal as trio_portal
from ._bucket import TokenBucket as TokenBucket
from ._defects import clean_group as unwrap_node_errors
from ._exceptions import AnnouncementError as AnnouncementError
from ._exceptions import BadBlockError as BadBlockError
from ._exceptions import DialError as DialError
from ._exceptions import FetchError as FetchError
from ._exceptions import FrameTooLargeError as FrameTooLargeError
from ._exceptions import ListenError as ListenError
from ._exceptions import NotAdmittedError as NotAdmittedError
from ._exceptions import P2PError as P2PError
from ._exceptions import PeerProtocolError as PeerProtocolError
from ._exceptions import RejectedMessage as RejectedMessage
from ._exceptions import RemoteRefusedError as RemoteRefusedError
from ._exceptions import StreamBroken as StreamBroken
from ._fetch._fetch_types import DirectHolder as DirectHolder
from ._fetch._fetch_types import FetchProgress as FetchProgress
from ._fetch._fetch_types import FetchReport as FetchReport
from ._fetch._gateway_client import GatewayHolder as GatewayHolder
from ._fetch._gateway_client import check_gateway_url as check_gateway_url
from ._fetch._gateway_client import gateway_client as gateway_client
from ._gateway import GatewayServer as GatewayServer
from ._gateway import RunningGateway as RunningGateway
from ._gateway import gateway_beside_trio as gateway_beside_trio
from ._gateway import start_gateway as start_gateway
from ._gossip._announce import PAYLOAD_TYPE as ANNOUNCE_PAYLOAD_TYPE
from ._gossip._announce import AnnounceKind as AnnounceKind
from ._gossip._announce import Announcement as Announcement
from ._gossip._announce import EnvelopeValidator as EnvelopeValidator
from ._gossip._announce import HolderTable as HolderTable
from ._gossip._announce import announce_topic as announce_topic
from ._gossip._announce import announcement_validator as announcement_validator
from ._gossip._subscription import Subscription as Subscription
from ._node import P2PNode as P2PNode
from ._open import open_p2p_node as open_p2p_node
from ._settings import P2PSettings as P2PSettings
from ._settings import check_peer_address as check_peer_address
from ._traffic import Traffic as Traffic
from ._traffic import fetch_purpose as fetch_purpose

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/node/p2p/test_exports.py)
    "ADMIT_PROTOCOL_ID",
    "ANNOUNCE_PAYLOAD_TYPE",
    "AnnounceKind",
    "Announcement",
    "AnnouncementError",
    "BLOCKS_PROTOCOL_ID",
    "BadBlockError",
    "DialError",
    "DirectHolder",
    "EnvelopeValidator",
    "FetchError",
    "FetchProgress",
    "FetchReport",
    "FrameTooLargeError",
    "GatewayHolder",
    "GatewayServer",
    "HolderTable",
    "ListenError",
    "NotAdmittedError",
    "P2PError",
    "P2PNode",
    "P2PSettings",
    "PeerAdmission",
    "PeerProtocolError",
    "RejectedMessage",
    "RemoteRefusedError",
    "RunningGateway",
    "StreamBroken",
    "Subscription",
    "TokenBucket",
    "Traffic",
    "TrioPortal",
    "announce_topic",
    "announcement_validator",
    "check_gateway_url",
    "check_peer_address",
    "fetch_purpose",
    "gateway_beside_trio",
    "gateway_client",
    "limits",
    "open_p2p_node",
    "start_gateway",
    "trio_portal",
    "unwrap_node_errors",
]
