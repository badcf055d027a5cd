"""check_partition_evidence refuses unreadable evidence with PartitionEvidenceError naming what:
a training table no run could have, a header that is not a CID, bytes that are not a CAR."""

from __future__ import annotations

from typing import Any

import pytest

from cnode.node.train import PartitionEvidenceError, check_partition_evidence
from cnode.storage import compute_cid

HEADER = str(compute_cid(b"a partition result header", 0x71))


@pytest.mark.parametrize(
    ("car", "header", "training", "words"),
    [
        (b"", HEADER, {"lr": "fast"}, "unreadable evidence: [training] lr must be float"),
        (b"", HEADER, {"bogus": 1}, "unreadable evidence: [training]: unknown setting(s) bogus"),
        (b"", "not-a-cid", {}, "unreadable evidence: "),
        (b"\x05hello", HEADER, {}, "unreadable evidence: "),
    ],
)
def test_unreadable_evidence_is_the_reporters_fault(
    car: bytes, header: str, training: dict[str, Any], words: str
) -> None:
    with pytest.raises(PartitionEvidenceError) as err:
        check_partition_evidence(car, header, run="r", round_=1, partition=0, training=training)
    assert str(err.value).startswith(words), err.value
