"""A peer's update read one layer at a time (issue 27).

A full round's aggregation used to decode every member's update whole: n x the model in
float32 (28 GB for 7 peers at 1B parameters). :class:`SegmentedUpdate` is a mapping of layer
name -> float32 tensor read when it is looked up. With ``aggregate(..., by_layer=True)``, which
reads the layers in name order and drops each before the next, aggregating n updates holds
n x one layer instead of n whole updates; the result is the same bits.

Construction decodes every segment once, in order, into an unlinked scratch file under the
store's folder (the decoded float32 values; gone when the mapping is), holding one segment at a
time: a malformed update raises MalformedUpdateError there, where the whole-update path raised
it, not in the middle of the aggregation. A lookup then reads the layer's bytes back (the page
cache, usually): CenteredClip's passes cost a copy each, not a decode each (decoding every pass
made a 100M round 5.9x slower than the whole path).
"""

from __future__ import annotations

import math
import os
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from cnode.aggregation import segment_ranges
from cnode.storage import CID, BlockStore

from ._round import load_segments, update_manifest

__all__ = ["SegmentedUpdate"]


class SegmentedUpdate(Mapping[str, torch.Tensor]):
    """``update[name]``: layer ``name`` of the update at ``cid`` (float32, read now from the
    scratch file, the shape of ``shapes[name]``). Layers are laid out as :func:`flat_segments`
    does: sorted names, row-major, cut into the segments of :func:`segment_ranges`."""

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
        # The scratch file lives beside the store (not in /tmp, which may be memory) and is
        # unlinked at once: the open descriptor is its only name, closed with this mapping.
        scratch = Path(store.root) / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        # Closed by the finalizer below (with this mapping), not by a with block.
        handle = tempfile.TemporaryFile(dir=scratch)  # noqa: SIM115
        self._fd = handle.fileno()
        self._close = weakref.finalize(self, handle.close)
        try:
            for i in range(len(self.ranges)):  # every segment decodes (or the update is refused)
                segment = load_segments(
                    store, cid, peer=peer, codec=codec, numel=self.numel, indices=[i],
                    manifest=self.manifest,
                )[i]  # fmt: skip
                view = segment.contiguous().numpy().data.cast("B")
                offset = self.ranges[i][0] * 4
                while view:
                    written = os.pwrite(self._fd, view, offset)
                    view, offset = view[written:], offset + written
                del segment
        except BaseException:
            self._close()
            raise

    def __getitem__(self, name: str) -> torch.Tensor:
        start, stop = self.spans[name]
        out = torch.empty(stop - start, dtype=torch.float32)
        view = out.numpy().data.cast("B")
        offset = start * 4
        while view:
            got = os.preadv(self._fd, [view], offset)
            if got <= 0:
                raise OSError(f"scratch file of update {self.cid} ended early")
            view, offset = view[got:], offset + got
        return out.view(self.shapes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)
