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
import sys
import tempfile
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import measured  # noqa: E402  (bench/ is no package)
from revision_bench import ROOT, checked_out  # noqa: E402


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
        with checked_out(args.base, Path(scratch) / "base") as base:
            print(f"{args.images} photos of 8:1 and 1:8, --resize {args.resize}")
            print(f"{'tree':<12} {'file MiB':>9} {'wall s':>7} {'peak MiB':>9}")
            for name, tree in (("this tree", ROOT), (args.base, base)):
                out = Path(scratch) / f"{name.replace(' ', '_')}.safetensors"
                command = [
                    *("extract", "-m", "lraspp_mobilenet_v3_large", "-w", "none", "-q"),
                    *("-l", "classifier", "-l", "backbone.4", "--resize", str(args.resize), "-b", "4"),
                    *("-o", str(out), str(folder)),
                ]
                wall, peak = measured(command, tree)
                print(f"{name:<12} {out.stat().st_size / 2**20:>9.1f} {wall:>7.1f} {peak:>9}")


if __name__ == "__main__":
    main()
