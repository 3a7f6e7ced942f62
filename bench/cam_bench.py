"""cam images/s, this tree against another revision, side by side, with the files Pillow opens for each image.

Run from the repository root:  python bench/cam_bench.py  [--base REV] [--images 24] [--repeat 2]

A cam run decodes each image for the model and draws its map over the photo: ``cam`` used to decode it again for
the picture (and to open it a third time, for its size, for a model without a crop); it now makes the picture
from the decode the model was given. The images are photo-sized JPEGs (800×600 and 1600×1200, crops of the
sample photo that ships with matplotlib); the models are small and randomly initialised (``--weights none``), at
small sizes, so that what is not the model shows.

The other revision is checked out into a temporary git worktree. Each case runs in a fresh process per tree, from
the tree's folder (``python -c`` puts the current folder first on the module path), rounds alternating the trees;
a process loads the model once, runs cam over a few images to warm up, then times three runs over all of them,
decoding in the process (``workers=0``, where every decode is counted) with one thread, keeps the fastest, and
counts the times ``PIL.Image.open`` was called. Printed: the median of ``--repeat`` rounds, in images per second of
wall time and per second of the process's CPU time (which other processes on a busy machine disturb less), and
the ratio of the latter, this tree's ÷ the other's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from extract_bench import make_images  # noqa: E402
from revision_bench import checked_out  # noqa: E402

#: (name, model, its default CAM layer, resize, crop or None, photo size); the layer is named so that the timed run
#: does not spend its first second finding it.
CASES = [
    ("resnet18 80/64, 800x600", "resnet18", "layer4", 80, 64, (800, 600)),
    ("resnet18 80/64, 1600x1200", "resnet18", "layer4", 80, 64, (1600, 1200)),
    ("lraspp 96, 1600x1200", "lraspp_mobilenet_v3_large", "backbone.16", 96, None, (1600, 1200)),
]

_MEASURE = """
import json, sys, time

import torch
from PIL import Image

import hookcli

model, layer, resize, crop, output, *paths = sys.argv[1:]
opened = 0
real_open = Image.open


def counted(*args, **kwargs):
    global opened
    opened += 1
    return real_open(*args, **kwargs)


Image.open = counted
torch.set_num_threads(1)
loaded = hookcli.load_model(model, "none")
options = {"layer": layer, "resize": int(resize), "workers": 0, "force": True}
options.update({"crop": int(crop)} if crop != "-" else {})
hookcli.cam(loaded, paths[:4], output=output, **options)
walls, cpus = [], []
for _ in range(3):
    opened = 0
    wall, cpu = time.perf_counter(), time.process_time()
    hookcli.cam(loaded, paths, output=output, **options)
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
print(json.dumps({"rate": len(paths) / min(walls), "cpu_rate": len(paths) / min(cpus), "opens": opened / len(paths)}))
"""


def measure(tree: Path, case: tuple, paths: list[Path], output: Path) -> dict:
    _, model, layer, resize, crop, _ = case
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, model, layer, str(resize), str(crop or "-"), str(output), *map(str, paths)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"cam failed in {tree}: {done.stderr[-600:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-cam-") as folder:
        work = Path(folder)
        with checked_out(args.base, work / "other") as other:
            photos = {}
            for size in {case[5] for case in CASES}:
                (work / f"{size[0]}x{size[1]}").mkdir()
                photos[size] = make_images(work / f"{size[0]}x{size[1]}", args.images, size)
            trees = {"this tree": ROOT, args.base: other}
            found: dict[tuple[str, str], list[dict]] = {}
            for _ in range(args.repeat):
                for case in CASES:
                    for label, tree in trees.items():
                        measured = measure(tree, case, photos[case[5]], work / "cams")
                        found.setdefault((case[0], label), []).append(measured)
            print(f"{args.images} JPEGs, workers=0, one thread; median of {args.repeat} rounds of the best of 3")
            print(f"{'case':26s} {'images/s':>19s}  {'per CPU second':>19s}  ratio  opens/image")
            print(f"{'':26s} {'this':>9s} {args.base:>9s}  {'this':>9s} {args.base:>9s}")
            for case in CASES:
                runs = [found[case[0], label] for label in trees]
                rates = [statistics.median(r["rate"] for r in run) for run in runs]
                cpu_rates = [statistics.median(r["cpu_rate"] for r in run) for run in runs]
                print(
                    f"{case[0]:26s} {rates[0]:9.1f} {rates[1]:9.1f}  {cpu_rates[0]:9.1f} {cpu_rates[1]:9.1f}  "
                    f"{cpu_rates[0] / cpu_rates[1]:5.2f}x  {runs[0][0]['opens']:.0f}, {runs[1][0]['opens']:.0f}"
                )


if __name__ == "__main__":
    main()
