"""What ``compare --debiased`` costs beside plain linear CKA, over the same saved features, in one process.

    python bench/debiased_bench.py                       # 20,000 rows, representations of 64 to 1,024 values
    python bench/debiased_bench.py --rows 5000 --repeat 1

Prints each run's wall time, then the medians and their ratio (debiased over plain).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hookcli
from hookcli.storage.features import Features

WIDTHS = (64, 256, 512, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tensors = {f"r{width}": rng.normal(size=(args.rows, width)).astype(np.float32) for width in WIDTHS}
    features = Features(tensors, {})
    times: dict[str, list[float]] = {"plain": [], "debiased": []}
    for turn in range(args.repeat):
        for name in times:
            start = time.perf_counter()
            hookcli.compare(features=features, batch_size=args.batch_size, debiased=name == "debiased")
            times[name].append(time.perf_counter() - start)
            print(f"turn {turn + 1} {name:9} {times[name][-1]:.2f} s", flush=True)
    plain, debiased = (statistics.median(times[name]) for name in ("plain", "debiased"))
    print(f"median plain {plain:.2f} s, debiased {debiased:.2f} s: ratio {debiased / plain:.2f}x")


if __name__ == "__main__":
    main()
