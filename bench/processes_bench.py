"""Many processes on one shard folder: whole-command wall time of 1 process against 2 (and more), side by side.

Run from the repository root:  python bench/processes_bench.py  [--images 192] [--model resnet50] [--repeat 2]

The same extraction (random weights, JPEGs of 320x240 written once, batch
16, shards of 32 images) runs into a fresh folder as:

- one process (torch's default threads: every core);
- ``torchrun --nproc-per-node N`` (each process takes cores / N threads);
- N plain shells with ``--part K/N``, started together (each with torch's
  default threads, as a user who sets nothing gets).

Each setting runs --repeat times in alternating rounds; the best wall time
is kept, and the folders are checked to hold every input exactly once. The
ratio printed is images/s of the setting ÷ images/s of one process.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--layer", default="avgpool")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-processes-") as folder:
        _compare(args, Path(folder))


def _compare(args, work: Path) -> None:
    import numpy as np
    from PIL import Image

    from hookcli.storage.index import read_index

    photos = work / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    inputs = []
    for i in range(args.images):
        path = photos / f"{i:05d}.jpg"
        Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(path, quality=90)
        inputs.append(str(path))
    common = ["extract", "-m", args.model, "-w", "none", "-l", args.layer, "-b", "16", "--shard-size", "32", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    n = args.processes

    def one(folder: Path) -> list[list[str]]:
        return [[sys.executable, "-m", "hookcli", *common, "-o", f"{folder}/", *inputs]]

    def torchrun(folder: Path) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(n),
                "-m",
                "hookcli",
                *common,
                "-o",
                f"{folder}/",
                *inputs,
            ]
        ]

    def parts(folder: Path) -> list[list[str]]:
        return [
            [sys.executable, "-m", "hookcli", *common, "--part", f"{k}/{n}", "-o", f"{folder}/", *inputs]
            for k in range(1, n + 1)
        ]

    settings = {"1 process": one, f"torchrun, {n} processes": torchrun, f"{n} shells with --part K/{n}": parts}
    best: dict[str, float] = {}
    for round_number in range(args.repeat):
        for number, (name, commands) in enumerate(settings.items()):
            folder = work / f"out-{round_number}-{number}"
            started = time.perf_counter()
            runs = [
                subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for command in commands(folder)
            ]
            for run in runs:
                if run.wait() != 0:
                    raise SystemExit(f"{name} failed: {run.stderr.read()}")
            elapsed = time.perf_counter() - started
            _, shards = read_index(folder)
            if [p for entry in shards for p in entry["inputs"]] != inputs:
                raise SystemExit(f"{name}: the folder does not hold every input exactly once")
            best[name] = min(best.get(name, elapsed), elapsed)

    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; {args.model} "
        f"'{args.layer}', {args.images} JPEGs of 320x240, batch 16, shards of 32, random weights; "
        f"best of {args.repeat}, whole commands (start-up included)"
    )
    base = args.images / best["1 process"]
    for name, seconds in best.items():
        rate = args.images / seconds
        print(f"  {name:28s} {seconds:7.1f} s  {rate:7.1f} img/s  {rate / base:5.2f}x")


if __name__ == "__main__":
    main()
