"""Benchmark hookcli grid: speed against matplotlib subplots, and memory on a large file.

Run from the repository root:  python bench/grid_bench.py  [--gigabytes 2] [--reps 3]

1. One 512-channel 28x28 feature map to PNG, side by side on the same data:
   hookcli's renderer vs the usual matplotlib figure with one subplot per channel.
   Goal: hookcli at least 10x faster.
2. Peak RSS of `hookcli grid` rendering every image (row) of a file of about
   --gigabytes GB, against the same command on a one-row file. Goal: the big
   file costs about one image's tensors more, not the file's size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHANNELS, SIDE = 512, 28


def _hookcli_png(maps: np.ndarray, folder: Path) -> None:
    """What `hookcli grid` does for one tensor of one image, through the same functions."""
    from hookcli.options.grid import GridOptions
    from hookcli.pictures.grids import plan_grids, write_grids
    from hookcli.storage.features import Features

    features = Features({"features": maps[None]}, {"inputs": '["image.jpg"]'})
    options = GridOptions(channels=":")  # every channel, numbered, with caption and colour bar
    write_grids(features, plan_grids(features, options, folder, force=True), options, force=True)


def _matplotlib_png(maps: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    side = int(np.ceil(np.sqrt(len(maps))))
    figure, axes = plt.subplots(side, side, figsize=(side, side))
    for index, axis in enumerate(axes.flat):
        if index < len(maps):
            axis.imshow(maps[index], cmap="viridis")
        axis.axis("off")
    figure.suptitle(f"features · image.jpg · {list(maps.shape)}")
    figure.savefig(path, dpi=60)
    plt.close(figure)


def _best_of(function, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def speed(reps: int, folder: Path) -> None:
    maps = np.random.default_rng(0).standard_normal((CHANNELS, SIDE, SIDE)).astype(np.float32)
    _hookcli_png(maps, folder)  # imports and colormap table, paid once per process
    _matplotlib_png(maps, folder / "warm_mpl.png")
    ours = _best_of(lambda: _hookcli_png(maps, folder), reps)
    theirs = _best_of(lambda: _matplotlib_png(maps, folder / "matplotlib.png"), reps)
    print(f"grid of {CHANNELS} channels {SIDE}x{SIDE} to PNG (best of {reps}):")
    print(f"  hookcli render           {ours * 1000:8.1f} ms")
    print(f"  matplotlib subplots      {theirs * 1000:8.1f} ms")
    print(f"  speed-up                 {theirs / ours:8.1f}x   (goal >= 10x)")


def _write_rows(path: Path, rows: int) -> int:
    """A hookcli-like file of `rows` images of [512, 28, 28] float32, written in row blocks (little memory)."""
    import json
    import struct

    row_bytes = CHANNELS * SIDE * SIDE * 4
    header = json.dumps(
        {
            "__metadata__": {"format": "1"},
            "features.18": {
                "dtype": "F32",
                "shape": [rows, CHANNELS, SIDE, SIDE],
                "data_offsets": [0, rows * row_bytes],
            },
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    rng = np.random.default_rng(1)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        for start in range(0, rows, 64):
            block = rng.standard_normal((min(64, rows - start), CHANNELS, SIDE, SIDE), dtype=np.float32)
            handle.write(block.tobytes())
    return row_bytes


def _peak_rss_mib(command: list[str]) -> tuple[float, float]:
    """Run `command` in a fresh child; its peak RSS (MiB) and wall time (s)."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, check=True)
    kib, seconds = out.stdout.split()
    return int(kib) / 1024, float(seconds)


def memory(gigabytes: float, folder: Path) -> None:
    row_bytes = CHANNELS * SIDE * SIDE * 4
    rows = max(2, int(gigabytes * 1024**3 // row_bytes))
    big, small = folder / "big.safetensors", folder / "small.safetensors"
    _write_rows(big, rows)
    _write_rows(small, 1)
    hookcli = [sys.executable, "-m", "hookcli", "grid", "-q", "--force"]
    small_rss, _ = _peak_rss_mib([*hookcli, str(small), "-o", str(folder / "small_grids")])
    big_rss, seconds = _peak_rss_mib([*hookcli, str(big), "-o", str(folder / "big_grids")])
    print(
        f"hookcli grid, every image of a {big.stat().st_size / 1024**3:.2f} GB file ({rows} rows of "
        f"[{CHANNELS}, {SIDE}, {SIDE}] float32, {row_bytes / 1024**2:.1f} MiB each):"
    )
    print(f"  peak RSS, 1-row file     {small_rss:8.1f} MiB")
    print(f"  peak RSS, {rows}-row file {big_rss:8.1f} MiB   ({seconds:.0f} s, {rows / seconds:.1f} PNG/s)")
    print(
        f"  growth                   {big_rss - small_rss:8.1f} MiB = {(big_rss - small_rss) * 1024**2 / row_bytes:.1f}"
        f" rows' worth   (goal: about one image's tensors)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=2.0, help="size of the large file (default 2)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-bench-") as folder:
        speed(args.reps, Path(folder))
        if not args.skip_memory:
            memory(args.gigabytes, Path(folder))
    print(f"machine: {_machine()}")


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    main()
