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
    "device_of",
    "resolve_device",
]


def device_of(module):
    """The device of ``module``'s first parameter (or buffer); None for a module that holds no tensor.

    >>> device_of(torch.nn.Linear(2, 2)), device_of(torch.nn.ReLU())
    (device(type='cpu'), None)
    """
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return None


def resolve_device(spec: str, module=None):
    """Turn ``auto|cpu|cuda|cuda:N|mps`` into a ``torch.device`` that exists on this machine; ``auto`` is the device
    ``module`` (a caller's model) sits on when that is not the CPU."""
    spec = spec.strip().lower()
    if not DEVICE_PATTERN.fullmatch(spec):
        raise DeviceError(f"unknown device '{spec}'", hint="use auto, cpu, cuda, cuda:N or mps")
    if spec == "auto":
        held = device_of(module) if module is not None else None
        if held is not None and held.type != "cpu":
            return held
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
