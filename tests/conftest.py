"""Shared fixtures. Tests never touch the network or the home folder: torch's cache and hookcli's model registry
cache are temp folders and downloads are off."""

import functools
import os
import subprocess
import sys
import tempfile
import textwrap

os.environ["TORCH_HOME"] = tempfile.mkdtemp(prefix="hookcli-torch-home-")
os.environ["HOOKCLI_CACHE_DIR"] = tempfile.mkdtemp(prefix="hookcli-cache-")
os.environ["HOOKCLI_OFFLINE"] = "1"
# The Hugging Face cache (transformers, timm and OpenCLIP pretrained files) is a temp folder, and offline.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hookcli-hf-home-")
os.environ["HF_HUB_CACHE"] = os.path.join(os.environ["HF_HOME"], "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HOOKCLI_DEBUG", None)

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from PIL import Image  # noqa: E402


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture(scope="session")
def photo() -> Path:
    """A real photo that ships with matplotlib (Grace Hopper, 512×600 JPEG)."""
    import matplotlib.cbook

    return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def _write_noise(path: Path, size=(48, 40), seed=0, mode="RGB") -> Path:
    """Write a random-noise image of the given mode to ``path``."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").convert(mode).save(path)
    return path


@pytest.fixture
def make_image():
    """``make_image(path, size=(w, h), seed=0, mode="RGB")`` writes a noise image and returns its path."""
    return _write_noise


@pytest.fixture
def images(tmp_path) -> list[Path]:
    """Three small distinct PNGs (lossless, so exact comparisons hold) in tmp_path/imgs: a, b, c."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    return [_write_noise(folder / f"{name}.png", seed=i) for i, name in enumerate("abc")]


@pytest.fixture
def calls_to(monkeypatch):
    """``calls_to(*functions)``: a list that gets a function's name each time hookcli calls it (by whichever module's
    name for it), the call going on as before."""
    calls: list[str] = []

    def count(*functions):
        for function in functions:
            counting = functools.partial(_counted, calls, function)
            for name, module in list(sys.modules.items()):
                if name.startswith("hookcli") and getattr(module, function.__name__, None) is function:
                    monkeypatch.setattr(module, function.__name__, counting)
        return calls

    return count


def _counted(calls: list, function, *args, **kwargs):
    calls.append(function.__name__)
    return function(*args, **kwargs)


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails loudly (AssertionError "the model was loaded"): a refusal that should come before it
    shows up as that error."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("hookcli.models.loading.build_model", refuse)


_MEASURE = textwrap.dedent("""
    import resource, subprocess, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a runaway fails fast instead of eating the machine
    done = subprocess.run([sys.executable, "-m", "hookcli", *sys.argv[1:]], capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(done.returncode, peak, done.stderr.strip().replace("\\n", " | "), sep="\\t")
""")


def _peak(*args) -> tuple[int, int, str]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *map(str, args)], capture_output=True, text=True, timeout=300
    )
    code, peak, stderr = done.stdout.rstrip("\n").split("\t")
    return int(code), int(peak), stderr


@pytest.fixture
def peak_of():
    """``peak_of(*args)``: exit code, peak memory in bytes and stderr (lines joined by `` | ``) of ``hookcli ARGS``
    run in a process limited to 4 GiB of address space."""
    return _peak
