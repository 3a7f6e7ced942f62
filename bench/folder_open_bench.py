"""Opening a shard folder of many inputs: wall time and peak memory of ``open_features`` and of reading a row,
this tree against another revision, side by side.

Run from the repository root:  python bench/folder_open_bench.py  [--base REV] [--inputs 1000000] [--shard 1000]

A folder of ``--inputs`` inputs in shards of ``--shard`` rows (one float32 value a row, so the index and the
names dominate) is written once with this tree's file-format functions; each tree then opens it in a fresh
process (``PYTHONPATH`` points at the tree; the other revision is checked out into a temporary git worktree),
reads its last row, and reports the time and the peak resident memory above what the imports took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revision_bench import ROOT, checked_out  # noqa: E402  (bench/ is no package)

_MEASURE = """
import sys, time


def high_water() -> int:  # kB; /proc's VmHWM starts anew with the process (ru_maxrss carries the parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


import numpy
from hookcli.storage.shards import open_features
start = high_water()
begin = time.perf_counter()
with open_features(sys.argv[1]) as folder:
    opened = time.perf_counter() - begin
    row = folder.read("x", folder.shape("x")[0] - 1)
    total = time.perf_counter() - begin
print(f"{opened:.2f} {total:.2f} {(high_water() - start) / 1024:.0f}")
"""


def _write_folder(folder: Path, inputs: int, shard: int) -> None:
    import torch

    from hookcli.storage import fileformat
    from hookcli.storage.saving import write_safetensors

    names = [f"/data/images/{i:08d}.jpg" for i in range(inputs)]
    record = fileformat.RunRecord(
        model="resnet18",
        weights={"source": "none", "seed": 0},
        layers={"fc": "x"},
        layer_types={"fc": "Linear"},
        capture="output",
        preprocess={"resize": 256, "crop": 224},
        pool="none",
        dtype="float32",
        precision="fp32",
        memory_format="contiguous",
        fuse=False,
        device="cpu",
        on_error="fail",
        shard_size=shard,
        inputs=tuple(names),
        command={},
    )
    run = fileformat.run_metadata(record, fileformat.RunFacts(calls={"fc": 1}), keys=["x"])
    folder.mkdir(parents=True)
    lines = [fileformat.index_header(record, run, shard)]
    for number in range(-(-inputs // shard)):
        rows = names[number * shard : (number + 1) * shard]
        metadata = fileformat.shard_metadata(run, number, inputs=rows, skipped=[])
        tensors = {"x": torch.arange(len(rows), dtype=torch.float32)[:, None]}
        write_safetensors(tensors, metadata, folder / fileformat.SHARD_NAME.format(number))
        lines.append(fileformat.index_line(number, shard, inputs, rows, []))
    (folder / fileformat.INDEX_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--shard", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "feats"
        _write_folder(folder, args.inputs, args.shard)
        with checked_out(args.base, Path(scratch) / "base") as base:
            print(f"{args.inputs:,} inputs in shards of {args.shard:,}")
            print(f"{'tree':<12} {'open':>8} {'open+row':>9} {'peak MiB':>9}")
            for name, tree in (("this tree", ROOT), (args.base, base)):
                env = {**os.environ, "PYTHONPATH": str(tree)}
                done = subprocess.run(
                    [sys.executable, "-c", _MEASURE, str(folder)],
                    cwd=tree,  # -c puts the current folder first on the module path
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                opened, total, peak = done.stdout.split()
                print(f"{name:<12} {opened + 's':>8} {total + 's':>9} {peak:>9}")


if __name__ == "__main__":
    main()
