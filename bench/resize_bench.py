"""``--decode device``'s resize and crop of one batch of decoded photos each of its own size: this tree against
another revision, side by side, each in a fresh process on the same images.

Run from the repository root:  python bench/resize_bench.py  [--base REV] [--images 256] [--device cpu]

The photos are uint8 noise of sizes drawn from 240-480 by 300-640 (a scraped set's spread), resized and cropped as
resnet50's weights say (shorter side 232, centre 224) by ``DeviceDecoder._preprocessed``, which both revisions
have. Each tree prints its milliseconds a batch (the best of ``--repeat``, after one run that plans the sizes), the
operations that make or write tensors in one batch, sliced as on a GPU (there, about its kernel launches; views
left out), and
whether its rows are the other tree's, byte for byte.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revision_bench import ROOT, checked_out, tree_environment  # noqa: E402  (bench/ is no package)

#: What each tree's process runs: argv is the device, the count, the repeats and the file its rows go to.
_ONE_TREE = """
import sys, time
import numpy as np, torch
from torch.utils._python_dispatch import TorchDispatchMode
from hookcli.inputs.decoding import DeviceDecoder
from hookcli.models.loading import load_model

device, count, repeat, out = torch.device(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
rng = np.random.default_rng(1)
sizes = sorted({(int(rng.integers(240, 480)), int(rng.integers(300, 640))) for _ in range(8 * count)})
sizes = [sizes[k] for k in rng.permutation(len(sizes))[:count]]
images = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device) for h, w in sizes]
decoder = DeviceDecoder(load_model("resnet50", "none").preprocess.replace(decode="device"), device)


class Counted(TorchDispatchMode):
    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Counted.count += not func.is_view
        return func(*args, **(kwargs or {}))


def batch():
    rows = decoder._preprocessed(images)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return rows


batch()
best = float("inf")
for _ in range(repeat):
    started = time.perf_counter()
    rows = batch()
    best = min(best, time.perf_counter() - started)
from hookcli.inputs import resampling

resampling._AT_ONCE_ON_CPU = resampling._AT_ONCE  # counted in a GPU's slices, whatever the device
with Counted():
    batch()
torch.save(torch.stack(rows).cpu(), out)
print(f"{1000 * best:.1f} {Counted.count}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--images", type=int, default=256, help="photos in the batch, each of its own size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory(prefix="hookcli-resize-") as folder:
        work = Path(folder)
        with checked_out(args.base, work / "other") as other:
            found = {}
            for label, tree in {"this tree": ROOT, args.base: other}.items():
                out = work / f"{len(found)}.pt"
                command = [sys.executable, "-c", _ONE_TREE, args.device, str(args.images), str(args.repeat), str(out)]
                printed = subprocess.run(command, cwd=tree, env=tree_environment(tree, work), check=True,
                                         capture_output=True, text=True).stdout.split()  # fmt: skip
                found[label] = (float(printed[0]), int(printed[1]), torch.load(out))
    (mine, mine_ops, mine_rows), (theirs, theirs_ops, theirs_rows) = found.values()
    print(f"{args.images} photos each of its own size, resnet50's resize and crop on {args.device}")
    print(f"{'':12s} {'ms a batch':>11s} {'img/s':>8s} {'operations':>11s}")
    for label, (seconds, operations, _) in found.items():
        print(f"{label:12s} {seconds:11.1f} {1000 * args.images / seconds:8.0f} {operations:11d}")
    print(f"ratio of times {mine / theirs:.2f}x, of operations {mine_ops / theirs_ops:.3f}x; "
          f"rows the same bytes: {torch.equal(mine_rows, theirs_rows)}")  # fmt: skip


if __name__ == "__main__":
    main()
