"""What one core of a decode worker costs an image: the weights' preset whole in the worker (float32 out, as CPU
runs do it and as GPU runs did) against a GPU run's share now (decode, resize and crop, uint8 out; the GPU scales
and normalises), measured side by side in one process on one thread.

    python bench/preprocess_bench.py                    # 400 JPEGs of 500x375, resnet50's preprocessing
    python bench/preprocess_bench.py --model vgg16_bn   # resize 256, crop 224

Prints images per second per core for each, the ratio, and whether the rows come out the same floats; then the
same with ``--fast-decode`` (the crop's window resized) and how far its pixels are from the exact ones.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402


def best_rate(work, items: list, repeat: int) -> float:
    """Items per second of ``work`` over ``items``, the best of ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            work(item)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import torch

    from hookcli.inputs.images import load_rgb
    from hookcli.inputs.transforms import to_tensor_steps, to_transform
    from hookcli.models.loading import load_model
    from hookcli.run.batches import _Images

    torch.set_num_threads(1)  # a decode worker's
    preprocess = load_model(args.model, "none").preprocess
    with tempfile.TemporaryDirectory() as folder:
        paths = make_images(Path(folder), args.images)
        whole = to_transform(preprocess)
        images = _Images(paths, preprocess, uint8=True)
        steps = to_tensor_steps(preprocess)
        before = best_rate(lambda path: whole(load_rgb(path)), paths, args.repeat)
        worker = best_rate(images.__getitem__, list(range(len(paths))), args.repeat)
        quick = _Images(paths, preprocess.replace(fast_decode=True), uint8=True)
        fast = best_rate(quick.__getitem__, list(range(len(paths))), args.repeat)
        levels = torch.stack([(quick[i][1].int() - images[i][1].int()).abs() for i in range(len(paths))])
        checked = range(min(32, len(paths)))
        same = all(torch.equal(whole(load_rgb(paths[i])), steps.scaled(images[i][1][None])[0]) for i in checked)
    print(f"{args.model}: {preprocess.to_json()}")
    print(f"{args.images} JPEGs of 500x375, one thread")
    print(f"CPU runs, and before: the preset whole in the worker, float32 out   {before:7.1f} img/s per core")
    print(f"GPU runs: the worker's share (decode, resize, crop), uint8 out       {worker:7.1f} img/s per core")
    print(f"GPU runs with --fast-decode (the crop's window resized)              {fast:7.1f} img/s per core")
    print(f"ratio (worker, GPU runs against before) {worker / before:.2f}x; the same floats: {same}")
    print(
        f"ratio with --fast-decode {fast / before:.2f}x; its pixels differ by at most {int(levels.max())} level, "
        f"{levels.gt(0).float().mean().item():.3%} of them"
    )


if __name__ == "__main__":
    main()
