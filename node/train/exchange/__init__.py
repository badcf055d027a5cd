"""The round's network exchange: the full-replication round's collect/report/agree, and the
partitioned round's aggregate, score, verify and assemble stages.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._fetch import MemberFetcher as MemberFetcher
from ._fetch import fetch_update_segments as fetch_update_segments
from ._full import UpdateExchange as UpdateExchange
from ._partitioned import PartitionedExchange as PartitionedExchange
from ._relay import Relay as Relay
