"""Deterministic building blocks: chunked float64 views of the updates and fixed-order sums.

Bit-identical results on every machine and thread count come from using only operations whose
result is fixed by IEEE 754 per element: +, -, *, / and sqrt element by element, copies, dtype
casts and sorting. torch's own reductions (sum, norm, mean, matmul) are avoided for anything that
crosses elements, because their association order depends on the thread count and the SIMD width.
Every sum across elements is instead a pairwise tree with a shape fixed by the length alone
(:func:`tree_sum`), and partial sums are added chunk by chunk in a fixed order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from . import limits
from ._types import TensorSpec

__all__ = ["Chunk", "Stack", "tree_sum"]

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


@dataclass(frozen=True)
class Chunk:
    """A slice [start, stop) of the flattened layer ``name``."""

    name: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class Stack:
    """The accepted updates, flattened, read chunk by chunk as one float64 (peers x n) block.

    Nothing is ever stacked whole: peak memory is the inputs plus one chunk buffer per user.
    Peers are in the order given (callers sort by peer id).
    """

    def __init__(
        self, updates: Sequence[Mapping[str, torch.Tensor]], expected: Mapping[str, TensorSpec]
    ) -> None:
        self.names = sorted(expected)
        self.specs = {n: expected[n] for n in self.names}
        self.n = len(updates)
        # reshape(-1) is a view for contiguous tensors; non-contiguous ones are copied once here.
        self.flat = [{n: u[n].detach().reshape(-1) for n in self.names} for u in updates]
        self.chunks = [
            Chunk(n, s, min(s + limits.CHUNK_ELEMENTS, self.specs[n].numel))
            for n in self.names
            for s in range(0, self.specs[n].numel, limits.CHUNK_ELEMENTS)
        ]
        self._buf = torch.empty((self.n, limits.CHUNK_ELEMENTS), dtype=_F64)

    def load(self, chunk: Chunk) -> torch.Tensor:
        """Rows = peers, float64. The returned tensor is reused by the next load()."""
        out = self._buf[:, : chunk.size]
        for i, flat in enumerate(self.flat):
            out[i].copy_(flat[chunk.name][chunk.start : chunk.stop])
        return out

    def iter_chunks(self) -> Iterator[tuple[Chunk, torch.Tensor]]:
        for chunk in self.chunks:
            yield chunk, self.load(chunk)

    def new_vector(self) -> dict[str, torch.Tensor]:
        """A float64 work vector shaped like one flattened update."""
        return {n: torch.empty(self.specs[n].numel, dtype=_F64) for n in self.names}

    def sq_distances(self, v: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Squared L2 distance of every update to ``v`` (float64 vector), one pass."""
        total = torch.zeros(self.n, dtype=_F64)
        for chunk, x in self.iter_chunks():
            d = x - v[chunk.name][chunk.start : chunk.stop]
            total = total + tree_sum(d * d, 1)
        return total

    def finish(self, v: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Cast the float64 work vector to the expected dtypes and shapes."""
        return {n: v[n].to(self.specs[n].dtype).reshape(self.specs[n].shape) for n in self.names}
