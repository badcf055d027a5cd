"""``cnode coordinator serve`` and ``cnode coordinator new-run``.

See specs/coordinator.md. ``serve`` runs the aiohttp server in this process until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
import tomli_w

from cnode.auth import Identity, load_identity, save_identity
from cnode.node._exceptions import UsageError
from cnode.node._logging import bind_context
from cnode.node._new_run import NEW_RUN_CODEC, new_run_training
from cnode.node.coordinator import (
    AccessConfig,
    NetworkConfig,
    PartitionVerdict,
    ReputationVerdict,
    RoundsConfig,
    RunConfig,
    load_run_config,
)
from cnode.node.coordinator.server import (
    BadEvidence,
    CoordinatorServer,
    ServeSettings,
    StateGossip,
)
from cnode.node.p2p import P2PSettings

log = structlog.get_logger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "coordinator",
        help="serve a run's coordinator, or write a new run config",
        description="The coordinator of a run: members, rounds, checkpoints and bans.",
    )
    sub = parser.add_subparsers(dest="coordinator_command", metavar="ACTION", required=True)
    _register_serve(sub)
    _register_new_run(sub)


def _register_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cnode coordinator serve``."""
    serve = sub.add_parser("serve", help="serve the coordinator HTTP API of one run")
    serve.add_argument("--run-config", type=Path, required=True, help="run config TOML file")
    serve.add_argument("--db", type=Path, required=True, help="SQLite state file (created)")
    serve.add_argument(
        "--key",
        type=Path,
        required=True,
        help="coordinator key file (created, mode 0600, if missing)",
    )
    serve.add_argument("--listen", default="127.0.0.1:8470", help="HOST:PORT (PORT 0 = any)")
    serve.add_argument(
        "--hf-endpoint",
        default=None,
        help="Hugging Face Hub URL for whoami (default: $HF_ENDPOINT or the Hub)",
    )
    serve.add_argument(
        "--p2p-listen",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="also publish the signed run state on the run's gossipsub topic from a libp2p "
        "node listening here (e.g. /ip4/0.0.0.0/tcp/4010)",
    )
    serve.add_argument(
        "--p2p-bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="peers the gossip node dials at start",
    )
    serve.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help="write {url, peer_id, run, pid, p2p_addrs} as JSON here once listening",
    )
    serve.set_defaults(handler=_serve)


