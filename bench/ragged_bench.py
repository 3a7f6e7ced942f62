"""Ragged rows on disk: file size, wall time and peak memory of a segmentation run over photos of extreme aspect
ratios, this tree against another revision, side by side.

Run from the repository root:  python bench/ragged_bench.py  [--base REV] [--images 16] [--resize 96]

Half the photos are 8:1, half 1:8 (made from the sample photo of Grace Hopper); lraspp_mobilenet_v3_large with
random weights stores its ``classifier`` and ``backbone.4`` (rows of their own shapes, no ``--crop``) into one
file. Each tree runs the same command in a fresh process, from the tree's own folder (``-c`` puts the current
folder first on the module path, ``PYTHONPATH`` after it; the other revision
is checked out into a temporary git worktree); the peak is the process's resident high-water mark.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent

_RUN = """
import sys
from hookcli.cli import main
try:
    main(sys.argv[1:], prog_name="hookcli")
except SystemExit as end:
    assert not end.code, end.code
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) // 1024)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--resize", type=int, default=96)
    args = parser.parse_args()
    photo = Image.open(__import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "photos"
        folder.mkdir()
        for number in range(args.images):
            size = (800, 100) if number % 2 else (100, 800)
            photo.convert("RGB").resize(size).save(folder / f"{number:03d}.jpg")
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), args.base], cwd=ROOT, check=True)
        try:
            print(f"{args.images} photos of 8:1 and 1:8, --resize {args.resize}")
            print(f"{'tree':<12} {'file MiB':>9} {'wall s':>7} {'peak MiB':>9}")
            for name, tree in (("this tree", ROOT), (args.base, base)):
                out = Path(scratch) / f"{name.replace(' ', '_')}.safetensors"
                command = [
                    *("extract", "-m", "lraspp_mobilenet_v3_large", "-w", "none", "-q"),
                    *("-l", "classifier", "-l", "backbone.4", "--resize", str(args.resize), "-b", "4"),
                    *("-o", str(out), str(folder)),
                ]
                env = {**os.environ, "PYTHONPATH": str(tree)}
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", _RUN, *command],
                    cwd=tree,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                wall = time.perf_counter() - start
                size = out.stat().st_size / 2**20
                print(f"{name:<12} {size:>9.1f} {wall:>7.1f} {done.stdout.split()[-1]:>9}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
