"""One partition of a partitioned round without the network: aggregate it, sign its result,
recompute it, assemble the state, and the evidence that a result is wrong.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._evidence import build_partition_evidence as build_partition_evidence
from ._evidence import check_partition_evidence as check_partition_evidence
from ._evidence import model_numel as model_numel
from ._result import PARTITION_RESULT_TYPE as PARTITION_RESULT_TYPE
from ._result import PartitionResult as PartitionResult
from ._result import PartitionTask as PartitionTask
from ._result import aggregate_own_partition as aggregate_own_partition
from ._result import apply_partitions as apply_partitions
from ._result import envelope_type as envelope_type
from ._result import input_segments as input_segments
from ._result import open_partition_result as open_partition_result
from ._result import partition_result_cid as partition_result_cid
from ._result import recompute_partition as recompute_partition
from ._result import seal_partition_result as seal_partition_result
from ._result import state_numel as state_numel
from ._result import store_wrong_output as store_wrong_output