def _register_new_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cnode coordinator new-run``."""
    new = sub.add_parser("new-run", help="write a run config pinning this coordinator's key")
    new.add_argument("run", help="run id")
    new.add_argument("--key", type=Path, required=True, help="coordinator key file (created)")
    new.add_argument("--out", type=Path, required=True, help="run config file to write")
    new.add_argument("--url", default="http://127.0.0.1:8470", help="where nodes reach it")
    new.add_argument("--min-participants", type=int, default=1)
    new.add_argument("--round-timeout", type=float, default=60.0, help="seconds")
    new.add_argument("--checkpoint-every", type=int, default=0, help="rounds per epoch")
    new.add_argument(
        "--allow-private-addrs",
        action="store_true",
        help="accept private and loopback peer addresses (one machine, a LAN); off for the "
        "internet",
    )
    new.add_argument(
        "--update-codec",
        choices=("f32", "bf16", "int8-blockwise", "sparse-topk"),  # aggregation.CODECS, no torch
        default=NEW_RUN_CODEC,
        help="how updates travel: training.update_codec (default sparse-topk: the largest 1/64 "
        "of each chunk, 2 bits each, 0.0074x f32, with error_decay 0.95; "
        "int8-blockwise: 0.25x f32)",
    )
    new.add_argument(
        "--update-density",
        type=float,
        default=None,
        help="sparse-topk only: training.update_density, the share of values sent (default 1/64)",
    )
    new.add_argument(
        "--partitioned",
        choices=("auto", "always", "never"),  # cnode.node.coordinator PARTITIONED_MODES
        default="auto",
        help="training.partitioned: partitioned rounds from 3 members (auto), whenever there "
        "is a member (always), or full replication (never)",
    )
    new.add_argument("--peer", action="append", default=[], help="allowlist a peer id")
    new.add_argument("--user", action="append", default=[], help="allowlist an HF username")
    new.add_argument("--org", action="append", default=[], help="allowlist an HF org")
    new.set_defaults(handler=_new_run)


def key_identity(path: Path) -> Identity:
    """Load the coordinator key, creating it (0600) on first use."""
    if not path.exists():
        identity = Identity.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        save_identity(identity, path)
        log.info("coordinator_key_created", path=str(path), peer=identity.peer_id_str)
        return identity
    return load_identity(path)


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--listen must be HOST:PORT, got {text!r}")
    return host, int(port)


def check_evidence(
    car: bytes,
    header: str,
    *,
    run: str,
    round_: int,
    partition: int,
    training: Mapping[str, Any],
) -> PartitionVerdict:
    """The coordinator's evidence checker: the training package's recomputation of one
    partition (imported on first use: it pulls torch), its evidence errors as BadEvidence."""
    from cnode.node.train import PartitionEvidenceError, check_partition_evidence

    try:
        verdict: PartitionVerdict = check_partition_evidence(
            car, header, run=run, round_=round_, partition=partition, training=training
        )
    except PartitionEvidenceError as exc:
        raise BadEvidence(str(exc)) from exc
    return verdict


def check_reputation(
    rounds: Sequence[tuple[int, Mapping[str, str], Mapping[str, bytes]]],
    *,
    run: str,
    accused: str,
    round_: int,
    figures: str,
) -> ReputationVerdict:
    """The coordinator's reputation checker: the training package's replay of the score
    records (imported on first use: the training package pulls torch)."""
    from cnode.node.train import check_reputation_evidence

    verdict: ReputationVerdict = check_reputation_evidence(
        rounds, run=run, accused=accused, round_=round_, figures=figures
    )
    return verdict


def _serve(args: argparse.Namespace) -> int:
    config = load_run_config(args.run_config)
    host, port = _listen(args.listen)
    identity = key_identity(args.key)
    bind_context(peer=identity.peer_id_str, run=config.run)  # every line names this coordinator
    settings = ServeSettings(
        config=config,
        db=args.db,
        identity=identity,
        host=host,
        port=port,
        hf_endpoint=args.hf_endpoint,
        evidence_checker=check_evidence,
        reputation_checker=check_reputation,
    )
    p2p = None
    if args.p2p_listen:
        p2p = P2PSettings(listen=tuple(args.p2p_listen), bootstrap=tuple(args.p2p_bootstrap))
    asyncio.run(_serve_until_signal(settings, args.ready_file, p2p))
    return 0


async def _serve_until_signal(
    settings: ServeSettings, ready_file: Path | None, p2p: P2PSettings | None
) -> None:
    if p2p is None:
        await _serve_http(settings, ready_file, None)
        return
    blocks = settings.db.with_name(settings.db.name + ".p2p-blocks")
    async with StateGossip(settings.identity, settings.config.run, p2p, blocks) as gossip:
        await _serve_http(settings, ready_file, gossip)


async def _serve_http(
    settings: ServeSettings, ready_file: Path | None, gossip: StateGossip | None
) -> None:
    server = CoordinatorServer(settings, gossip=gossip)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await server.start()
        info = {
            "url": url,
            "peer_id": server.peer_id,
            "run": server.run,
            "pid": os.getpid(),
            "p2p_addrs": gossip.addrs if gossip is not None else [],
        }
        print(json.dumps(info), flush=True)
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, ready_file)
        await stop.wait()
    finally:
        await server.stop()
        log.info("coordinator_stopped")


def _new_run(args: argparse.Namespace) -> int:
    density = args.update_density
    if density is not None and (args.update_codec != "sparse-topk" or not 0 < density <= 1):
        print(
            "error: --update-density must be in (0, 1] and goes with --update-codec sparse-topk",
            file=sys.stderr,
        )
        return 2
    identity = key_identity(args.key)
    bind_context(peer=identity.peer_id_str, run=args.run)
    config = RunConfig(
        run=args.run,
        coordinator=identity.peer_id_str,
        url=args.url,
        rounds=RoundsConfig(
            min_participants=args.min_participants,
            round_timeout_s=args.round_timeout,
            checkpoint_every=args.checkpoint_every,
        ),
        access=AccessConfig(users=args.user, peers=args.peer, orgs=args.org),
        network=NetworkConfig(allow_private_addrs=args.allow_private_addrs),
        training={
            **new_run_training(args.update_codec),
            "partitioned": args.partitioned,
            **({} if args.update_density is None else {"update_density": args.update_density}),
        },
    )
    config.check()
    args.out.write_text(tomli_w.dumps(config.to_dict()), encoding="utf-8")
    print(f"wrote {args.out}: run {config.run}, coordinator {identity.peer_id_str}")
    return 0
