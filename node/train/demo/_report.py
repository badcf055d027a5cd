"""The demo's closing report: every figure read from the nodes' event files and the coordinator."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from cnode.aggregation import EvidenceKind

from .._report import Ending, Event, read_report
from ._swarm import Role

if TYPE_CHECKING:
    from cnode.node.coordinator import BanRecord

    from ._swarm import DemoSettings, _Proc

__all__ = ["final_report"]


def _short(peer: str) -> str:
    return peer[-8:]


def _traffic_table(procs: list[_Proc], events: dict[str, list[dict[str, Any]]]) -> Table:
    """Bytes each node fetched and served per round, one row per round (partitioned rounds:
    about twice an update in, specs/training.md#partitioned-rounds)."""
    by_node = {
        p.name: {e["round"]: e for e in events[p.name] if e["event"] == Event.ROUND} for p in procs
    }
    rounds = sorted({r for seen in by_node.values() for r in seen})
    table = Table(title="round traffic: verified MB in/out per node (parts: 0 = full replication)")
    table.add_column("round", justify="right")
    table.add_column("parts", justify="right")
    for p in procs:
        table.add_column(p.name, justify="right")
    for r in rounds:
        parts = next((seen[r].get("parts") for seen in by_node.values() if r in seen), None)
        cells = []
        for p in procs:
            e = by_node[p.name].get(r)
            if e is None or e.get("bytes_in") is None:
                cells.append("—")
            else:
                cells.append(f"{e['bytes_in'] / 1e6:.2f}/{e.get('bytes_out', 0) / 1e6:.2f}")
        table.add_row(str(r), str(parts or 0), *cells)
    return table


def final_report(
    work: Path,
    procs: list[_Proc],
    coordinator_url: str,
    run_config: Path,
    settings: DemoSettings,
    console: Console,
) -> int:
    """Print the report; return 0 when the run did what the demo claims, else 1."""
    events = {p.name: read_report(p.report) for p in procs}
    problems: list[str] = []
    problems += _loss_section(procs, events, settings, console)
    problems += _late_joiner_section(procs, events, settings, console)
    bans = _coordinator_bans(coordinator_url, run_config)
    problems += _ban_section(procs, events, bans, console)
    problems += _final_states_section(procs, events, console)
    console.print(f"logs and event files: {work}")
    for problem in problems:
        console.print(f"[red]problem[/red]: {problem}")
    return 1 if problems else 0


Events = dict[str, list[dict[str, Any]]]


def _loss_section(
    procs: list[_Proc], events: Events, settings: DemoSettings, console: Console
) -> list[str]:
    """1. Loss per round, from the checkpointer (every honest node computes the same figure)."""
    first = procs[0]
    rounds = [e for e in events[first.name] if e["event"] == Event.ROUND]
    table = Table(
        title="held-out loss per round (honest-1; same state on every honest node; "
        f"update_codec {settings.codec})"
    )
    for col in ("round", "members", "loss", "train s", "publish s", "fetch s", "aggregate s"):
        table.add_column(col, justify="right")
    for e in rounds:
        table.add_row(
            str(e["round"]),
            str(len(e["members"])),
            f"{e['loss']:.4f}",
            f"{e['train_s']:.2f}",
            f"{e['publish_s']:.2f}",
            f"{e['fetch_s']:.2f}",
            f"{e['aggregate_s']:.2f}",
        )
    console.print(table)
    console.print(_traffic_table(procs, events))
    problems = []
    if len(rounds) >= 2 and not rounds[-1]["loss"] < rounds[0]["loss"]:
        problems.append("the held-out loss did not go down")
    if len(rounds) < settings.rounds:
        problems.append(f"honest-1 finished {len(rounds)} of {settings.rounds} rounds")
    return problems


def _late_joiner_section(
    procs: list[_Proc], events: Events, settings: DemoSettings, console: Console
) -> list[str]:
    """2. The late joiner's catch-up: from how many holders, how long, every block verified."""
    names = {p.peer: p.name for p in procs}
    late = next(p for p in procs if p.role is Role.LATE_JOINER)
    late_events = events[late.name]
    caught = [e for e in late_events if e["event"] == Event.CAUGHT_UP]
    if not caught:
        return ["the late joiner never caught up from a checkpoint"]
    joining = next((e for e in late_events if e["event"] == Event.JOINING), None)
    first_round = next((e for e in late_events if e["event"] == Event.ROUND), None)
    e = caught[0]
    console.print(
        f"late joiner {_short(late.peer)} joined after round {settings.late_after_round}: "
        f"fetched the checkpoint of round {e['round']} (manifest …{e['manifest'][-12:]}, "
        f"{e['bytes']:,} bytes) in {e['fetch_seconds']:.2f} s from "
        f"{sum(1 for n in e['bytes_per_holder'].values() if n)} holders, every block "
        f"verified against its CID"
    )
    if joining is not None and first_round is not None:
        console.print(
            f"  from joining to its first aggregated round ({first_round['round']}): "
            f"{first_round['t'] - joining['t']:.1f} s; waiting for and fetching the "
            f"checkpoint: {e['seconds']:.2f} s"
        )
    per = Table(title="bytes the late joiner fetched from each holder")
    per.add_column("holder")
    per.add_column("bytes", justify="right")
    for holder, nbytes in sorted(e["bytes_per_holder"].items(), key=lambda kv: -kv[1]):
        per.add_row(f"{names.get(holder, '?')} (…{_short(holder)})", f"{nbytes:,}")
    console.print(per)
    return []


def _ban_section(
    procs: list[_Proc], events: Events, bans: list[BanRecord], console: Console
) -> list[str]:
    """3. The ban, with its kind and evidence (the honest nodes' reports and the coordinator's
    signed state)."""
    names = {p.peer: p.name for p in procs}
    attacker = next(p for p in procs if p.role is Role.ATTACKER)
    reported = [
        (name, e) for name, evs in events.items() for e in evs if e["event"] == Event.BAN_REPORTED
    ]
    against_attacker = [(n, e) for n, e in reported if e["accused"] == attacker.peer]
    against_honest = [(n, e) for n, e in reported if e["accused"] != attacker.peer]
    problems = []
    ban = next((b for b in bans if b.peer == attacker.peer), None)
    if ban is not None:
        console.print(
            f"[bold]ban[/bold] ({ban.kind}): attacker {_short(attacker.peer)} banned for round "
            f"{ban.round}, {ban.decided_by(names)}: {ban.reason}"
        )
    else:
        problems.append("the attacker was not banned by the coordinator")
    reporters = sorted({name for name, _ in against_attacker})
    for name, e in against_attacker[:1]:
        console.print(f"evidence (reported by {', '.join(reporters)}; shown: {name}'s):")
        kind = EvidenceKind(e["kind"])
        console.print(_evidence_lines(kind, e["reason"], e.get("figures") or {}))
    if against_honest:
        problems.append(f"honest peers were reported: {[e['accused'] for _, e in against_honest]}")
    if any(b.peer != attacker.peer for b in bans):
        problems.append("an honest peer was banned")
    return problems


def _final_states_section(procs: list[_Proc], events: Events, console: Console) -> list[str]:
    """4. The final state CID of every honest node: one CID, or a problem."""
    final: dict[str, tuple[int, str]] = {}
    for p in procs:
        if p.role is Role.ATTACKER:
            continue
        last = [e for e in events[p.name] if e["event"] == Event.ROUND]
        if last:
            final[p.name] = (last[-1]["round"], last[-1]["state_cid"])
    agree = Table(title="final state CID of every honest node")
    agree.add_column("node")
    agree.add_column("round", justify="right")
    agree.add_column("state CID")
    for name, (r, cid) in final.items():
        agree.add_row(name, str(r), cid)
    console.print(agree)
    problems = []
    finals = {v for v in final.values()}
    if len(final) != sum(p.role is not Role.ATTACKER for p in procs):
        problems.append("not every honest node finished a round")
    elif len(finals) != 1:
        problems.append("honest nodes disagree on the final state")
    else:
        console.print(f"[green]all {len(final)} honest nodes agree[/green] on {finals.pop()[1]}")
    for p in procs:
        stopped = [e for e in events[p.name] if e["event"] == Event.STOPPED]
        if p.role is not Role.ATTACKER and stopped and stopped[-1]["reason"] != Ending.DONE:
            problems.append(f"{p.name} stopped: {stopped[-1]['reason']}")
    return problems


def _evidence_lines(kind: EvidenceKind, reason: str, figures: dict[str, Any]) -> str:
    """The ban evidence in words; the numbers are the aggregation's own records.

    By its kind (specs/aggregation.md "Ban policy"): an outlier's distances and clip weights, a
    low reputation's scores and losses (scores are on by default), a rejected update's why."""
    lines = [f"  {kind} evidence: {reason}"]
    rounds = figures.get("rounds") or []
    for i, round_ in enumerate(rounds):
        parts = []
        distance = _nth(figures, "distances", i)
        if distance is not None:
            parts.append(f"distance to the aggregate {distance:.1f}")
        score = _nth(figures, "scores", i)
        if kind is EvidenceKind.REPUTATION and isinstance(score, dict):  # losses anyone can check
            parts.append(
                f"loss on its own data {score['own_before']:.3f} -> {score['own_after']:.3f}, "
                f"held-out {score['held_before']:.3f} -> {score['held_after']:.3f}, "
                f"score {score['score']}"
            )
        elif kind is EvidenceKind.OUTLIER and score is not None:
            outlier = figures.get("outlier_score")
            parts.append(f"{score:.1f}x the median distance (outlier above {outlier})")
        reputation = _nth(figures, "reputations", i)
        if reputation is not None:
            parts.append(f"reputation {reputation} (ban bound {_nth(figures, 'bounds', i)})")
        weight = _nth(figures, "clip_weights", i)
        if weight is not None:
            parts.append(f"CenteredClip weight {weight:.3f}")
        parts.append(f"update {_nth(figures, 'update_cids', i)}")
        lines.append(f"  round {round_}: " + ", ".join(parts))
    if kind is EvidenceKind.REJECTED:
        lines.append(f"  rejected: {figures.get('rejected')}")
    return "\n".join(lines)


def _nth(figures: dict[str, Any], key: str, i: int) -> Any:
    values = figures.get(key) or []
    return values[i] if i < len(values) else None


def _coordinator_bans(url: str, run_config: Path) -> list[BanRecord]:
    """The bans in the coordinator's signed run state (its signature is checked by the client)."""
    from cnode.auth import Identity
    from cnode.node.coordinator import SyncCoordinatorClient, load_run_config

    config = load_run_config(run_config)
    reader = Identity.generate()  # reading the state needs no membership
    with SyncCoordinatorClient(
        url, run=config.run, coordinator=config.coordinator, identity=reader
    ) as client:
        state = client.run_state()
    return list(state.bans)
