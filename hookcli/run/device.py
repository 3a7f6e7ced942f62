"""Pick the torch device a run uses.

``auto`` means the first CUDA GPU when there is one, else the CPU.

>>> resolve_device("cpu")
device(type='cpu')
"""

from __future__ import annotations

import torch

from hookcli.errors import DeviceError
from hookcli.parsing import DEVICE_PATTERN

__all__ = [
    "resolve_device",
]


def resolve_device(spec: str):
    """Turn ``auto|cpu|cuda|cuda:N|mps`` into a ``torch.device`` that exists on this machine."""
    spec = spec.strip().lower()
    if not DEVICE_PATTERN.fullmatch(spec):
        raise DeviceError(f"unknown device '{spec}'", hint="use auto, cpu, cuda, cuda:N or mps")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available on this machine", hint="use --device cpu (or auto)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"there is no GPU {spec} (this machine has {count})", hint=f"use cuda:0 … cuda:{count - 1}"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError("MPS is not available on this machine", hint="use --device cpu (or auto)")
    return device
