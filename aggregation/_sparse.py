"""Sparse update codecs: the top-k values of each chunk, their offsets and a few bits each.

Two wire codecs share one format (specs/aggregation.md#sparse-codecs):

* ``sparse-topk:K``: a peer's update. Per chunk of ``SPARSE_CHUNK`` values, the K largest
  magnitudes (ties broken by the lower offset; zeros never kept), each as a 2-bit code
  ``sign, level`` times the chunk's scale ``s = mean |kept|``: ``+-0.9375 s`` for
  ``|v| < 1.125 s``, else ``+-1.5 s``.
  In the spirit of SparseLoCo (top-k per chunk, 2-bit values, 12-bit in-chunk indices, error
  feedback), with the levels chosen so that one float32 scale serves both the Gaussian-like and
  the heavy-tailed chunks measured (specs/aggregation.md gives the error of the alternatives).
* ``sparse-int8:K``: a partition's aggregate in a sparse run (its support is the union of the
  inputs' supports, cut back to K per chunk): int8 codes times ``s = max |kept| / 127``. The
  aggregate is not error-fed (no node keeps it), so its values get 8 bits.

Layout of a tensor of n values, ``B = ceil(n / SPARSE_CHUNK)`` chunks, T kept values in all:
``B x float32 LE scales``, ``B x uint16 LE counts``, the T in-chunk offsets as 12-bit fields
packed two per 3 bytes (``(3T + 1) // 2`` bytes), then the T codes (2 bits, four per byte, low
bits first; or one int8 each). Values are in chunk order, offsets strictly increasing in a chunk.
Every unused bit is zero and a chunk with no value has scale 0: one update has one encoding.

Decoding is ``LEVEL[code] * scale`` (or ``float32(int8) * scale``), one exactly rounded float32
product per kept value written at its own position: bit-identical on any machine and thread
count. Encoding uses no reduction whose order could vary: the top-k runs on unique integer keys
and the mean is a fixed pairwise tree in float64.
"""

from __future__ import annotations

import math

import torch

from . import limits
from ._exceptions import AggregationInputError, UpdateEncodingError

__all__ = [
    "SPARSE_KINDS",
    "chunk_quota",
    "decode_sparse",
    "encode_sparse",
    "parse_sparse",
    "sparse_nbytes_max",
    "uses_bitmap",
]

SPARSE_KINDS = ("sparse-topk", "sparse-int8")
_C = limits.SPARSE_CHUNK
_OFFSET_BITS = 12
assert 1 << _OFFSET_BITS == _C, "12-bit offsets address a chunk of 4096 values"
# 2-bit codes: bit 1 = negative, bit 0 = the high level. Binary fractions, so LEVEL x scale is
# exact whenever the product is representable.
# Measured on top-64-of-4096 chunks (relative squared error / decoded sum over kept sum):
# Gaussian 0.015 / 1.01, Student-t(3) 0.146 / 1.06, near-equal magnitudes 0.004 / 0.94; the
# split at the midpoint 1.21875 shrank near-equal chunks by 12 % (specs/aggregation.md).
_LEVELS = torch.tensor([0.9375, 1.5, -0.9375, -1.5], dtype=torch.float32)
_SPLIT = 1.125  # |v| >= _SPLIT x s takes the high level
_QMAX = 127
_FMAX = torch.finfo(torch.float32).max
_MAX_SCALE = {"sparse-topk": _FMAX / 1.5, "sparse-int8": _FMAX / _QMAX}


def parse_sparse(codec: str) -> tuple[str, int] | None:
    """``("sparse-topk", K)`` for ``"sparse-topk:K"`` (plain ``"sparse-topk"``: the default K),
    None for a codec that is not sparse. Raises AggregationInputError for a bad K."""
    kind, _, k = codec.partition(":")
    if kind not in SPARSE_KINDS:
        return None
    if not k:
        return kind, limits.SPARSE_DEFAULT_K
    if not k.isdigit() or str(int(k)) != k or not 1 <= int(k) <= _C:
        raise AggregationInputError(f"codec {codec!r}: K must be an integer in 1..{_C}")
    return kind, int(k)


