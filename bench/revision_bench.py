"""This tree against another revision: whole-command wall times of both, side by side, in alternating rounds.

Run from the repository root:  python bench/revision_bench.py  [--base REV] [--repeat 3] [--images 160]

The other revision is checked out into a temporary git worktree and run from
there (``PYTHONPATH`` points each process at its own tree; both use this
environment's packages). Commands, each a fresh process with the model
registry cache warm:

- ``hookcli --help``; ``hookcli models``; an unknown model refused
  (``extract -m resnet5 …``): start-up, no torch;
- ``extract -m resnet18 -w none -l layer3`` over one image, and over
  ``--images`` images (64x64 crops of 96x80 JPEGs, batch 16, into a file).

Rounds alternate the trees; the median of ``--repeat`` runs is kept, and the
ratio printed is this tree's time ÷ the other's (1.00 = unchanged).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent

#: The extract both trees run: resnet18's layer3, random weights, small crops.
EXTRACT = "extract -m resnet18 -w none -l layer3 --resize 80 --crop 64".split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--images", type=int, default=160)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-revision-") as folder:
        work = Path(folder)
        with checked_out(args.base, work / "other") as other:
            images = _images(work / "images", args.images)
            many = work / "many.safetensors"
            commands = {
                "--help": ["--help"],
                "models": ["models"],
                "unknown model": ["extract", "-m", "resnet5", "-l", "layer1", str(images[0])],
                "one image": [*EXTRACT, str(images[0]), "-o", str(work / "one.safetensors"), "-f"],
                f"{args.images} images": [*EXTRACT, "-b", "16", str(work / "images"), "-o", str(many), "-f"],
            }
            env = {**os.environ, "HOOKCLI_CACHE_DIR": str(work / "cache")}
            trees = {"this tree": ROOT, args.base: other}
            for tree in trees.values():  # warm the registry cache and the file system
                _time(tree, ["models"], env)
            times: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.repeat):
                for name, command in commands.items():
                    for label, tree in trees.items():
                        times.setdefault((name, label), []).append(_time(tree, command, env))
            print(f"{'command':16s} {'this tree':>10s} {args.base:>12s}  ratio")
            for name in commands:
                mine, theirs = (statistics.median(times[name, label]) for label in trees)
                print(f"{name:16s} {mine:9.2f}s {theirs:11.2f}s  {mine / theirs:5.2f}x")


@contextlib.contextmanager
def checked_out(revision: str, folder: Path) -> Iterator[Path]:
    """``revision`` checked out at ``folder`` (a temporary git worktree of this repository) while inside."""
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(folder), revision], cwd=ROOT, check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, check=True)


def tree_environment(tree: Path, work: Path) -> dict[str, str]:
    """This environment for a process of ``tree``: its own code first, a registry cache in ``work``, offline."""
    return {**os.environ, "PYTHONPATH": str(tree), "HOOKCLI_CACHE_DIR": str(work / "cache"), "HOOKCLI_OFFLINE": "1"}


def _images(folder: Path, count: int) -> list[Path]:
    folder.mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for number in range(count):
        path = folder / f"{number:04d}.jpg"
        Image.fromarray(rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def _time(tree: Path, command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hookcli", *command], cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True
    )
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(command)} failed in {tree}: {done.stderr.decode()[-400:]}")
    return elapsed


if __name__ == "__main__":
    main()
