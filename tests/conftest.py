"""Shared fixtures. Tests never touch the network or the home folder: torch's cache and hookcli's model registry
cache are temp folders (one for the session, removed at its end) and downloads are off."""

import atexit
import functools
import os
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap

_SESSION = tempfile.mkdtemp(prefix="hookcli-tests-")
atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)


def _session_folder(name: str) -> str:
    """A folder of this test session's own temp folder, made now."""
    path = os.path.join(_SESSION, name)
    os.makedirs(path)
    return path


os.environ["TORCH_HOME"] = _session_folder("torch-home")
os.environ["HOOKCLI_CACHE_DIR"] = _session_folder("cache")
os.environ["HOOKCLI_OFFLINE"] = "1"
# The Hugging Face cache (transformers, timm and OpenCLIP pretrained files) is a temp folder, and offline.
os.environ["HF_HOME"] = _session_folder("hf-home")
os.environ["HF_HUB_CACHE"] = os.path.join(os.environ["HF_HOME"], "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HOOKCLI_DEBUG", None)
# Tests (and the processes they start) are not parts of a launcher's run, even when the suite runs under one.
for _name in [name for name in os.environ if name.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))]:
    del os.environ[_name]


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker keeps its own slice of the cores (before torch starts its threads).

    Otherwise every worker's torch uses every core, and each GPU run starts a decode process a core: 16 workers on
    16 cores ran 256 threads and up to 240 decode processes, and tests ran out of time.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if workers < 2 or not name.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // workers)
    start = int(name[2:]) * share % len(cores)
    os.sched_setaffinity(0, cores[start : start + share] or cores[:share])


_share_the_cores()

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from hookcli.cli import main  # noqa: E402


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


def _resnet18_args(command: str, *args) -> list[str]:
    return [command, "-m", "resnet18", "-w", "none", *map(str, args)]


@pytest.fixture
def resnet18_args():
    """``resnet18_args(command, *args)``: the arguments of ``hookcli COMMAND`` on a randomly initialised resnet18
    (nothing to download), then ``args`` as strings."""
    return _resnet18_args


#: Extracting resnet18's fc from 32×32 crops, in batches and shards of 2: a quick run writing a folder of shards.
_SHARD_RUN = _resnet18_args("extract", "-l", "fc", "--resize", 32, "--crop", 32, "-b", 2, "-q", "--shard-size", 2)


@pytest.fixture
def shard_run():
    """The arguments of a quick ``hookcli extract`` into a folder of shards of 2 (``-o DIR/`` and inputs to add):
    resnet18's fc from 32×32 crops, in batches of 2, quietly."""
    return list(_SHARD_RUN)


@pytest.fixture
def five_inputs(tmp_path) -> list[str]:
    """Five small distinct PNGs (36×36) in tmp_path/imgs, named 0 to 4, as path strings."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    return [str(_write_noise(folder / f"{i}.png", size=(36, 36), seed=i)) for i in range(5)]


@pytest.fixture
def extract_into(runner):
    """``extract_into(folder, inputs, *extra)``: the :func:`shard_run` of ``inputs`` into shard folder ``folder``
    (options ``extra`` added), through CliRunner."""

    def extract(folder, inputs, *extra):
        return runner.invoke(main, [*_SHARD_RUN, *extra, "-o", f"{folder}/", *inputs])

    return extract


def _crafted_copy(source: Path, path: Path, change) -> Path:
    tensors = load_file(source)
    with safe_open(source, "np") as opened:
        metadata = opened.metadata()
    change(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.fixture
def crafted_copy():
    """``crafted_copy(source, path, change)``: a copy of the safetensors file ``source`` written to ``path`` by
    safetensors itself, with ``change(tensors, metadata)`` made to its numpy arrays and metadata first."""
    return _crafted_copy


def _one_error(result, code=2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.stderr.count("\n") == 1, result.stderr
    return result.stderr.strip()


def _next_line(stream, seconds: float) -> str:
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else ""


@pytest.fixture
def next_line():
    """``next_line(stream, seconds)``: the next line a process writes on ``stream`` (a pipe), or '' when none comes
    within ``seconds``: a test that waits for a process to speak fails rather than hangs."""
    return _next_line


@pytest.fixture
def one_error():
    """``one_error(result, code=2)``: the one ``Error:`` line a CliRunner result printed, no traceback, after
    checking its exit code."""
    return _one_error


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
    _refuse_models(monkeypatch)


@pytest.fixture
def refuse_models(monkeypatch):
    """``refuse_models()``: from then on, as :func:`no_model`, for a test that runs a model first."""
    return functools.partial(_refuse_models, monkeypatch)


def _refuse_models(monkeypatch):
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
    # No GPU in there: CUDA reserves its address space as it starts, so under the limit it fails to start, and
    # what it kept leaves too little for the rest (what is measured here is the inputs' cost, on any machine).
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *map(str, args)], capture_output=True, text=True, timeout=300, env=environment
    )
    code, peak, stderr = done.stdout.rstrip("\n").split("\t")
    return int(code), int(peak), stderr


@pytest.fixture
def peak_of():
    """``peak_of(*args)``: exit code, peak memory in bytes and stderr (lines joined by `` | ``) of ``hookcli ARGS``
    run in a process limited to 4 GiB of address space, with no GPU."""
    return _peak


@pytest.fixture
def browser():
    """Headless Chromium through chromedriver, logging the console; skipped only where Chromium, its driver or
    selenium is missing (.ci/run installs all three)."""
    missing = [path for path in ("/usr/bin/chromium", "/usr/bin/chromedriver") if not Path(path).exists()]
    if missing:
        pytest.skip(
            f"needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver): no {missing[0]}"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs the selenium package (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
        f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-', dir=_SESSION)}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()
