"""The state CID: one hash naming a model state apart from any checkpoint metadata.

Definition: specs/training.md#state-cid. It is the DAG-CBOR CID of::

    {"v": 1, "layers": [[name, dtype, [dim, ...], [chunk CID text, ...]], ...]}   # sorted by name

where each layer's dtype, shape and chunk CIDs are exactly those a checkpoint's manifest lists
(``tensor_layer`` computes them with ``save_checkpoint``'s own code), so a state and a manifest
compare without fetching a tensor byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import _cbor
from ._cid import CID, DAG_CBOR, compute_cid

STATE_CID_VERSION = 1


def state_cid_of_layers(layers: Iterable[tuple[str, str, Sequence[int], Sequence[CID]]]) -> CID:
    """The state CID of layers given as (name, dtype, shape, chunk CIDs), e.g. a manifest's."""
    rows: list[Any] = [
        [name, dtype, [int(d) for d in shape], [str(c) for c in chunks]]
        for name, dtype, shape, chunks in sorted(layers, key=lambda row: row[0])
    ]
    return compute_cid(_cbor.encode({"v": STATE_CID_VERSION, "layers": rows}), DAG_CBOR)