def chunk_quota(k: int, length: int) -> int:
    """Most values a chunk of ``length`` values keeps: K for a full chunk, pro rata (rounded
    up, at least 1) for the short last one."""
    return min(length, -(-k * length // _C))


def sparse_nbytes_max(numel: int, codec: str) -> int:
    """The most bytes ``codec`` makes of ``numel`` values (every chunk at its quota)."""
    kind, k = _parsed(codec)
    chunks = math.ceil(numel / _C)
    total = sum(chunk_quota(k, min(_C, numel - j * _C)) for j in range(chunks))
    return _nbytes(kind, k, chunks, total)


def _parsed(codec: str) -> tuple[str, int]:
    parsed = parse_sparse(codec)
    if parsed is None:
        raise AggregationInputError(f"{codec!r} is not a sparse codec")
    return parsed


def uses_bitmap(k: int) -> bool:
    """Whether chunks with quota K mark their values in a 4096-bit bitmap (512 bytes) rather
    than with 12-bit offsets: when K offsets could take more than the bitmap, 1.5 K > 512."""
    return 3 * k > _C // 4


def _index_nbytes(k: int, chunks: int, total: int) -> int:
    return chunks * (_C // 8) if uses_bitmap(k) else (3 * total + 1) // 2


def _nbytes(kind: str, k: int, chunks: int, total: int) -> int:
    codes = (total + 3) // 4 if kind == "sparse-topk" else total
    return 6 * chunks + _index_nbytes(k, chunks, total) + codes


def _quotas(k: int, numel: int, chunks: int) -> torch.Tensor:
    quotas = torch.full((chunks,), min(k, _C), dtype=torch.int64)
    if chunks:
        quotas[-1] = chunk_quota(k, numel - (chunks - 1) * _C)
    return quotas


def _tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``x`` (rows x cols float64) by a fixed pairwise tree: the same bits whatever
    the thread count, unlike a library reduction."""
    width = 1 << max(0, (x.shape[1] - 1).bit_length())
    x = torch.nn.functional.pad(x, (0, width - x.shape[1]))
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


def encode_sparse(flat: torch.Tensor, codec: str) -> torch.Tensor:
    """Encode the 1-D float32 ``flat`` with ``codec`` (see the module docstring).

    NaN or Inf among a chunk's kept values give it a NaN or Inf scale: every receiver then
    rejects the bytes with a reason, as it rejects NaN in f32.
    """
    kind, k = _parsed(codec)
    n = flat.numel()
    chunks = math.ceil(n / _C)
    rows = torch.zeros(chunks * _C, dtype=torch.float32)
    rows[:n] = flat
    rows = rows.view(chunks, _C)
    kk = min(k, _C)
    # Unique keys: |v|'s float32 bits (ordered like |v| for non-negative floats, NaN above Inf)
    # then the inverted offset, so equal magnitudes keep the lower offset. No ties: topk's
    # choice is the same on every machine.
    mag = rows.abs().view(torch.int32).to(torch.int64)
    keys = (mag << _OFFSET_BITS) | (_C - 1 - torch.arange(_C, dtype=torch.int64))
    top = keys.topk(kk, dim=1, sorted=True).values
    rank_ok = torch.arange(kk).unsqueeze(0) < _quotas(k, n, chunks).unsqueeze(1)
    keep = rank_ok & ((top >> _OFFSET_BITS) > 0)  # never a zero
    counts = keep.sum(dim=1)
    offsets = torch.where(keep, _C - 1 - (top & (_C - 1)), torch.full_like(top, _C))
    offsets = offsets.sort(dim=1).values  # kept first, ascending; the sentinel _C after them
    kept = offsets < _C
    values = rows.gather(1, offsets.clamp(max=_C - 1))
    values = torch.where(kept, values, torch.zeros_like(values))
    absv = values.abs()
    if kind == "sparse-topk":
        total = _tree_sum(absv.to(torch.float64))
        scales = (total / counts.clamp(min=1).to(torch.float64)).to(torch.float32)
        high = absv >= scales.unsqueeze(1) * _SPLIT
        codes = (values < 0).to(torch.int64) * 2 + high.to(torch.int64)
    else:
        scales = absv.amax(dim=1) / _QMAX
        usable = (torch.isfinite(scales) & (scales > 0)).unsqueeze(1)
        div = torch.where(usable, scales.unsqueeze(1), torch.ones_like(values))
        codes = torch.round(values / div).clamp(-_QMAX, _QMAX)
        codes = torch.where(usable, codes, torch.zeros_like(codes)).to(torch.int64)
    scales = torch.where(counts > 0, scales, torch.zeros_like(scales))
    if uses_bitmap(k):
        marks = torch.zeros(chunks, _C + 1, dtype=torch.int64)  # column _C takes the sentinels
        marks.scatter_(1, offsets, 1)
        bits = marks[:, :_C].view(chunks, _C // 8, 8) << torch.arange(8)
        index = bits.sum(dim=2).reshape(-1).to(torch.uint8)  # exact: disjoint bits
    else:
        index = _pack_offsets(offsets[kept])
    out = _pack(kind, counts, scales, index, codes[kept])
    assert out.numel() == _nbytes(kind, k, chunks, int(counts.sum()))
    return out


def _pack_offsets(offsets: torch.Tensor) -> torch.Tensor:
    total = offsets.numel()
    pairs = torch.nn.functional.pad(offsets, (0, total % 2)).view(-1, 2)
    a, b = pairs[:, 0], pairs[:, 1]
    packed = torch.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], dim=1).reshape(-1)
    return packed[: (3 * total + 1) // 2].to(torch.uint8)


def _pack(
    kind: str,
    counts: torch.Tensor,
    scales: torch.Tensor,
    index: torch.Tensor,
    codes: torch.Tensor,
) -> torch.Tensor:
    total = codes.numel()
    head = torch.stack([counts & 0xFF, counts >> 8], dim=1).reshape(-1).to(torch.uint8)
    if kind == "sparse-topk":
        quads = torch.nn.functional.pad(codes, (0, (-total) % 4)).view(-1, 4)
        body = (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).to(
            torch.uint8
        )
    else:
        body = codes.to(torch.int8).view(torch.uint8)
    return torch.cat([scales.contiguous().view(torch.uint8), head, index, body])


def decode_sparse(encoded: torch.Tensor, codec: str, numel: int) -> torch.Tensor:
    """Decode bytes of ``codec`` holding ``numel`` values; a new 1-D float32 tensor.

    Raises:
        UpdateEncodingError: not 1-D uint8; truncated or too long; a chunk with more values
            than its quota; a scale NaN, Inf, negative, too large, or not 0 on an empty chunk;
            an offset out of its chunk, duplicate or unsorted; a padding bit set; an int8 -128.
    """
    kind, k = _parsed(codec)
    if encoded.dtype != torch.uint8 or encoded.dim() != 1:
        raise UpdateEncodingError(
            f"{kind} stores 1-D uint8 bytes, got {encoded.dtype} of shape {tuple(encoded.shape)}"
        )
    data = encoded.contiguous()
    chunks = math.ceil(numel / _C)
    if data.numel() < 6 * chunks:
        raise UpdateEncodingError(
            f"{kind} truncated: {data.numel()} bytes, the {chunks} chunk headers need {6 * chunks}"
        )
    head = data[4 * chunks : 6 * chunks].to(torch.int64).view(-1, 2)
    counts = head[:, 0] | (head[:, 1] << 8)
    quotas = _quotas(k, numel, chunks)
    over = counts > quotas
    if bool(over.any()):
        j = int(over.nonzero()[0])
        raise UpdateEncodingError(
            f"{kind} chunk {j} holds {int(counts[j])} values, more than its {int(quotas[j])}"
        )
    total = int(counts.sum())
    want = _nbytes(kind, k, chunks, total)
    if data.numel() != want:
        word = "truncated" if data.numel() < want else "too long"
        raise UpdateEncodingError(
            f"{kind} {word}: {data.numel()} bytes, expected {want} ({chunks} chunks, "
            f"{total} values)"
        )
    scales = data[: 4 * chunks].clone().view(torch.float32)  # a copy: aligned for the view
    _check_scales(kind, scales, counts)
    at = 6 * chunks
    idx_len = _index_nbytes(k, chunks, total)
    if uses_bitmap(k):
        chunk_of, offsets = _unpack_bitmap(kind, data[at : at + idx_len], counts, numel)
    else:
        offsets = _unpack_offsets(kind, data[at : at + idx_len], total)
        chunk_of = torch.repeat_interleave(torch.arange(chunks), counts)
        _check_offsets(kind, offsets, chunk_of, numel)
    values = _unpack_values(kind, data[at + idx_len :], total)
    out = torch.zeros(numel, dtype=torch.float32)
    if total:
        out[chunk_of * _C + offsets] = values * scales[chunk_of]
    return out


def _check_scales(kind: str, scales: torch.Tensor, counts: torch.Tensor) -> None:
    bad = ~(torch.isfinite(scales) & (scales >= 0) & (scales <= _MAX_SCALE[kind]))
    bad |= (counts == 0) & (scales != 0)
    if bool(bad.any()):
        j = int(bad.nonzero()[0])
        raise UpdateEncodingError(
            f"{kind} scale of chunk {j} is {float(scales[j])!r} (must be finite, >= 0, "
            f"<= {_MAX_SCALE[kind]:.6g}, and 0 when the chunk holds no value)"
        )


def _unpack_offsets(kind: str, packed: torch.Tensor, total: int) -> torch.Tensor:
    padded = torch.nn.functional.pad(packed.to(torch.int64), (0, (-packed.numel()) % 3))
    triples = padded.view(-1, 3)
    a = triples[:, 0] | ((triples[:, 1] & 0xF) << 8)
    b = (triples[:, 1] >> 4) | (triples[:, 2] << 4)
    if total % 2 and int(b[-1]) != 0:
        raise UpdateEncodingError(f"{kind} padding bits after the last offset are not zero")
    return torch.stack([a, b], dim=1).reshape(-1)[:total]


def _unpack_bitmap(
    kind: str, packed: torch.Tensor, counts: torch.Tensor, numel: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk, offset) of every marked bit, in chunk order and ascending: a bitmap can hold no
    duplicate and no disorder; its marks must match the counts and stay within each chunk."""
    chunks = counts.numel()
    bits = (packed.to(torch.int64).view(chunks, _C // 8, 1) >> torch.arange(8)) & 1
    bits = bits.reshape(chunks, _C)
    marked = bits.sum(dim=1)
    wrong = marked != counts
    if bool(wrong.any()):
        j = int(wrong.nonzero()[0])
        raise UpdateEncodingError(
            f"{kind} bitmap of chunk {j} marks {int(marked[j])} values, its count says "
            f"{int(counts[j])}"
        )
    chunk_of, offsets = bits.nonzero(as_tuple=True)
    lengths = (numel - chunk_of * _C).clamp(max=_C)
    out = offsets >= lengths
    if bool(out.any()):
        t = int(out.nonzero()[0])
        raise UpdateEncodingError(
            f"{kind} offset {int(offsets[t])} of value {t} is out of range: chunk "
            f"{int(chunk_of[t])} has {int(lengths[t])} values"
        )
    return chunk_of, offsets


def _check_offsets(kind: str, offsets: torch.Tensor, chunk_of: torch.Tensor, numel: int) -> None:
    if not offsets.numel():
        return
    lengths = (numel - chunk_of * _C).clamp(max=_C)
    out = offsets >= lengths
    if bool(out.any()):
        t = int(out.nonzero()[0])
        raise UpdateEncodingError(
            f"{kind} offset {int(offsets[t])} of value {t} is out of range: chunk "
            f"{int(chunk_of[t])} has {int(lengths[t])} values"
        )
    same = chunk_of[1:] == chunk_of[:-1]
    wrong = same & (offsets[1:] <= offsets[:-1])
    if bool(wrong.any()):
        t = int(wrong.nonzero()[0]) + 1
        what = "duplicate" if int(offsets[t]) == int(offsets[t - 1]) else "unsorted"
        raise UpdateEncodingError(
            f"{kind} offsets of chunk {int(chunk_of[t])} are not strictly increasing: value "
            f"{t} has offset {int(offsets[t])} after {int(offsets[t - 1])} ({what})"
        )


def _unpack_values(kind: str, body: torch.Tensor, total: int) -> torch.Tensor:
    if kind == "sparse-int8":
        codes = body.view(torch.int8)
        low = codes == -_QMAX - 1
        if bool(low.any()):
            raise UpdateEncodingError(
                f"{kind} value {int(low.nonzero()[0])} is -128 (must be in [-127, 127])"
            )
        return codes.to(torch.float32)
    b = body.to(torch.int64)
    codes = torch.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, b >> 6], dim=1).reshape(-1)
    if bool((codes[total:] != 0).any()):
        raise UpdateEncodingError(f"{kind} padding bits after the last code are not zero")
    return _LEVELS[codes[:total]]
