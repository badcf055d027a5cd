"""The torch side of checkpoints: dtypes, a tensor's bytes without a copy, filling a tensor.

Kept apart so that ``import cnode.storage`` (and so every ``cnode`` command) does not import
torch; only saving and loading tensors do.
"""

from __future__ import annotations

import torch

from . import limits
from ._blockstore import BlockStore
from ._cid import compute_cid
from ._exceptions import CheckpointError
from ._manifest import Layer, chunk_length, chunk_offset, iter_chunks

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest name of a torch dtype; CheckpointError if it is not supported."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise CheckpointError(
            f"dtype {dtype} is not supported (supported: {', '.join(TORCH_DTYPES)})"
        ) from None


def tensor_bytes(name: str, tensor: object) -> tuple[str, memoryview]:
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"layer {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.layout is not torch.strided or tensor.is_quantized:
        raise CheckpointError(f"layer {name!r}: only dense (strided) tensors can be stored")
    dtype = dtype_name(tensor.dtype)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return dtype, t.reshape(-1).view(torch.uint8).numpy().data


def tensor_layer(name: str, tensor: object) -> Layer:
    """The layer entry of ``tensor``: dtype, shape, length and the CIDs of its chunks."""
    check_tensor(name, tensor)
    assert isinstance(tensor, torch.Tensor)
    dtype, data = tensor_bytes(name, tensor)
    chunks = tuple(compute_cid(chunk) for chunk in iter_chunks(data))
    return Layer(name, dtype, tuple(tensor.shape), len(data), chunks)


def count_nonfinite(dtype: str, data: memoryview) -> int:
    """How many NaN/Inf values whole elements of ``dtype`` in ``data`` hold (0 for integers)."""
    torch_dtype = TORCH_DTYPES[dtype]
    if not torch_dtype.is_floating_point or not len(data):
        return 0
    values = torch.frombuffer(data, dtype=torch_dtype)
    return int(values.numel() - torch.isfinite(values).sum())


class NonfiniteCounter:
    """Counts the NaN/Inf values of one tensor's chunks as they stream past (HF import)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.count = 0

    def __call__(self, chunk: memoryview) -> None:
        self.count += count_nonfinite(self.dtype, chunk)


def check_tensor(name: str, tensor: object) -> int:
    """Check one state-dict entry before anything is written; return its byte length."""
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"layer {name!r} is a {type(tensor).__name__}, not a tensor")
    dtype_name(tensor.dtype)
    if tensor.dim() > limits.MAX_DIMS:
        raise CheckpointError(f"layer {name!r} has more than MAX_DIMS {limits.MAX_DIMS} dims")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes > limits.MAX_LAYER_BYTES:
        raise CheckpointError(f"layer {name!r} exceeds MAX_LAYER_BYTES")
    return nbytes


def load_layer(store: BlockStore, layer: Layer) -> torch.Tensor:
    """One tensor, allocated once and filled with verified chunk bytes."""
    tensor = torch.empty(layer.shape, dtype=TORCH_DTYPES[layer.dtype])
    if layer.nbytes:
        view = tensor.reshape(-1).view(torch.uint8).numpy().data
        for index, cid in enumerate(layer.chunks):
            start = chunk_offset(index)
            store.readinto(cid, view[start : start + chunk_length(layer.nbytes, index)])
    return tensor
