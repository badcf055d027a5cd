"""Update codecs: how a peer's float32 update is put into bytes, and read back bit-identically.

Four codecs (specs/training.md#update-codecs):

* ``f32``: the tensor as it is (float32, its shape);
* ``bf16``: rounded to bfloat16 (its shape); decoding widens to float32, exactly;
* ``int8-blockwise``: blockwise absmax 8-bit quantization, the scheme of bitsandbytes'
  ``quantize_blockwise`` (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022)
  and of hivemind's ``hivemind.compression`` (used by "Training Transformers Together"), with a
  linear code instead of a dynamic one: the flattened tensor is cut into blocks of
  ``CODEC_BLOCK`` values; each block keeps one float32 ``scale = absmax / 127`` and one int8
  ``round(x / scale)`` in [-127, 127] per value. One layer's bytes are
  ``B x float32 LE scales`` then ``n x int8 values``, ``B = ceil(n / CODEC_BLOCK)``, stored as
  a 1-D uint8 tensor.
* ``sparse-topk``: per chunk of ``SPARSE_CHUNK`` values the K largest magnitudes, 2 bits each,
  with 12-bit offsets (``_sparse.py``). On the wire its name carries K: ``sparse-topk:64``
  (:func:`wire_codec`); a partition's aggregate of a sparse run travels as ``sparse-int8:2K``
  (:func:`result_codec`).

Encoding runs on the sender only. Decoding runs on every receiver and must give the same bytes
everywhere: it is ``float32(int8) * float32(scale)``, one exactly rounded IEEE product per
element with no reduction, so neither the thread count nor the order of work can change it.
A malformed encoding raises :class:`UpdateEncodingError` with the reason.
"""

from __future__ import annotations

import math

import torch

from . import limits
from ._exceptions import AggregationInputError, UpdateEncodingError
from ._sparse import decode_sparse, encode_sparse, parse_sparse, sparse_nbytes_max

__all__ = [
    "CODECS",
    "decode_update_tensor",
    "encode_update_tensor",
    "encoded_nbytes",
    "result_codec",
    "wire_codec",
]

# The codecs a run may name (training.update_codec).
CODECS = ("bf16", "f32", "int8-blockwise", "sparse-topk")
_QMAX = 127
# The largest scale whose products stay finite: 127 x scale <= float32 max.
_MAX_SCALE = torch.finfo(torch.float32).max / _QMAX


def wire_codec(name: str, density: float) -> str:
    """The codec string updates of a run travel and are recorded with: ``name``, or for
    ``sparse-topk`` ``sparse-topk:K`` with ``K = round(density x SPARSE_CHUNK)`` in
    1..SPARSE_CHUNK (the receiver's bound on values per chunk)."""
    _check_codec(name)
    if name != "sparse-topk":
        return name
    if not (math.isfinite(density) and 0 < density <= 1):
        raise AggregationInputError(f"update density {density!r} is not in (0, 1]")
    k = min(limits.SPARSE_CHUNK, max(1, round(density * limits.SPARSE_CHUNK)))
    return f"sparse-topk:{k}"


def result_codec(codec: str) -> str:
    """How a partition's aggregate of updates encoded with ``codec`` travels: the same codec,
    except that a sparse run's aggregate keeps SPARSE_RESULT_FACTOR x K values per chunk with
    8 bits each (``sparse-int8:2K``; it is not error-fed, so it gets more bits)."""
    parsed = parse_sparse(codec)
    if parsed is None:
        _check_codec(codec)
        return codec
    k = min(limits.SPARSE_CHUNK, limits.SPARSE_RESULT_FACTOR * parsed[1])
    return f"sparse-int8:{k}"


def _check_codec(codec: str) -> None:
    if codec not in CODECS and parse_sparse(codec) is None:
        raise AggregationInputError(f"unknown update codec {codec!r} (known: {', '.join(CODECS)})")


def encoded_nbytes(numel: int, codec: str) -> int:
    """How many bytes ``codec`` makes of a tensor of ``numel`` values (for a sparse codec the
    most it can make: every chunk at its quota)."""
    _check_codec(codec)
    if parse_sparse(codec) is not None:
        return sparse_nbytes_max(numel, codec)
    if codec == "f32":
        return 4 * numel
    if codec == "bf16":
        return 2 * numel
    return 4 * math.ceil(numel / limits.CODEC_BLOCK) + numel


