"""Deterministic building blocks: chunked float64 views of the updates and fixed-order sums.

Bit-identical results on every machine and thread count come from using only operations whose
result is fixed by IEEE 754 per element: +, -, *, / and sqrt element by element, copies, dtype
casts and sorting. torch's own reductions (sum, norm, mean, matmul) are avoided for anything that
crosses elements, because their association order depends on the thread count and the SIMD width.
Every sum across elements is instead a pairwise tree with a shape fixed by the length alone
(:func:`tree_sum`), and partial sums are added chunk by chunk in a fixed order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from . import limits
from ._types import TensorSpec

__all__ = [
    "Chunk",
    "Stack",
    "chunk_width",
    "select_rows",
    "tile_width",
    "tree_sum",
    "tree_sum_rows_",
]

_F64 = torch.float64


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum a 2-D tensor along ``dim`` (0 or 1) with a pairwise tree fixed by the length.

    Each level adds the first half to the second half element by element; an odd last element is
    added to the last pair's sum. Only element-wise additions: the same bits for any thread count.
    """
    if dim not in (0, 1) or x.dim() != 2:
        raise ValueError("tree_sum takes a 2-D tensor and dim 0 or 1")
    length = x.shape[dim]
    if length == 0:
        shape = (x.shape[1],) if dim == 0 else (x.shape[0],)
        return torch.zeros(shape, dtype=x.dtype)
    while length > 1:
        half = length // 2
        head = x.narrow(dim, 0, half)
        y = head + x.narrow(dim, half, half)
        if length % 2:
            last = y.narrow(dim, half - 1, 1)
            last.add_(x.narrow(dim, 2 * half, 1))  # in place on our own temporary
        x = y
        length = half
    return x.select(dim, 0)


def tree_sum_rows_(x: torch.Tensor) -> torch.Tensor:
    """tree_sum(x, 0), computed in place in ``x`` (overwritten): the same additions, same bits.

    Returns a view of row 0. No temporaries: each level adds the second half into the first.
    """
    length = x.shape[0]
    if length == 0:
        return torch.zeros(x.shape[1:], dtype=x.dtype)
    while length > 1:
        half = length // 2
        x[:half].add_(x[half : 2 * half])
        if length % 2:
            x[half - 1].add_(x[2 * half])
        length = half
    return x[0]


