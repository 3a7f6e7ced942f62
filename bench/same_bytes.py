"""This tree against another revision: every command's files on fixed inputs, compared byte for byte.

Run from the repository root:  python bench/same_bytes.py  [--base REV]

The other revision is checked out into a temporary git worktree (as ``bench/revision_bench.py`` does) and both
trees run the same commands, each a fresh process, over the same eight small PNGs with random weights: extract into
a file and into a shard folder, grad, cam (its folder of pictures), stats and compare of the model and of the
saved features, a comparison of two models, an edited extract, ablate and patch, and grid, report and
``info --json`` of what they wrote. Every file each tree wrote is listed with whether its bytes are the other's;
the exit status is 1 when any differs or is missing. A refactoring of the run must leave every format as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revision_bench import ROOT, checked_out, tree_environment  # noqa: E402

#: The model every command runs: resnet18 with random weights, over 32x32 crops.
MODEL = ["-m", "resnet18", "-w", "none", "--resize", "40", "--crop", "32", "-b", "4", "-q"]


def commands(images: list[str]) -> dict[str, list[str]]:
    """Each command run, by the name of what it writes (under the tree's output folder, ``OUT``)."""
    folder = str(Path(images[0]).parent)
    return {
        "extract.safetensors": [
            "extract", *MODEL, "-l", "layer2", "-l", "fc", *images, "-o", "OUT/extract.safetensors",
        ],
        "shards/": ["extract", *MODEL, "-l", "layer3", "--shard-size", "3", *images, "-o", "OUT/shards/"],
        "grad.safetensors": ["grad", *MODEL, "-l", "layer4", *images, "-o", "OUT/grad.safetensors"],
        "cam/": ["cam", *MODEL, "-l", "layer4", *images[:3], "-o", "OUT/cam"],
        "stats.safetensors": ["stats", *MODEL, "-l", "layer3", "--top", "2", *images, "-o", "OUT/stats.safetensors"],
        "saved.stats.safetensors": ["stats", "OUT/shards/", "--top", "2", "-q", "-o", "OUT/saved.stats.safetensors"],
        "compare.safetensors": ["compare", *MODEL, "-l", "layer*", *images, "-o", "OUT/compare.safetensors"],
        "two.compare.safetensors": [
            "compare", *MODEL, "-l", "layer4", "--model2", "resnet34", "--layer2", "layer3", "--method", "rsa",
            "--save-rdms", *images, "-o", "OUT/two.compare.safetensors",
        ],
        "saved.compare.safetensors": [
            "compare", "OUT/extract.safetensors", "-k", "layer2", "--key2", "fc", "-q", "-o",
            "OUT/saved.compare.safetensors",
        ],
        "edited.safetensors": [
            "extract", *MODEL, "-l", "layer3", "--intervene", "layer2:0:8=zero", *images,
            "-o", "OUT/edited.safetensors",
        ],
        "ablate.safetensors": [
            "ablate", *MODEL, "-l", "layer4", "--units", "0:6", *images, "-o", "OUT/ablate.safetensors",
        ],
        "patch.safetensors": [
            "patch", *MODEL, "-l", "layer3", "--pairs-from", folder, folder, "-o", "OUT/patch.safetensors",
        ],
        "grid/": ["grid", "OUT/extract.safetensors", "-k", "layer2", "--channels", "0:4", "-o", "OUT/grid"],
        "stats-grid/": ["grid", "OUT/stats.safetensors", "--channels", "0:2", "-o", "OUT/stats-grid"],
        "report/": ["report", "OUT/compare.safetensors", "-o", "OUT/report"],
        "info.json": ["info", "OUT/stats.safetensors", "--json"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare with [HEAD]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-bytes-") as folder:
        work = Path(folder)
        images = _images(work / "images")
        with checked_out(args.base, work / "other") as other:
            trees = {"this tree": ROOT, args.base: other}
            written = {label: _run(tree, work / "out", images, work) for label, tree in trees.items()}
        mine, theirs = written.values()
        differ = 0
        for name in sorted(set(mine) | set(theirs)):
            same = mine.get(name) == theirs.get(name)
            differ += not same
            state = "same" if same else "missing" if name not in mine or name not in theirs else "DIFFERS"
            print(f"{state:8s} {name}")
        print(f"{len(mine)} files, {differ} not the same")
        raise SystemExit(1 if differ else 0)


def _images(folder: Path) -> list[str]:
    folder.mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for number in range(8):
        path = folder / f"{number}.png"
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _run(tree: Path, out: Path, images: list[str], work: Path) -> dict[str, str]:
    """Every command run from ``tree`` into ``out`` (removed afterwards): each file written (and each command's
    stdout), by its path relative to ``out``, as its SHA-256."""
    out.mkdir()
    env = tree_environment(tree, work)
    found = {}
    for name, command in commands(images).items():
        argv = [part.replace("OUT", str(out)) for part in command]
        done = subprocess.run([sys.executable, "-m", "hookcli", *argv], cwd=work, env=env, capture_output=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed in {tree}: {done.stderr.decode()[-600:]}")
        found[f"{name} (stdout)"] = hashlib.sha256(done.stdout.replace(str(out).encode(), b"OUT")).hexdigest()
    for path in sorted(out.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(out))] = hashlib.sha256(_unstamped(path.read_bytes())).hexdigest()
    shutil.rmtree(out)  # the other tree writes to the same paths, which the files record
    return found


#: A source's stamp as a file records it (``"stamp": [size, mtime_ns]``, escaped once or twice in metadata): the
#: saved features each tree read were written moments apart, so their times differ and nothing else may.
_STAMP = re.compile(rb'(stamp\\*": )\[\d+, \d+\]')


def _unstamped(data: bytes) -> bytes:
    return _STAMP.sub(rb"\1null", data)


if __name__ == "__main__":
    main()
