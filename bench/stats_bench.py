"""What statistics cost: ``hookcli stats`` against ``extract --pool avg`` of the same layers over the same photos,
and the peak memory of ``stats`` over four times the photos against once.

Run from the repository root:  python bench/stats_bench.py  [--images 160] [--repeat 3] [--model resnet50]

The photos are crops of the sample photo of Grace Hopper, each a different window, flipped or not, saved as
JPEGs of 320 x 240. Both commands run resnet50 (random weights) over the same photos with the same options
(``-l layer3 -l layer4 -b 16``, the weights' preprocessing to 224 x 224), each in a fresh process, in pairs, one
after the other; the time is each process's wall time, and the figure is the median over the pairs of stats'
time over extract's. One more pair over four times the photos shows the cost a photo, once the fixed costs (the
principal components, writing the file) weigh less. The peak is each process's resident high-water mark (over
the photos once, the median of the pairs' runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import measured, photos  # noqa: E402  (bench/ is no package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs [3]")
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    common = ["-m", args.model, "-w", "none", "-l", "layer3", "-l", "layer4", "-b", "16", "-q", "--force"]
    with tempfile.TemporaryDirectory() as scratch:
        paths = photos(Path(scratch) / "photos", args.images * 4)
        once = paths[: args.images]
        extract = ["extract", *common, "--pool", "avg", "-o", f"{scratch}/pooled.safetensors", *once]
        stats = ["stats", *common, "--top", "9", "-o", f"{scratch}/stats.safetensors", *once]
        ratios, peaks = [], []
        print(f"{args.model} layer3 + layer4, {args.images} photos of 320 x 240, batches of 16")
        print(f"{'pair':<5} {'extract --pool avg s':>21} {'stats --top 9 s':>16} {'ratio':>6}")
        for pair in range(args.repeat):
            (pooled, _), (gathered, peak) = measured(extract), measured(stats)
            ratios.append(gathered / pooled)
            peaks.append(peak)
            print(f"{pair + 1:<5} {pooled:>21.1f} {gathered:>16.1f} {ratios[-1]:>6.3f}")
        print(f"median ratio: {statistics.median(ratios):.3f}")
        pooled_four, _ = measured(["extract", *common, "--pool", "avg", "-o", f"{scratch}/pooled4.safetensors", *paths])
        gathered_four, peak_four = measured(
            ["stats", *common, "--top", "9", "-o", f"{scratch}/four.safetensors", *paths]
        )
        print(f"over {len(paths)} photos, one pair: extract {pooled_four:.1f} s, stats {gathered_four:.1f} s, ", end="")
        print(f"ratio {gathered_four / pooled_four:.3f}")
        peak_once = statistics.median(peaks)
        print(f"stats peak memory: {peak_once} MiB over {args.images} photos (the median of the pairs'), ", end="")
        print(f"{peak_four} MiB over {len(paths)}: ")
        print(f"ratio {peak_four / peak_once:.3f}")


if __name__ == "__main__":
    main()