@functools.cache
def _network(n: int, wanted: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sorting network for n rows, pruned to the ``wanted`` ranks.

    Built for the next power of two; a comparator touching a row >= n is dropped (as if those
    rows held +inf, which a sorting network leaves in place). Comparators that cannot affect a
    wanted output are pruned walking backwards. Returned as (low row, high row) pairs in order.
    """
    size = 1
    while size < n:
        size *= 2
    layers: list[list[tuple[int, int]]] = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            layer = []
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    a, b = i + j, i + j + k
                    if a // (2 * p) == b // (2 * p) and b < n:
                        layer.append((a, b))
            layers.append(layer)
            k //= 2
        p *= 2
    needed = set(wanted)
    kept: list[list[tuple[int, int]]] = []
    for layer in reversed(layers):
        keep = [(a, b) for a, b in layer if a in needed or b in needed]
        for a, b in keep:
            needed.update((a, b))
        kept.append(keep)
    return tuple(pair for layer in reversed(kept) for pair in layer)


def select_rows(
    x: torch.Tensor, ranks: tuple[int, ...], spare: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """The rank-r values of every column of ``x`` (rows x columns), for each r in ``ranks``.

    A comparator network of element-wise minimum/maximum, one row pair at a time: exact, and
    about five times faster than torch.sort along the short axis (53 comparators for the median
    of 16). Each comparator writes the minimum into a free row and the maximum over the high
    row, then the low row's old storage becomes the free row: two kernels, no copy. ``x`` (and
    ``spare``, a free row shaped like x[0]) are overwritten; the returned rows are views into
    either. Zeros must be canonical (+0.0): minimum/maximum may return either zero for a
    (-0.0, +0.0) pair.
    """
    rows = list(x.unbind(0))
    free = torch.empty_like(x[0]) if spare is None else spare
    for low, high in _network(x.shape[0], tuple(sorted(ranks))):
        a, b = rows[low], rows[high]
        torch.minimum(a, b, out=free)
        torch.maximum(a, b, out=b)
        rows[low], free = free, a
    return [rows[r] for r in ranks]


def chunk_width(n: int) -> int:
    """W for n updates (limits.py): a power of two, fixed by n alone."""
    w = limits.CHUNK_ELEMENTS
    while w > limits.MIN_CHUNK_ELEMENTS and w * max(n, 1) > limits.WORK_ELEMENTS:
        w //= 2
    return w


@dataclass(frozen=True)
class Chunk:
    """Elements [start, stop) of the flattened layer ``name``: a W-chunk or a tile inside one.

    ``pos`` is the offset of ``start`` in its W-chunk: the accumulator column of the first
    element. Which accumulator column an element adds into is fixed by W alone; tiles only
    decide how many columns are processed at once (see tile_width).
    """

    name: str
    start: int
    stop: int
    pos: int = 0

    @property
    def size(self) -> int:
        return self.stop - self.start


def tile_width(n: int, width: int) -> int:
    """Columns of float64 arithmetic done at once for n updates: a power of two <= ``width``.

    Not part of the result: every operation is element-wise along the columns, and column j of
    a tile adds into its own accumulator column, so any tile width gives the same bits. Chosen
    so that an n x tile float64 block (TILE_WORK_ELEMENTS) stays in a core's L2 cache, where
    element-wise kernels run 2-3x faster than on blocks that spill to L3 or memory.
    """
    t = limits.TILE_ELEMENTS
    while t > limits.MIN_TILE_ELEMENTS and t * max(n, 1) > limits.TILE_WORK_ELEMENTS:
        t //= 2
    return min(t, width)


class Stack:
    """The accepted updates, flattened, read block by block as float64 (peers x columns).

    Two ways through the data, both ending in the same bits (everything is element-wise per
    column, and each column adds into its accumulator column in layer-then-chunk order):

    * ``iter_tiles()``: tiles of ``tile`` columns, position-major: the tiles that share an
      accumulator slice follow each other, so that slice stays in cache. Each tile is gathered
      in the narrowest exact dtype (float32 for float16/bfloat16/float32 layers: half the bytes
      of float64) and widened to float64.
    * ``chunks`` with ``gather()``: whole W-chunks, for the order statistics.

    Nothing is ever stacked whole: peak memory is the inputs plus a few chunk buffers and one
    n x W accumulator per user. Peers are in the order given (callers sort by peer id).

    ``by_layer``: the updates are read one layer at a time, in name order, and only the current
    layer's tensors are held (``u[name]`` is looked up when the layer's first block is read and
    dropped when the next layer starts). With mappings that decode a layer on lookup, a pass
    over n updates then holds n x one layer, not n whole updates. Tiles go layer-major instead
    of position-major: each accumulator column still receives its additions in layer-then-chunk
    order, so the bits are the same (tests/aggregation/test_by_layer.py); only the cache
    locality of the accumulator differs.
    """

    def __init__(
        self,
        updates: Sequence[Mapping[str, torch.Tensor]],
        expected: Mapping[str, TensorSpec],
        *,
        by_layer: bool = False,
    ) -> None:
        self.names = sorted(expected)
        self.specs = {n: expected[n] for n in self.names}
        self.n = len(updates)
        self.width = chunk_width(self.n)
        self.tile = tile_width(self.n, self.width)
        self.chunks: list[Chunk] = []
        self.tiles_major: list[Chunk] = []
        self.by_layer = by_layer
        self._updates = updates
        # Per layer, the n flattened updates (views; reshape(-1) copies only non-contiguous
        # inputs). Blocks slice them when read: no per-block views kept (a 1B-parameter model
        # has millions of tiles). by_layer: only the layer being read (see _layer).
        self._flat: dict[str, list[torch.Tensor]] = {}
        for name in self.names:
            numel = self.specs[name].numel
            if numel == 0:
                continue
            if not by_layer:
                self._flat[name] = [u[name].detach().reshape(-1) for u in updates]
            for start in range(0, numel, self.width):
                self.chunks.append(Chunk(name, start, min(start + self.width, numel)))
            for start in range(0, numel, self.tile):
                stop = min(start + self.tile, numel)
                self.tiles_major.append(Chunk(name, start, stop, start % self.width))
        # Position-major; per position, layer (name order) then chunk: the accumulation order.
        # by_layer keeps them as built: layer, chunk, position (the same order per column).
        order = {name: i for i, name in enumerate(self.names)}
        if not by_layer:
            self.tiles_major.sort(key=lambda t: (t.pos, order[t.name], t.start))
        self._bufs: dict[tuple[str, torch.dtype, int], torch.Tensor] = {}

    def buffer(self, key: str, size: int, dtype: torch.dtype = _F64, rows: int = 0) -> torch.Tensor:
        """A contiguous (rows, or n) x size scratch block, reused per key, dtype and rows."""
        rows = rows or self.n
        buf = self._bufs.get((key, dtype, rows))
        if buf is None or buf.numel() < rows * size:
            buf = self._bufs[(key, dtype, rows)] = torch.empty(rows * size, dtype=dtype)
        return buf[: rows * size].view(rows, size)

    def narrow_dtype(self, chunk: Chunk) -> torch.dtype:
        return _F64 if self.specs[chunk.name].dtype == _F64 else torch.float32

    def gather(self, chunk: Chunk) -> torch.Tensor:
        """The chunk's rows (peers) in narrow_dtype, exact. Reused by the next gather()."""
        out = self.buffer("gather", chunk.size, self.narrow_dtype(chunk))
        torch.stack(self._slices(chunk), out=out)
        return out

    def _slices(self, chunk: Chunk) -> list[torch.Tensor]:
        return [f[chunk.start : chunk.stop] for f in self._layer(chunk.name)]

    def _layer(self, name: str) -> list[torch.Tensor]:
        """The n flattened tensors of layer ``name``; by_layer: looked up now, the previous
        layer's dropped (every pass reads the layers in name order, each one once)."""
        flat = self._flat.get(name)
        if flat is None:
            self._flat.clear()
            flat = self._flat[name] = [u[name].detach().reshape(-1) for u in self._updates]
        return flat

    def release(self) -> None:
        """Drop the layer held (by_layer): the end of a pass."""
        if self.by_layer:
            self._flat.clear()

    def tiles(self, chunk: Chunk, width: int = 0) -> list[Chunk]:
        """``chunk`` cut into pieces of ``width`` (default ``tile``) columns, keeping ``pos``."""
        width = width or self.tile
        return [
            Chunk(chunk.name, s, min(s + width, chunk.stop), chunk.pos + s - chunk.start)
            for s in range(chunk.start, chunk.stop, width)
        ]

    def widen(self, gathered: torch.Tensor, chunk: Chunk, tile: Chunk) -> torch.Tensor:
        """Float64 copy of ``tile``'s columns of the gathered ``chunk`` (exact). Reused buffer."""
        out = self.buffer("widen", tile.size)
        out.copy_(gathered[:, tile.pos - chunk.pos : tile.pos - chunk.pos + tile.size])
        return out

    def iter_tiles(self) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """(tile, its rows as float64), position-major; the caller may overwrite the block."""
        for tile in self.tiles_major:
            rows = self._slices(tile)
            x = self.buffer("tile", tile.size)
            if self.specs[tile.name].dtype == _F64:
                torch.stack(rows, out=x)
            else:  # gathering narrow values is twice as fast; widening is exact
                x.copy_(torch.stack(rows, out=self.buffer("tile32", tile.size, torch.float32)))
            yield tile, x

    def new_vector(self) -> dict[str, torch.Tensor]:
        """A float64 work vector shaped like one flattened update."""
        return {n: torch.empty(self.specs[n].numel, dtype=_F64) for n in self.names}

    def new_accumulator(self, rows: int = 0) -> torch.Tensor:
        """Per-position partial sums ((rows or n) x W), reduced once by reduce()."""
        return torch.zeros((rows or self.n, self.width), dtype=_F64)

    @staticmethod
    def accumulate_sq(acc: torch.Tensor, diff: torch.Tensor, tile: Chunk) -> None:
        """acc[:, pos:pos+size] += diff**2, element-wise (diff is overwritten).

        Position j of every W-chunk adds into acc[:, j], chunk after chunk in a fixed order, and
        reduce() sums acc with tree_sum: a summation order fixed by the layer sizes and W alone,
        and no reduction call per chunk.
        """
        diff.mul_(diff)
        acc[:, tile.pos : tile.pos + tile.size].add_(diff)

    @staticmethod
    def reduce(acc: torch.Tensor) -> torch.Tensor:
        return tree_sum(acc, 1)

    def sq_distances(self, v: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Squared L2 distance of every update to ``v`` (float64 vector), one pass."""
        acc = self.new_accumulator()
        for tile, x in self.iter_tiles():
            x.sub_(v[tile.name][tile.start : tile.stop])
            self.accumulate_sq(acc, x, tile)
        return self.reduce(acc)

    def finish(self, v: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Cast the float64 work vector to the expected dtypes and shapes."""
        return {n: v[n].to(self.specs[n].dtype).reshape(self.specs[n].shape) for n in self.names}
