"""Evidence that a partition result is wrong: the blocks to recompute it, and the check.

A verifier that recomputed a partition and got another output sends the coordinator a CAR v1
file holding the signed result, every input's signed header, the manifest nodes of every input
update and the chunks of the partition's segments. Each block is checked against its CID, so the
evidence proves itself: :func:`check_partition_evidence` recomputes the partition from it with the
same code every node runs and says whether the signer's output is what its inputs give
(specs/training.md#verification, specs/coordinator.md).
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cnode.node.coordinator import PartitionVerdict
from cnode.storage import (
    CID,
    DAG_CBOR,
    BlockStore,
    StorageError,
    car_header,
    car_section,
    manifest_closure,
    read_car,
    read_manifest,
)

from .. import limits
from .._config import TrainingConfig
from .._exceptions import PartitionEvidenceError, PeerUpdateError, TrainingConfigError
from .._round import open_update_header, segment_layer
from ..model import build_model, model_state
from ._result import (
    PartitionResult,
    input_segments,
    open_partition_result,
    recompute_partition,
)

__all__ = [
    "build_partition_evidence",
    "check_partition_evidence",
    "model_numel",
]


def evidence_blocks(store: BlockStore, header: CID, *, numel: int) -> list[CID]:
    """The blocks that prove what partition result ``header`` should have been."""
    result = open_partition_result(store.get(header), run=_run_of(store, header))
    blocks = [header]
    indices = input_segments(numel, result.parts, result.partition)
    for member, cid in sorted(result.inputs.items()):
        update = open_update_header(store.get(cid), run=result.run, signer=member).update
        blocks.append(cid)
        blocks.extend(c for c in manifest_closure(store, update) if c.codec == DAG_CBOR)
        manifest = read_manifest(store, update)
        names = {segment_layer(i) for i in indices}
        for layer in manifest.layers:
            if layer.name in names:
                blocks.extend(layer.chunks)
    return list(dict.fromkeys(blocks))


def _run_of(store: BlockStore, header: CID) -> str:
    from cnode.auth import open_envelope

    from ._result import PARTITION_RESULT_TYPE

    run = open_envelope(store.get(header), expected_type=PARTITION_RESULT_TYPE).payload.get("run")
    return run if isinstance(run, str) else ""


def build_partition_evidence(store: BlockStore, header: CID, *, numel: int) -> bytes:
    """The CAR v1 a verifier sends: root = the result header; every block it needs after."""
    parts = [car_header([header])]
    for cid in evidence_blocks(store, header, numel=numel):
        parts.append(car_section(cid, store.get(cid)))
    return b"".join(parts)


@functools.lru_cache(maxsize=4)
def _numel_of(training: str) -> int:
    config = TrainingConfig.from_dict(json.loads(training))
    return sum(t.numel() for t in model_state(build_model(config)).values())


def model_numel(config: TrainingConfig) -> int:
    """How many values the run's state (and so its flat update) holds (the model is built once
    per model config)."""
    return _numel_of(json.dumps(config.to_dict(), sort_keys=True))


def check_partition_evidence(
    car: bytes,
    header: str,
    *,
    run: str,
    round_: int,
    partition: int,
    training: Mapping[str, Any],
) -> PartitionVerdict:
    """Recompute partition ``partition`` of round ``round_`` from the evidence ``car``.

    Raises PartitionEvidenceError naming what is wrong: a malformed or oversized CAR, a block
    that does not match its CID, a missing block, a header that is not the named result.
    """
    if len(car) > limits.MAX_EVIDENCE_BYTES:
        raise PartitionEvidenceError(f"evidence of {len(car)} bytes > MAX_EVIDENCE_BYTES")
    try:
        config = TrainingConfig.for_run(dict(training))  # the run config's table
        want = CID.parse(header)
        roots, sections = read_car(car, limits.MAX_EVIDENCE_BLOCKS)
    except (TrainingConfigError, StorageError) as exc:  # the request's fault, not ours
        raise PartitionEvidenceError(f"unreadable evidence: {exc}") from exc
    if roots != [want]:
        raise PartitionEvidenceError(f"the evidence's root is {roots}, not the result {want}")
    folder = Path(tempfile.mkdtemp(prefix="cnode-evidence-"))
    try:
        store = BlockStore(folder)
        for cid, data in sections:
            try:
                store.put(cid, data)  # hashes it: a block that is not its CID is refused
            except StorageError as exc:
                raise PartitionEvidenceError(f"evidence block {cid}: {exc}") from exc
        try:
            result = open_partition_result(store.get(want), run=run, round_=round_)
        except (PeerUpdateError, StorageError) as exc:
            raise PartitionEvidenceError(f"result {want}: {exc}") from exc
        if result.partition != partition:
            raise PartitionEvidenceError(
                f"result {want} is of partition {result.partition}, not {partition}"
            )
        try:
            work = recompute_partition(store, result, config=config, numel=model_numel(config))
        except (PeerUpdateError, StorageError) as exc:
            raise PartitionEvidenceError(f"cannot recompute partition {partition}: {exc}") from exc
        return _verdict(result, work.output)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _verdict(result: PartitionResult, recomputed: CID | None) -> PartitionVerdict:
    claimed = "" if result.output is None else str(result.output)
    again = "" if recomputed is None else str(recomputed)
    return PartitionVerdict(result.peer, result.partition, claimed, again, claimed == again)
