"""Where a node's local steps run and in what precision (``cnode train --device/--precision``).

Only the node's own computation moves: local steps and the held-out loss report. What other
nodes must reproduce bit for bit (decoding, aggregation, the outer step, the state and its CIDs,
replay) stays on the CPU in float32 whatever the device (specs/training.md#devices).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from .._config import PRECISIONS
from .._exceptions import DeviceError

__all__ = ["DEVICE_CHOICES", "Placement", "autocast", "resolve_device"]

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps"
_CUDA = re.compile(r"cuda(?::(\d+))?")


@dataclass(frozen=True)
class Placement:
    """A resolved device and precision, and how the device was chosen (for the log)."""

    device: torch.device
    precision: str = "fp32"
    said: str = "cpu"

    @classmethod
    def resolve(cls, device: str, precision: str) -> Placement:
        """``device`` as ``--device`` takes it; ``precision`` one of PRECISIONS."""
        if precision not in PRECISIONS:
            raise DeviceError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        picked, said = resolve_device(device)
        return cls(picked, precision, said)


def _cuda_name(index: int) -> str:
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(spec: str) -> tuple[torch.device, str]:
    """The torch device ``spec`` names, and a line saying what was picked and why.

    ``auto`` takes CUDA device 0 when torch sees one, else MPS, else the CPU. A device torch
    does not see, or a name that is none of DEVICE_CHOICES, is a :class:`DeviceError`.
    """
    name = spec.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0), f"auto: torch sees a GPU, picked {_cuda_name(0)}"
        if _mps_available():
            return torch.device("mps"), "auto: torch sees Apple's GPU, picked mps"
        return torch.device("cpu"), "auto: torch sees no GPU, picked cpu"
    if name == "cpu":
        return torch.device("cpu"), "cpu (asked for)"
    match = _CUDA.fullmatch(name)
    if match is not None:
        if not torch.cuda.is_available():
            built = torch.version.cuda or "no CUDA (a CPU-only build)"
            raise DeviceError(
                f"device {spec!r}: torch sees no CUDA device (torch {torch.__version__}, built "
                f"with {built}); use --device cpu or auto"
            )
        index = int(match.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise DeviceError(
                f"device {spec!r}: torch sees {count} CUDA device(s), cuda:0..cuda:{count - 1}"
            )
        return torch.device("cuda", index), f"{_cuda_name(index)} (asked for)"
    if name == "mps":
        if not _mps_available():
            raise DeviceError(f"device {spec!r}: torch sees no MPS (Apple GPU) device")
        return torch.device("mps"), "mps (asked for)"
    raise DeviceError(f"unknown device {spec!r} (known: {DEVICE_CHOICES})")


def autocast(placement: Placement) -> contextlib.AbstractContextManager[object]:
    """The forward/backward context of ``placement.precision``: bf16 autocast or nothing.

    Under autocast the parameters stay float32 (the master weights): matrix products run in
    bfloat16, reductions and the loss in float32, and the gradients arrive in float32.
    """
    if placement.precision == "bf16-mixed":
        return torch.autocast(device_type=placement.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
