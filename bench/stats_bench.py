"""What statistics cost: ``hookcli stats`` against ``extract --pool avg`` of the same layers over the same photos,
and the peak memory of ``stats`` over four times the photos against once.

Run from the repository root:  python bench/stats_bench.py  [--images 160] [--repeat 3] [--model resnet50]

The photos are crops of the sample photo of Grace Hopper, each a different window, flipped or not, saved as
JPEGs of 320 x 240. Both commands run resnet50 (random weights) over the same photos with the same options
(``-l layer3 -l layer4 -b 16``, the weights' preprocessing to 224 x 224), each in a fresh process, in pairs, one
after the other; the time is each process's wall time, and the figure is the median over the pairs of stats'
time over extract's. The peak is each process's resident high-water mark.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageOps

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


def _photos(folder: Path, count: int) -> list[str]:
    """``count`` different crops of the sample photo, 320 x 240 JPEGs."""
    photo = Image.open(__import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    photo = photo.convert("RGB")
    chosen = random.Random(0)
    folder.mkdir()
    paths = []
    for number in range(count):
        width = chosen.randint(200, photo.width)
        height = width * 3 // 4
        left, top = chosen.randint(0, photo.width - width), chosen.randint(0, max(0, photo.height - height))
        crop = photo.crop((left, top, left + width, top + height)).resize((320, 240))
        if number % 2:
            crop = ImageOps.mirror(crop)
        path = folder / f"{number:04d}.jpg"
        crop.save(path, quality=90)
        paths.append(str(path))
    return paths


def _run(command: list[str]) -> tuple[float, int]:
    """``(wall seconds, peak MiB)`` of one hookcli command in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUN, *command], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])}… failed:\n{done.stderr}")
    return wall, int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs [3]")
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    common = ["-m", args.model, "-w", "none", "-l", "layer3", "-l", "layer4", "-b", "16", "-q", "--force"]
    with tempfile.TemporaryDirectory() as scratch:
        paths = _photos(Path(scratch) / "photos", args.images * 4)
        once = paths[: args.images]
        extract = ["extract", *common, "--pool", "avg", "-o", f"{scratch}/pooled.safetensors", *once]
        stats = ["stats", *common, "--top", "9", "-o", f"{scratch}/stats.safetensors", *once]
        ratios = []
        print(f"{args.model} layer3 + layer4, {args.images} photos of 320 x 240, batches of 16")
        print(f"{'pair':<5} {'extract --pool avg s':>21} {'stats --top 9 s':>16} {'ratio':>6}")
        for pair in range(args.repeat):
            (pooled, _), (gathered, peak_once) = _run(extract), _run(stats)
            ratios.append(gathered / pooled)
            print(f"{pair + 1:<5} {pooled:>21.1f} {gathered:>16.1f} {ratios[-1]:>6.3f}")
        print(f"median ratio: {statistics.median(ratios):.3f}")
        _, peak_four = _run(["stats", *common, "--top", "9", "-o", f"{scratch}/four.safetensors", *paths])
        print(f"stats peak memory: {peak_once} MiB over {args.images} photos, {peak_four} MiB over {len(paths)}: ")
        print(f"ratio {peak_four / peak_once:.3f}")


if __name__ == "__main__":
    main()
