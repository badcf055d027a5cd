"""``cnode train --run RUN``: join a run and train round after round.

``--attack KIND`` is a TESTING AID ONLY: it makes this node misbehave (send what the attack
harness makes of its honest update) so the swarm's defences can be watched at work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cnode.node._config import NodeConfig, default_home, load_config
from cnode.node._exceptions import UsageError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "train",
        help="join a run and train round after round",
        description=(
            "Join run RUN through its coordinator, catch up from the current checkpoint "
            "(fetched from peers, every block verified), then train: each round train locally, "
            "publish the signed update, fetch the other members' updates, aggregate, apply."
        ),
    )
    _add_joining_arguments(parser)
    _add_serving_arguments(parser)
    parser.set_defaults(handler=_handle)


def _add_joining_arguments(parser: argparse.ArgumentParser) -> None:
    """Which run, through which coordinator and addresses, for how long, and the checkpoints."""
    parser.add_argument("--run", required=True, help="the run id (must match the run config)")
    parser.add_argument(
        "--run-config",
        required=True,
        type=Path,
        metavar="FILE",
        help="the run config TOML the run's author gave out (pins the coordinator's key)",
    )
    parser.add_argument("--home", type=Path, default=None, help="node home (default $CNODE_HOME)")
    parser.add_argument(
        "--coordinator",
        metavar="URL",
        help="coordinator URL (default: the run config's url, else config.toml's coordinator_url)",
    )
    parser.add_argument("--listen", metavar="MULTIADDR", help="libp2p listen address")
    parser.add_argument(
        "--announce-addr",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="advertise this address to the run instead of the listen address (behind a port "
        "mapping: /ip4/PUBLIC_IP/tcp/PORT); repeatable",
    )
    parser.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="an extra peer to dial (not needed: the coordinator names the run's peers)",
    )
    parser.add_argument(
        "--rounds", type=int, default=0, help="stop after this round of the run (0 = never)"
    )
    parser.add_argument(
        "--checkpointer", action="store_true", help="submit checkpoints to the coordinator"
    )
    parser.add_argument(
        "--join-after-round",
        type=int,
        default=0,
        metavar="N",
        help="stay out of the run until round N is published, then join (a late joiner)",
    )
    parser.add_argument(
        "--hf-repo",
        metavar="REPO",
        help="with --checkpointer: also upload each checkpoint to this Hugging Face model repo "
        "(created if absent; needs cnode init --hf-login; $HF_ENDPOINT picks the Hub)",
    )


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """What the node serves besides the run (gateway, metrics), where it computes, its report,
    and the testing aid."""
    parser.add_argument(
        "--gateway",
        metavar="HOST:PORT",
        help="also serve every block this node holds as a trustless HTTP gateway "
        "(specs/gateway.md); it is open to anyone who reaches it, outside the run's admission",
    )
    parser.add_argument(
        "--fetch-gateway",
        action="append",
        default=[],
        metavar="URL",
        help="trustless gateway to fetch a checkpoint from when peers cannot (before the Hub; "
        "repeatable)",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (rounds, phase seconds, "
        "bytes by peer, updates left out, bans; specs/training.md#metrics); port 0 picks one",
    )
    parser.add_argument(
        "--device",
        metavar="DEVICE",
        help="where local steps run: auto (a GPU when torch sees one, else the CPU), cpu, cuda, "
        "cuda:N or mps (default: config.toml's device, else auto). Aggregation, the state and "
        "its CIDs stay on the CPU whatever this says",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16-mixed"),
        help="local steps' precision (default: config.toml's precision, else the run's "
        "training.precision); bf16-mixed autocasts forward and backward, weights stay float32",
    )
    parser.add_argument("--report", type=Path, metavar="FILE", help="append JSON-line events here")
    parser.add_argument(
        "--attack",
        metavar="KIND",
        help="TESTING AID ONLY: misbehave with attack KIND from the attack harness "
        "(sign_flip, gaussian, nan, ...), or train on corrupted data (flipped_tokens, "
        "shuffled_tokens; scored away with training.scores) to exercise detection and bans",
    )


def _handle(args: argparse.Namespace) -> int:
    import trio

    from cnode import CnodeError
    from cnode.node.train import NodeStopped, TrainSettings, run_node, stop_reason_of

    home = args.home or default_home()
    config = load_config(home)
    gateway, metrics = _checked_options(args, config)
    settings = TrainSettings(
        run=args.run,
        home=home,
        run_config=args.run_config,
        # --coordinator, else the run config's url, else the node config's coordinator_url
        coordinator_url=args.coordinator or "",
        default_coordinator_url=config.coordinator_url,
        listen=args.listen or config.listen,
        bootstrap=tuple(args.bootstrap or config.bootstrap),
        blocks_dir=config.blocks_dir(home),
        stop_after_round=args.rounds,
        checkpointer=args.checkpointer,
        attack=args.attack,
        report=args.report,
        upload_rate_bytes_per_s=config.upload_rate_bytes_per_s,
        join_after_round=args.join_after_round,
        hf_repo=args.hf_repo,
        announce_addrs=tuple(args.announce_addr),
        gateway=gateway,
        fetch_gateways=tuple(args.fetch_gateway),
        metrics=metrics,
        device=args.device or config.device,
        precision=args.precision or config.precision,
    )
    try:
        return trio.run(run_node, settings)
    except (CnodeError, OSError) as exc:
        # One reason of the closed set, its evidence, and its exit status
        # (specs/training.md#why-a-node-stops).
        reason = stop_reason_of(exc)
        evidence = exc.evidence if isinstance(exc, NodeStopped) else f"{type(exc).__name__}: {exc}"
        print(f"cnode: stopped ({reason.value}): {evidence}", file=sys.stderr)
        return reason.exit_code


def _checked_options(
    args: argparse.Namespace, config: NodeConfig
) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """Refuse bad options (UsageError naming the option) before anything starts; return the
    gateway's and the metrics' listen addresses (None: not served)."""
    from cnode.aggregation import ATTACKS
    from cnode.node.p2p import check_gateway_url
    from cnode.node.train import DATA_ATTACKS, NODE_ATTACKS

    if args.attack is not None:
        known = sorted([*ATTACKS, *NODE_ATTACKS, *DATA_ATTACKS])
        if args.attack not in known:
            raise UsageError(f"unknown attack {args.attack!r} (known: {', '.join(known)})")
        print(
            f"cnode: WARNING: --attack {args.attack} is a testing aid: this node will send "
            "poisoned updates and should be banned by the swarm",
            file=sys.stderr,
        )
    if args.hf_repo is not None and not args.checkpointer:
        raise UsageError("--hf-repo needs --checkpointer (checkpointers upload)")
    if args.rounds < 0 or args.join_after_round < 0:
        raise UsageError("--rounds and --join-after-round must be >= 0")
    from ._serve import upload_rate_problem

    problem = upload_rate_problem(config.upload_rate_bytes_per_s)
    if problem:
        raise UsageError(f"upload_rate_bytes_per_s (config.toml) {problem}")
    gateway = None
    if args.gateway is not None:
        from ._gateway import parse_host_port

        gateway = parse_host_port(args.gateway)
    metrics = None
    if args.metrics is not None:
        from ._gateway import parse_host_port

        metrics = parse_host_port(args.metrics, "--metrics")
    for url in args.fetch_gateway:
        try:
            check_gateway_url(url)
        except ValueError as exc:
            raise UsageError(f"--fetch-gateway: {exc}") from exc
    return gateway, metrics
