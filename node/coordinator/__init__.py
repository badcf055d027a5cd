"""The coordinator: a run's single source of truth for members, rounds, checkpoints and bans.

It never touches model data. Its state lives in SQLite (WAL) and every read of it is signed by the
coordinator key; nodes pin that key's peer id in their run config. Spec: specs/coordinator.md.

This package is the node side: :class:`CoordinatorClient` (async, trio or asyncio),
:class:`SyncCoordinatorClient` (CLI), the signed messages and the run config. The server side
(:class:`CoordinatorServer`, :class:`CoordinatorProcess`, the state machine and SQLite) is
:mod:`cnode.node.coordinator.server`, which a training node never imports.
"""

from . import limits as limits
from ._bans._verdicts import PartitionVerdict as PartitionVerdict
from ._bans._verdicts import ReputationVerdict as ReputationVerdict
from ._client._client import CoordinatorClient as CoordinatorClient
from ._client._client import verify_state_envelope as verify_state_envelope
from ._client._sync_client import SyncCoordinatorClient as SyncCoordinatorClient
from ._codes import ERRORS as ERRORS
from ._codes import ErrorCode as ErrorCode
from ._codes import ErrorInfo as ErrorInfo
from ._config import AccessConfig as AccessConfig
from ._config import NetworkConfig as NetworkConfig
from ._config import RoundsConfig as RoundsConfig
from ._config import RunConfig as RunConfig
from ._config import load_run_config as load_run_config
from ._exceptions import BadRunState as BadRunState
from ._exceptions import CoordinatorError as CoordinatorError
from ._exceptions import CoordinatorRejected as CoordinatorRejected
from ._exceptions import CoordinatorUnavailable as CoordinatorUnavailable
from ._exceptions import RateLimited as RateLimited
from ._exceptions import RequestRefused as RequestRefused
from ._exceptions import RunConfigError as RunConfigError
from ._gossip import run_state_topic as run_state_topic
from ._gossip import run_state_validator as run_state_validator
from ._http._addrs import AddressError as AddressError
from ._http._addrs import check_peer_addrs as check_peer_addrs
from ._http._addrs import is_private_addr as is_private_addr
from ._http._addrs import parse_peer_addr as parse_peer_addr
from ._wire._admin import AllowKind as AllowKind
from ._wire._ban_records import BanKind as BanKind
from ._wire._ban_records import BanRecord as BanRecord
from ._wire._ban_records import BanReport as BanReport
from ._wire._protocol import PEER_ONLY_USERNAME as PEER_ONLY_USERNAME
from ._wire._protocol import REQUEST_TYPE as REQUEST_TYPE
from ._wire._protocol import STATE_TYPE as STATE_TYPE
from ._wire._protocol import CatchUpSource as CatchUpSource
from ._wire._protocol import CheckpointRecord as CheckpointRecord
from ._wire._protocol import JoinResult as JoinResult
from ._wire._protocol import PartitionResultEntry as PartitionResultEntry
from ._wire._protocol import Phase as Phase
from ._wire._protocol import ReportKind as ReportKind
from ._wire._protocol import RoundInfo as RoundInfo
from ._wire._protocol import RoundStatus as RoundStatus
from ._wire._protocol import RunState as RunState

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/node/coordinator/test_exports.py)
    "AccessConfig",
    "AddressError",
    "AllowKind",
    "BadRunState",
    "BanKind",
    "BanRecord",
    "BanReport",
    "CatchUpSource",
    "CheckpointRecord",
    "CoordinatorClient",
    "CoordinatorError",
    "CoordinatorRejected",
    "CoordinatorUnavailable",
    "ERRORS",
    "ErrorCode",
    "ErrorInfo",
    "JoinResult",
    "NetworkConfig",
    "PEER_ONLY_USERNAME",
    "PartitionResultEntry",
    "PartitionVerdict",
    "Phase",
    "REQUEST_TYPE",
    "RateLimited",
    "ReportKind",
    "ReputationVerdict",
    "RequestRefused",
    "RoundInfo",
    "RoundStatus",
    "RoundsConfig",
    "RunConfig",
    "RunConfigError",
    "RunState",
    "STATE_TYPE",
    "SyncCoordinatorClient",
    "check_peer_addrs",
    "is_private_addr",
    "load_run_config",
    "parse_peer_addr",
    "run_state_topic",
    "run_state_validator",
    "verify_state_envelope",
]
