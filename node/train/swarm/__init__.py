"""The node's view of the swarm: its peers and their addresses, the run's gossip topics and the
update headers on them, the bans, leaving a round, the optional HTTP gateway, the dashboard
reports and the node's Prometheus metrics.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._bans import KnownBans as KnownBans
from ._gateway import maybe_gateway as maybe_gateway
from ._headers import HeaderCollector as HeaderCollector
from ._membership import leave_round as leave_round
from ._metrics import NodeMetrics as NodeMetrics
from ._metrics import serve_metrics as serve_metrics
from ._peers import PeerFinder as PeerFinder
from ._peers import advertised_addrs as advertised_addrs
from ._reachability import check_round_reachable as check_round_reachable
from ._reachability import note_reachability as note_reachability
from ._reachability import say_reachability as say_reachability
from ._telemetry import catch_up_report as catch_up_report
from ._telemetry import round_report as round_report
from ._telemetry import send_report as send_report
from ._topics import RunTopics as RunTopics
from ._topics import updates_topic as updates_topic