def encode_update_tensor(tensor: torch.Tensor, codec: str) -> torch.Tensor:
    """Encode one float32 update tensor with ``codec`` (see the module docstring).

    NaN or Inf in a block give that block a NaN or Inf scale (and zero values): the bytes then
    carry the fault, and every receiver rejects them with a reason, as it rejects NaN in f32.
    """
    _check_codec(codec)
    if tensor.dtype != torch.float32:
        raise AggregationInputError(f"an update tensor is float32, not {tensor.dtype}")
    t = tensor.detach().cpu().contiguous()
    if codec == "f32":
        return t
    if codec == "bf16":
        return t.to(torch.bfloat16)
    if parse_sparse(codec) is not None:
        return encode_sparse(t.reshape(-1), codec)
    flat = t.reshape(-1)
    n = flat.numel()
    blocks = math.ceil(n / limits.CODEC_BLOCK)
    padded = torch.zeros(blocks * limits.CODEC_BLOCK, dtype=torch.float32)
    padded[:n] = flat
    rows = padded.view(blocks, limits.CODEC_BLOCK)
    absmax = rows.abs().amax(dim=1)  # NaN propagates; +-Inf shows as Inf
    scales = absmax / _QMAX
    usable = torch.isfinite(scales) & (scales > 0)
    divisor = torch.where(usable, scales, torch.ones_like(scales)).unsqueeze(1)
    q = torch.round(rows / divisor).clamp_(-_QMAX, _QMAX)
    q = torch.where(usable.unsqueeze(1), q, torch.zeros_like(q)).to(torch.int8)
    out = torch.empty(4 * blocks + n, dtype=torch.uint8)
    out[: 4 * blocks] = scales.view(torch.uint8)
    out[4 * blocks :] = q.reshape(-1)[:n].view(torch.uint8)
    return out


def decode_update_tensor(encoded: torch.Tensor, codec: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode one tensor of ``shape`` encoded with ``codec``; a new float32 tensor.

    Raises:
        UpdateEncodingError: the dtype, shape or length is wrong, a scale is NaN, Inf, negative
            or so large that a value would overflow, or a value is -128 (outside [-127, 127]);
            for a sparse codec also (``decode_sparse``) a chunk with too many values, an offset
            out of range, duplicate or unsorted, or a padding bit set.
    """
    _check_codec(codec)
    numel = math.prod(shape)
    if codec in ("f32", "bf16"):
        want = torch.float32 if codec == "f32" else torch.bfloat16
        if encoded.dtype != want:
            raise UpdateEncodingError(f"{codec} stores {want}, got {encoded.dtype}")
        if tuple(encoded.shape) != tuple(shape):
            raise UpdateEncodingError(f"shape {tuple(encoded.shape)}, expected {tuple(shape)}")
        return encoded.to(torch.float32).contiguous()
    if parse_sparse(codec) is not None:
        return decode_sparse(encoded, codec, numel).reshape(shape)
    if encoded.dtype != torch.uint8 or encoded.dim() != 1:
        raise UpdateEncodingError(
            f"int8-blockwise stores 1-D uint8 bytes, got {encoded.dtype} of shape "
            f"{tuple(encoded.shape)}"
        )
    blocks = math.ceil(numel / limits.CODEC_BLOCK)
    want_len = 4 * blocks + numel
    if encoded.numel() != want_len:
        raise UpdateEncodingError(
            f"int8-blockwise length {encoded.numel()} bytes, expected {want_len} "
            f"({blocks} scales + {numel} values)"
        )
    data = encoded.contiguous()
    scales = data[: 4 * blocks].view(torch.float32)
    values = data[4 * blocks :].view(torch.int8)
    if blocks:
        bad = ~(torch.isfinite(scales) & (scales >= 0) & (scales <= _MAX_SCALE))
        if bool(bad.any()):
            block = int(bad.nonzero()[0])
            raise UpdateEncodingError(
                f"int8-blockwise scale of block {block} is {float(scales[block])!r} "
                f"(must be finite, >= 0 and <= {_MAX_SCALE:.6g})"
            )
    low = values == -_QMAX - 1
    if bool(low.any()):
        raise UpdateEncodingError(
            f"int8-blockwise value {int(low.nonzero()[0])} is -128 (must be in [-127, 127])"
        )
    # The same product per element as float32(values) * scale of its block, written once into
    # the output: whole blocks as rows times their scale, then the short last block.
    out = torch.empty(numel, dtype=torch.float32)
    full = numel // limits.CODEC_BLOCK
    head = full * limits.CODEC_BLOCK
    if full:
        rows = values[:head].view(full, limits.CODEC_BLOCK)
        torch.mul(rows, scales[:full].unsqueeze(1), out=out[:head].view(full, limits.CODEC_BLOCK))
    if head < numel:
        torch.mul(values[head:], scales[full], out=out[head:])
    return out.reshape(shape)
