"""specs/fixtures/coordinator/: the spec's example bytes are what the code produces and accepts.

Regenerate after an intended format change: ``python -m tests.node.coordinator.test_fixtures``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cnode.aggregation import assign_partitions, backup_aggregators
from cnode.auth import Identity, issue_access_token, open_envelope, seal
from cnode.node.coordinator import (
    REQUEST_TYPE,
    STATE_TYPE,
    CheckpointRecord,
    PartitionResultEntry,
    Phase,
    RoundInfo,
    RoundStatus,
    RunState,
    load_run_config,
    verify_state_envelope,
)
from cnode.node.coordinator._wire._protocol import b64decode, b64encode

FIXTURES = Path(__file__).resolve().parents[3] / "specs" / "fixtures" / "coordinator"
PEER = Identity.from_seed(bytes([1]) * 32)
COORDINATOR = Identity.from_seed(bytes([2]) * 32)
MANIFEST = "bafyreiafwov7ev42l23gia6npc7fk76ymbrtuh7cca6hmqqdbxx6gldfp4"  # CID of b"manifest"
HEADER = "bafyreia6awckexm7io7vzpik5qa6wgxseihnbbnu47yyg6ynrgkyzlrvhi"  # CID of b"header"


def _token() -> bytes:
    return issue_access_token(
        COORDINATOR,
        peer_id=PEER.peer_id_str,
        username="alice",
        run="demo",
        expires_at=2_000_000_000,
    )


def ready_payload() -> dict[str, Any]:
    return {
        "run": "demo",
        "op": "ready",
        "counter": 1_795_300_000_000_000,
        "args": {"round": 3, "header": HEADER},
        "token": _token(),
    }


def collected_payload() -> dict[str, Any]:
    return {
        "run": "demo",
        "op": "collected",
        "counter": 1_795_300_000_000_001,
        "args": {"round": 2, "missing": []},
        "token": _token(),
    }


def result_payload() -> dict[str, Any]:
    return {
        "run": "demo",
        "op": "result",
        "counter": 1_795_300_000_000_002,
        "args": {"round": 4, "partition": 0, "header": RESULT},
        "token": _token(),
    }


# A partitioned round: three members, partition 1 taken over by its first backup, partition 2
# shown wrong by evidence (the coordinator's recomputation replaced its output).
MEMBERS = sorted(Identity.from_seed(bytes([i]) * 32).peer_id_str for i in (1, 3, 4))
RESULT = "bafyreihwuikppjp43igcz3uwmc37ykpvmspdy2fk2shcb2kqcn6jrej2na"  # CID of b"result"
OUTPUT = "bafyreiha52f3kbuf4bp2b5d62bbahluvh7p5avpvxuujf2qymucckt4mhi"  # CID of b"output"


def partitioned_round() -> RoundInfo:
    aggregators = assign_partitions("demo", 4, MEMBERS, 3)
    backup = backup_aggregators("demo", 4, MEMBERS, 1)[0]
    return RoundInfo(
        "demo",
        4,
        0,
        RoundStatus.AGREED,
        MEMBERS,
        3,
        3,
        None,
        {peer: HEADER for peer in MEMBERS},
        collect_deadline_ms=1_795_300_190_000,
        agreed=MEMBERS,
        excluded={
            aggregators[
                1
            ]: f"partition 1: no result by the deadline; aggregated by backup {backup}",
            aggregators[2]: "banned",
        },
        parts=3,
        aggregators=aggregators,
        results={
            "0": PartitionResultEntry(aggregators[0], RESULT),
            "1": PartitionResultEntry(backup, RESULT),
            "2": PartitionResultEntry(aggregators[2], RESULT, OUTPUT, aggregators[0]),
        },
        verify_deadline_ms=1_795_300_260_000,
    )


def run_state() -> RunState:
    config = load_run_config(FIXTURES / "run.toml")
    addrs = {PEER.peer_id_str: [f"/ip4/203.0.113.7/tcp/4001/p2p/{PEER.peer_id_str}"]}
    published = RoundInfo(
        "demo",
        2,
        0,
        RoundStatus.AGREED,
        [PEER.peer_id_str],
        1,
        1,
        None,
        {PEER.peer_id_str: HEADER},
        addrs=addrs,
        collect_deadline_ms=1_795_300_090_000,
        agreed=[PEER.peer_id_str],
        excluded={},
    )
    current = RoundInfo("demo", 3, 0, RoundStatus.CLOSED, [], 2, 1, 1_795_300_060_000, addrs=addrs)
    return RunState(
        run="demo",
        coordinator=COORDINATOR.peer_id_str,
        version=42,
        at_ms=1_795_300_001_000,
        config=config.public_dict(),
        phase=Phase.TRAINING,
        phase_until_ms=None,
        epoch=0,
        round=current,
        last_round=published,
        waiting="round 3: 1 of 2 members not ready yet",
        checkpoint=CheckpointRecord(
            0, 2, MANIFEST, None, None, PEER.peer_id_str, 1_795_300_000_500
        ),
        bans=[],
        p2p_addrs=[f"/ip4/127.0.0.1/tcp/4010/p2p/{COORDINATOR.peer_id_str}"],
    )


def _readable(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: b64encode(v) if isinstance(v, bytes) else v for k, v in payload.items()}


def generate() -> dict[str, str]:
    state, rounds = run_state(), partitioned_round()
    return {
        "request-ready.json": json.dumps(
            {"envelope": b64encode(seal(PEER, REQUEST_TYPE, ready_payload()))}, indent=2
        ),
        "request-ready.payload.json": json.dumps(_readable(ready_payload()), indent=2),
        "request-collected.json": json.dumps(
            {"envelope": b64encode(seal(PEER, REQUEST_TYPE, collected_payload()))}, indent=2
        ),
        "request-collected.payload.json": json.dumps(_readable(collected_payload()), indent=2),
        "run-state.json": json.dumps(
            {"envelope": b64encode(seal(COORDINATOR, STATE_TYPE, state.to_payload()))}, indent=2
        ),
        "run-state.payload.json": json.dumps(state.to_payload(), indent=2),
        "request-result.json": json.dumps(
            {"envelope": b64encode(seal(PEER, REQUEST_TYPE, result_payload()))}, indent=2
        ),
        "request-result.payload.json": json.dumps(_readable(result_payload()), indent=2),
        "round-partitioned.json": json.dumps(
            {"envelope": b64encode(seal(COORDINATOR, STATE_TYPE, rounds.to_payload()))}, indent=2
        ),
        "round-partitioned.payload.json": json.dumps(rounds.to_payload(), indent=2),
    }


def test_fixtures_match_the_code() -> None:
    for name, text in generate().items():
        assert (FIXTURES / name).read_text() == text + "\n", name


def test_fixture_request_opens_with_its_signer() -> None:
    data = b64decode(json.loads((FIXTURES / "request-ready.json").read_text())["envelope"])
    opened = open_envelope(data, expected_type=REQUEST_TYPE)
    assert opened.signer == PEER.peer_id_str
    assert opened.payload == ready_payload()


def test_fixture_state_verifies_against_the_pinned_coordinator() -> None:
    data = b64decode(json.loads((FIXTURES / "run-state.json").read_text())["envelope"])
    payload = verify_state_envelope(data, run="demo", coordinator=COORDINATOR.peer_id_str)
    assert RunState.from_payload(payload) == run_state()


def test_fixture_partitioned_round_verifies_and_decodes() -> None:
    data = b64decode(json.loads((FIXTURES / "round-partitioned.json").read_text())["envelope"])
    payload = verify_state_envelope(data, run="demo", coordinator=COORDINATOR.peer_id_str)
    info = RoundInfo.from_payload(payload)
    assert info == partitioned_round()
    assert info.aggregators == assign_partitions("demo", 4, info.members, info.parts)


def test_fixture_run_config() -> None:
    config = load_run_config(FIXTURES / "run.toml")
    assert config.run == "demo" and config.coordinator == COORDINATOR.peer_id_str
    assert config.rounds.min_participants == 2 and config.rounds.checkpoint_every == 10
    assert config.access.users == ["alice"] and config.training["model"]["n_layer"] == 2


if __name__ == "__main__":
    for name, text in generate().items():
        (FIXTURES / name).write_text(text + "\n")
        print("wrote", FIXTURES / name)
