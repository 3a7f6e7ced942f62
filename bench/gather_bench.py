"""What gathering costs on top of a forward: ``extract --pool avg`` against ``stats --top 9`` and ``compare``
(linear CKA) of resnet50's layer3 and layer4, each command a fresh process, over the same photos.

    python bench/gather_bench.py                         # 2,048 photos, batch 128, twice each
    python bench/gather_bench.py --photos 256 --repeat 1

Prints each run's wall time and peak memory, then the medians and their ratios to extract (goal: at most 1.15).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measured import measured, photos  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2048)
    parser.add_argument("--batch-size", default="128")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = photos(Path(folder) / "photos", args.photos)
        model = ["-m", "resnet50", "-w", "none", "-l", "layer3", "-l", "layer4", "-b", args.batch_size, "-q"]
        commands = {
            "extract --pool avg": ["extract", *model, "--pool", "avg", "-o", f"{folder}/x.safetensors", "--force"],
            "stats --top 9": ["stats", *model, "--top", "9", "-o", f"{folder}/s.safetensors", "--force"],
            "compare linear-cka": ["compare", *model, "-o", f"{folder}/c.safetensors", "--force"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for turn in range(args.repeat):
            for name, command in commands.items():
                wall, peak = measured([*command, *paths])
                times[name].append(wall)
                print(f"turn {turn} {name:20s} {wall:7.1f} s {peak:6d} MiB", flush=True)
    base = statistics.median(times["extract --pool avg"])
    for name, walls in times.items():
        middle = statistics.median(walls)
        print(
            f"{name:20s} median {middle:6.1f} s  ratio {middle / base:.2f}  "
            f"({args.photos} photos, -b {args.batch_size})"
        )


if __name__ == "__main__":
    main()
