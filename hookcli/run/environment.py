"""What this install and this machine give hookcli, checked one by one: ``hookcli doctor`` (:func:`check_install`).

The check that matters most is the pair torch and torchvision: pip installs a
CPU torch from one index and a CUDA torchvision from another without a word
where PyTorch's CPU index cannot be reached, and the pair fails only when
torchvision loads its operators. Here torchvision runs one of them.

>>> found = {check.name: check for check in check_install()}
>>> found["python"].ok, found["torch and torchvision"].ok
(True, True)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import warnings
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

from hookcli.errors import first_line, install_hint
from hookcli.models.specs import PACKAGES
from hookcli.models.weights import downloads_off
from hookcli.run.launch import usable_cores

__all__ = ["Check", "check_install"]

#: The oldest Python hookcli runs on.
_PYTHON = (3, 11)
#: The optional packages, as ``hookcli[extra]`` installs them: what each adds.
_EXTRAS = {
    "av": ("video", "video files"),
    **{package: (extra, f"{source}: models") for source, (package, extra) in PACKAGES.items()},
}
#: The distribution each importable package comes from, where their names differ.
_DISTRIBUTIONS = {"open_clip": "open_clip_torch"}


@dataclass(frozen=True)
class Check:
    """One thing checked: its ``name``, whether it is fine (``ok``: True; False where a command would fail; None
    for something optional that is absent), what was found (``detail``) and what to do (``hint``)."""

    name: str
    ok: bool | None
    detail: str
    hint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def check_install() -> list[Check]:
    """Every check, in order: Python, torch and torchvision together, the devices, GPU JPEG decoding, the extras, the
    weights cache and, where an extra brought the Hugging Face hub, its cache."""
    pair = _pair()
    checks = [_python(), pair]
    if pair.ok:
        checks += _devices()
    checks += [_extra(package) for package in _EXTRAS]
    checks.append(_weights_cache())
    if importlib.util.find_spec("huggingface_hub") is not None:
        checks.append(_hub_cache())
    return checks


def _python() -> Check:
    found = platform.python_version()
    numbers = tuple(int(number) for number in platform.python_version_tuple()[:3] if number.isdigit())
    if numbers == (3, 13, 0):  # its __dict__ versions do not hold: torch's compiler guards without them
        return Check("python", True, found, hint="--compile runs slower on Python 3.13.0; 3.13.1 or later mends it")
    if numbers[:2] >= _PYTHON:
        return Check("python", True, found)
    return Check("python", False, found, hint=f"hookcli needs Python {'.'.join(map(str, _PYTHON))} or later")


def _installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _pair() -> Check:
    """torch and torchvision, installed and loading together: torchvision runs one of its operators."""
    versions = {name: _installed(name) for name in ("torch", "torchvision")}
    missing = [name for name, found in versions.items() if found is None]
    if missing:
        return Check("torch and torchvision", False, f"{' and '.join(missing)} not installed", hint="pip install .")
    said = f"torch {versions['torch']}, torchvision {versions['torchvision']}"
    try:
        import torch
        import torchvision

        torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    except Exception as err:  # noqa: BLE001  # whatever loading them raises is what the check reports
        hint = install_hint(err) or 'pip install --force-reinstall "torch" "torchvision"'
        return Check("torch and torchvision", False, f"{said}: {first_line(err)}", hint=hint)
    return Check("torch and torchvision", True, f"{said}: they load together")


def _devices() -> list[Check]:
    import torch

    cores = usable_cores()
    cpu = f"{cores} core{'s' if cores != 1 else ''} for this process"
    with warnings.catch_warnings(record=True) as said:  # why CUDA did not start, where torch says (no note in runs)
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        names = [torch.cuda.get_device_name(n) for n in range(torch.cuda.device_count())]
        cudnn = torch.backends.cudnn.version()
        found = f"{len(names)} CUDA GPU{'s' if len(names) != 1 else ''} ({', '.join(sorted(set(names)))}), CUDA "
        found += f"{torch.version.cuda}, cuDNN {cudnn}; {cpu}"
        return [Check("devices", True, found), _gpu_jpeg()]
    if torch.backends.mps.is_available():
        return [Check("devices", True, f"Apple GPU (--device mps); {cpu}")]
    cuda = torch.version.cuda
    build = f"a CUDA {cuda} build of torch, and" if cuda else "a CPU build of torch, and"
    why = next((first_line(w.message) for w in said if str(w.message).startswith("CUDA initialization")), None)
    return [Check("devices", True, f"{cpu}; {build} no GPU: runs on the CPU" + (f" ({why})" if why else ""))]


def _gpu_jpeg() -> Check:
    """``--decode device``: nvImageCodec where it starts, else torchvision's nvJPEG decoder, run on a JPEG of one
    pixel."""
    import torch
    from torchvision.io import decode_jpeg, encode_jpeg

    from hookcli.inputs.decoding import NVIMGCODEC, device_jpeg_decoder

    if device_jpeg_decoder(torch.device("cuda")) == NVIMGCODEC:
        return Check("GPU JPEG decoding", True, "--decode device decodes JPEGs on the GPU (nvImageCodec)")
    try:
        encoded = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
        decode_jpeg(encoded, device="cuda")
    except Exception as err:  # noqa: BLE001  # a torchvision built without nvJPEG says so in its own words
        return Check("GPU JPEG decoding", None, f"--decode device is unavailable: {first_line(err)}")
    return Check(
        "GPU JPEG decoding",
        True,
        "--decode device decodes JPEGs on the GPU (torchvision's nvJPEG; nvImageCodec's pixels are libjpeg's to a "
        "level)",
        hint='pip install "hookcli[gpu-decode-cu13]" (or -cu12, as torch\'s CUDA)',
    )


def _extra(package: str) -> Check:
    extra, adds = _EXTRAS[package]
    name = f"{adds} ({package})"
    found = _installed(_DISTRIBUTIONS.get(package, package))
    if found is None or importlib.util.find_spec(package) is None:
        return Check(name, None, "not installed", hint=f'pip install "hookcli[{extra}]"')
    return Check(name, True, found)


def _weights_cache() -> Check:
    """Where pretrained torchvision weights are kept, and whether downloads are off."""
    home = os.environ.get("TORCH_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch"
    )
    folder = os.path.join(home, "hub", "checkpoints")
    files = len(os.listdir(folder)) if os.path.isdir(folder) else 0
    offline = downloads_off()
    detail = f"{folder}: {files} file{'s' if files != 1 else ''}" + (
        "; downloads off (HOOKCLI_OFFLINE)" if offline else ""
    )
    return Check("weights cache", True, detail)


def _hub_cache() -> Check:
    """The Hugging Face cache that timm, OpenCLIP and ``hf:`` models are read from, offline whatever
    ``HF_HUB_OFFLINE`` says, and how many models it holds."""
    try:
        from huggingface_hub import constants
    except Exception as err:  # noqa: BLE001  # a hub that cannot load is a cache nothing reads
        return Check(
            "Hugging Face cache", False, first_line(err), hint='pip install --force-reinstall "huggingface_hub"'
        )
    folder = str(constants.HF_HUB_CACHE)
    models = len(glob.glob(os.path.join(glob.escape(folder), "models--*")))
    detail = f"{folder}: {models} model{'s' if models != 1 else ''}; read offline, never downloaded"
    return Check("Hugging Face cache", True, detail)
