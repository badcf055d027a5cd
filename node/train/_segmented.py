"""A peer's update read from the block store one layer at a time (issue 27).

A full round's aggregation used to decode every member's update whole: n x the model in
float32 (28 GB for 7 peers at 1B parameters). :class:`SegmentedUpdate` is a mapping of layer
name -> float32 tensor that decodes a layer when it is looked up, from the update's segments in
the store, keeping only the last decoded segment. With ``aggregate(..., by_layer=True)``, which
reads the layers in name order and drops each before the next, aggregating n updates holds
n x (one segment + one layer) instead of n whole updates; the result is the same bits.

Construction decodes every segment once and drops it: a malformed update raises
MalformedUpdateError there, where the whole-update path raised it, not in the middle of the
aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from cnode.aggregation import segment_ranges
from cnode.storage import CID, BlockStore

from ._round import load_segments, update_manifest

__all__ = ["SegmentedUpdate"]


class SegmentedUpdate(Mapping[str, torch.Tensor]):
    """``update[name]``: layer ``name`` of the update at ``cid``, decoded now (float32, the
    shape of ``shapes[name]``). Layers are laid out as :func:`flat_segments` does: sorted names,
    row-major, cut into the segments of :func:`segment_ranges`."""

    def __init__(
        self,
        store: BlockStore,
        cid: CID,
        *,
        peer: str,
        codec: str,
        shapes: Mapping[str, torch.Tensor],
    ) -> None:
        self.store, self.cid, self.peer, self.codec = store, cid, peer, codec
        self.shapes = {name: tuple(shapes[name].shape) for name in sorted(shapes)}
        self.numel = sum(math.prod(s) for s in self.shapes.values())
        self.ranges = segment_ranges(self.numel)
        self.spans: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, shape in self.shapes.items():
            self.spans[name] = (offset, offset + math.prod(shape))
            offset += math.prod(shape)
        self.manifest = update_manifest(store, cid, peer, codec)
        self._last: tuple[int, torch.Tensor] | None = None
        for i in range(len(self.ranges)):  # every segment decodes (or the update is refused)
            self._segment(i)
        self._last = None

    def _segment(self, i: int) -> torch.Tensor:
        if self._last is None or self._last[0] != i:
            self._last = None  # drop the previous one before decoding the next
            decoded = load_segments(
                self.store,
                self.cid,
                peer=self.peer,
                codec=self.codec,
                numel=self.numel,
                indices=[i],
                manifest=self.manifest,
            )
            self._last = (i, decoded[i])
        return self._last[1]

    def __getitem__(self, name: str) -> torch.Tensor:
        start, stop = self.spans[name]
        out = torch.empty(stop - start, dtype=torch.float32)
        for i, (a, b) in enumerate(self.ranges):
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                out[lo - start : hi - start] = self._segment(i)[lo - a : hi - a]
        return out.view(self.shapes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)
