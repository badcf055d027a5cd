"""The run config file (TOML) the coordinator serves and every node pins.

See specs/coordinator.md#run-config. The file is written once by whoever starts the run and given
to every node: it pins the coordinator's peer id, so a node can check every state it reads.
Everything in it is public (it is part of the signed run state).
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cnode.auth import PeerIdError, public_key_from_peer_id

from . import limits
from ._exceptions import RunConfigError

__all__ = [
    "PARTITIONED_MODES",
    "AccessConfig",
    "NetworkConfig",
    "RoundsConfig",
    "RunConfig",
    "load_run_config",
]

# training.partitioned: "auto" = partitioned when the published member list has at least
# PARTITIONED_AUTO_MEMBERS members, "always" = whenever it has one, "never" = full replication.
PARTITIONED_MODES = ("auto", "always", "never")
PARTITIONED_AUTO_MEMBERS = 3


@dataclass(frozen=True)
class RoundsConfig:
    """Round timing and phases (Psyche's WaitingForMembers → Warmup → Training ⇄ Cooldown)."""

    min_participants: int = 1  # a round's member list is published only with at least this many
    round_timeout_s: float = 60.0  # after the list closes, not-ready members are dropped at this
    warmup_s: float = 0.0  # once enough members are there, time for joiners to fetch the checkpoint
    cooldown_s: float = 60.0  # after an epoch's last round, time for a checkpoint to be submitted
    checkpoint_every: int = 0  # rounds per epoch; after each epoch comes Cooldown. 0 = no epochs
    # After a round's list is published, how long members have to fetch its updates and report
    # what they hold (op `collected`) before the round's input set is decided without the rest.
    collect_timeout_s: float = 90.0
    # Partitioned rounds: the shortest backup step. The aggregator of a partition has the first
    # step of the result window, then backup k may submit from window + (k + 1) steps
    # (k < MAX_PARTITION_BACKUPS); a step is longer when the round measured a slower swarm
    # (specs/coordinator.md#pace).
    backup_step_s: float = 15.0
    # Partitioned rounds: once every partition has a result, how long members have to recompute
    # their chosen partitions and report `checked` before the round is agreed without the rest.
    verify_timeout_s: float = 60.0
    # The most seconds past a nominal deadline (collect, verify; score records: at most
    # SCORE_CLOSE_MAX_S) that the pace rule keeps a phase open for members still missing.
    late_max_s: float = 60.0


@dataclass(frozen=True)
class AccessConfig:
    """Who may join and who may administer. The lists seed the allowlist on first start only."""

    token_ttl_s: int = 900  # lifetime of an access token; clients re-join before it runs out
    users: list[str] = field(default_factory=list)  # allowed Hugging Face usernames
    peers: list[str] = field(default_factory=list)  # allowed peer ids (no HF account needed)
    orgs: list[str] = field(default_factory=list)  # any member of these HF orgs may join
    admins: list[str] = field(default_factory=list)  # peer ids besides the coordinator's own key
    checkpointers: list[str] = field(default_factory=list)  # empty = any member of the round


@dataclass(frozen=True)
class NetworkConfig:
    """How peers find each other: the addresses the coordinator accepts and hands out."""

    # Accept private, loopback and link-local addresses in joins (one machine, a LAN, a test
    # bed). Off for a run on the internet: such addresses are unreachable for most peers and
    # tell strangers about the joiner's own network.
    allow_private_addrs: bool = False


@dataclass(frozen=True)
class RunConfig:
    """One run: its id, the pinned coordinator, rounds, access, and the opaque training table."""

    run: str  # run id, [A-Za-z0-9._-]{1,64}
    coordinator: str = ""  # the coordinator's peer id; `serve` fills it from --key when empty
    url: str = ""  # where nodes reach the coordinator (informational)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    training: dict[str, Any] = field(default_factory=dict)  # model, data, aggregator: node/train
    initial_checkpoint: str = ""  # manifest CID the run starts from (round 0); empty = none
    # Trustless HTTP gateways (specs/gateway.md) a joiner fetches a checkpoint from when peers
    # cannot serve it, before the Hub; http(s) URLs, at most MAX_RUN_GATEWAYS.
    gateways: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.gateways:
            del d["gateways"]  # a run without gateways keeps the bytes it had before the key
        if self.rounds.late_max_s == RoundsConfig.late_max_s:
            del d["rounds"]["late_max_s"]  # likewise a run at the default late bound
        return d

    def public_dict(self) -> dict[str, Any]:
        """The config as the signed run state carries it: without the allowlist seeds.

        They only seed the allowlist on first start (then it lives in the DB), and a run with
        thousands of allowed peers would otherwise put all of them into every state.
        """
        d = self.to_dict()
        for key in ("users", "peers", "orgs"):
            d["access"].pop(key)
        return d

    @property
    def partitioned(self) -> str:
        """The run's ``training.partitioned`` mode (one of the two training keys the coordinator
        reads, with ``scores``)."""
        return str(self.training.get("partitioned", "auto"))

    @property
    def scored(self) -> bool:
        """Whether members score updates (``training.scores``, on unless the run config says
        false: node/train's default). The coordinator reads it for one thing: a partitioned
        round's result window waits for the score records to close (specs/coordinator.md#pace).
        """
        return self.training.get("scores", True) is not False

    def partition_rounds(self, members: int) -> bool:
        """Whether a round published with ``members`` members is partitioned."""
        mode = self.partitioned
        least = {"auto": PARTITIONED_AUTO_MEMBERS, "always": 1}.get(mode)
        return least is not None and members >= least

    @classmethod
    def from_dict(cls, raw: Any) -> RunConfig:
        """Build and check; raise :class:`RunConfigError` naming the bad setting."""
        if not isinstance(raw, dict):
            raise RunConfigError("run config must be a table")
        raw = dict(raw)
        rounds = _build(RoundsConfig, raw.pop("rounds", {}), "rounds")
        access = _build(AccessConfig, raw.pop("access", {}), "access")
        network = _build(NetworkConfig, raw.pop("network", {}), "network")
        training = raw.pop("training", {})
        if not isinstance(training, dict):
            raise RunConfigError("[training] must be a table")
        config = _build(
            cls,
            raw,
            "run config",
            rounds=rounds,
            access=access,
            network=network,
            training=training,
        )
        config.check()
        return config

    def check(self) -> None:
        run = self.run
        if not (0 < len(run) <= 64 and all(c.isalnum() or c in "._-" for c in run)):
            raise RunConfigError(f"run id {run!r} must be 1-64 characters of [A-Za-z0-9._-]")
        if self.coordinator:
            try:
                public_key_from_peer_id(self.coordinator)
            except PeerIdError as exc:
                raise RunConfigError(f"coordinator: {exc}") from exc
        where = urlsplit(self.url)
        if self.url and (where.scheme not in ("http", "https") or not where.netloc):
            raise RunConfigError(f"url {self.url[:100]!r} is not an http(s) URL")
        r = self.rounds
        if r.min_participants < 1:
            raise RunConfigError("rounds.min_participants must be >= 1")
        if not 0 < r.round_timeout_s <= limits.MAX_ROUND_TIMEOUT_S:
            raise RunConfigError(
                f"rounds.round_timeout_s must be in (0, {limits.MAX_ROUND_TIMEOUT_S}]"
            )
        if not 0 < r.collect_timeout_s <= limits.MAX_ROUND_TIMEOUT_S:
            raise RunConfigError(
                f"rounds.collect_timeout_s must be in (0, {limits.MAX_ROUND_TIMEOUT_S}]"
            )
        for name in ("backup_step_s", "verify_timeout_s", "late_max_s"):
            if not 0 < getattr(r, name) <= limits.MAX_ROUND_TIMEOUT_S:
                raise RunConfigError(f"rounds.{name} must be in (0, {limits.MAX_ROUND_TIMEOUT_S}]")
        mode = self.training.get("partitioned", "auto")
        if mode not in PARTITIONED_MODES:
            raise RunConfigError(
                f"training.partitioned must be one of {', '.join(PARTITIONED_MODES)}, got {mode!r}"
            )
        if not isinstance(self.training.get("scores", True), bool):
            raise RunConfigError(
                f"training.scores must be true or false, got {self.training['scores']!r}"
            )
        if r.warmup_s < 0 or r.cooldown_s < 0 or r.checkpoint_every < 0:
            raise RunConfigError("rounds.warmup_s, cooldown_s and checkpoint_every must be >= 0")
        if len(self.gateways) > limits.MAX_RUN_GATEWAYS:
            raise RunConfigError(f"gateways: at most {limits.MAX_RUN_GATEWAYS} URLs")
        for url in self.gateways:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
                raise RunConfigError(f"gateways: {url!r} is not an http(s) URL")
        ttl = self.access.token_ttl_s
        if not limits.MIN_TOKEN_TTL_S <= ttl <= limits.MAX_TOKEN_TTL_S:
            raise RunConfigError(
                f"access.token_ttl_s must be in "
                f"[{limits.MIN_TOKEN_TTL_S}, {limits.MAX_TOKEN_TTL_S}]"
            )


def _build(cls: type, raw: Any, where: str, **given: Any) -> Any:
    if not isinstance(raw, dict):
        raise RunConfigError(f"[{where}] must be a table")
    known = {f.name for f in fields(cls)} - set(given)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RunConfigError(f"[{where}]: unknown setting(s) {', '.join(unknown)}")
    if "run" in known and "run" not in raw:
        raise RunConfigError('run config needs `run = "<run id>"`')
    defaults = cls(**given, **({"run": "x"} if "run" in known else {}))
    values = dict(raw)
    for key, value in raw.items():
        want = type(getattr(defaults, key))
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, values[key] = True, float(value)
        if want is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not ok:
            raise RunConfigError(f"[{where}] {key} must be {want.__name__}, got {value!r}")
    return cls(**given, **values)


def load_run_config(path: Path) -> RunConfig:
    """Read a run config TOML file; raise :class:`RunConfigError` with the file name if bad."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RunConfigError(f"cannot read run config {path}: {exc}") from exc
    try:
        return RunConfig.from_dict(raw)
    except RunConfigError as exc:
        raise RunConfigError(f"{path}: {exc}") from exc
