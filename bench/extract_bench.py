"""Benchmark hookcli extract against a hand-written loop, early exit, the FX extractor, and memory.

Run from the repository root:  python bench/extract_bench.py  [--images 96] [--batch-size 16]

Every timing runs in this process on the same images and the same model object
(random weights: speed does not depend on them), after one warm-up run, so
start-up costs (imports, building the model) are left out of the ratios.

1. resnet50, last layer (fc): hookcli's pipeline vs a hand-written loop
   (Pillow decode -> the weights' transforms -> model(x) -> save) and vs
   torchvision's create_feature_extractor in that same loop.   goal >= 1.0x the loop
2. early exit: vgg16_bn features.18 / last layer (goal <= 0.6) and
   resnet50 layer2 / last layer (goal <= 0.2), both through hookcli.
3. peak RSS of whole `hookcli extract -o DIR/`, `grad -o DIR/` and `cam` processes on N and 4N images.
   goal <= 1.2x
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

from hookcli.inputs.transforms import to_transform


def make_images(folder: Path, count: int, size: tuple[int, int] = (500, 375)) -> list[Path]:
    """Photo-sized JPEGs of ``size``: crops of the sample photo that ships with matplotlib, each different."""
    import matplotlib.cbook
    import numpy as np
    from PIL import Image

    photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        left, top = int(rng.integers(0, 112)), int(rng.integers(0, 225))
        crop = photo.crop((left, top, left + 400, top + 375)).resize(size)
        path = folder / f"{i:05d}.jpg"
        crop.save(path, quality=90)
        paths.append(path)
    return paths


DEVICE = "cpu"  # set from --device


def hand_loop(model, transform, paths, batch_size, out: Path, layer=None) -> None:
    """What a user writes by hand: decode, transform, forward, keep, save."""
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    model = model.to(DEVICE)
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(paths), batch_size):
            batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[start : start + batch_size]])
            result = model(batch.to(DEVICE))
            outputs.append((result[layer] if layer else result).cpu())
    save_file({"out": torch.cat(outputs).contiguous()}, str(out))


def hookcli_run(loaded, layer, paths, batch_size, workers, out: Path) -> None:
    import hookcli

    hookcli.extract(loaded, layer, paths, output=out, batch_size=batch_size, workers=workers, device=DEVICE, force=True)


def best_times(variants: dict, rounds: int) -> dict:
    """Each variant's best wall time over `rounds`, in a new random order each round so drifts hit all alike."""
    import random

    for function, *args in variants.values():
        function(*args)  # warm-up: caches, allocator, worker start-up paths
    best = {name: float("inf") for name in variants}
    shuffler = random.Random(0)
    for _ in range(rounds):
        for name in shuffler.sample(list(variants), len(variants)):
            function, *args = variants[name]
            start = time.perf_counter()
            function(*args)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def throughput(paths, batch_size, workers, rounds, folder: Path) -> None:
    from torchvision.models.feature_extraction import create_feature_extractor

    from hookcli.models.loading import load_model

    loaded = load_model("resnet50", "none")
    transform = to_transform(loaded.preprocess)
    fx_model = create_feature_extractor(loaded.module, return_nodes=["fc"])
    variants = {
        "hand-written loop": (hand_loop, loaded.module, transform, paths, batch_size, folder / "loop.safetensors"),
        "create_feature_extractor in loop": (
            hand_loop,
            fx_model,
            transform,
            paths,
            batch_size,
            folder / "fx.safetensors",
            "fc",
        ),
    }
    for count in sorted({0, workers}):
        variants[f"hookcli, {count} decode workers"] = (
            hookcli_run,
            loaded,
            "fc",
            paths,
            batch_size,
            count,
            folder / "hookcli.safetensors",
        )
    best = best_times(variants, rounds)
    n, loop = len(paths), best["hand-written loop"]
    print(f"1. resnet50 fc, {n} JPEGs 500x375, batch {batch_size}, best of {rounds} interleaved rounds:")
    for name, seconds in best.items():
        goal = "   (goal >= 1.0x)" if name.startswith("hookcli") else ""
        print(f"   {name:34s} {n / seconds:6.1f} img/s  {loop / seconds:5.2f}x the loop{goal}")


def early_exit(paths, batch_size, workers, rounds, folder: Path) -> None:
    """hookcli's early exit, next to its lower bound: the network cut off after the layer (FX graph truncation)."""
    from torchvision.models.feature_extraction import create_feature_extractor

    from hookcli.models.loading import load_model

    print("2. early exit, time for a layer / time for the last layer, same images:")
    for model, layer, last, goal in (
        ("vgg16_bn", "features.18", "classifier.6", 0.6),
        ("resnet50", "layer2", "fc", 0.2),
    ):
        loaded = load_model(model, "none")
        transform = to_transform(loaded.preprocess)
        cut = create_feature_extractor(loaded.module, return_nodes=[layer])
        whole = create_feature_extractor(loaded.module, return_nodes=[last])
        best = best_times(
            {
                "part": (hookcli_run, loaded, layer, paths, batch_size, workers, folder / "part.safetensors"),
                "full": (hookcli_run, loaded, last, paths, batch_size, workers, folder / "full.safetensors"),
                "cut": (hand_loop, cut, transform, paths, batch_size, folder / "cut.safetensors", layer),
                "whole": (hand_loop, whole, transform, paths, batch_size, folder / "whole.safetensors", last),
            },
            rounds,
        )
        print(
            f"   {model:9s} {layer:12s} hookcli {best['part']:6.2f} s / {best['full']:6.2f} s = "
            f"{best['part'] / best['full']:4.2f}   network cut by hand: {best['cut'] / best['whole']:4.2f}"
            f"   (goal <= {goal})"
        )


def _peak_rss_mib(command: list[str], stdin_path: Path) -> float:
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    with open(stdin_path) as stdin:
        out = subprocess.run(
            [sys.executable, "-c", probe, *command], stdin=stdin, capture_output=True, text=True, check=True
        )
    return int(out.stdout) / 1024


def memory(paths, folder: Path) -> None:
    """Whole processes on N and 4N images: extract and grad into shard folders, cam into its folder."""
    count = len(paths) // 4
    hookcli = [sys.executable, "-m", "hookcli"]
    shards = "-m resnet18 -w none --shard-size 8 -q".split()
    jobs = {
        "extract -o DIR/ (resnet18 layer3, shards of 8)": lambda n: [
            *hookcli, "extract", *shards, "-l", "layer3", "-o", f"{folder / f'extract{n}'}/", "-"
        ],
        "grad -o DIR/ (resnet18 layer4, shards of 8)": lambda n: [
            *hookcli, "grad", *shards, "-l", "layer4", "-o", f"{folder / f'grad{n}'}/", "-"
        ],
        "cam (resnet18, Grad-CAM, a PNG per image)": lambda n: [
            *hookcli, "cam", "-m", "resnet18", "-w", "none", "-q", "-o", str(folder / f"cam{n}"), "-"
        ],
    }  # fmt: skip
    print("3. peak RSS of whole processes, N and 4N images (goal <= 1.2x):")
    for name, command in jobs.items():
        sizes = []
        for n in (count, 4 * count):
            listing = folder / f"list{n}.txt"
            listing.write_text("".join(f"{p}\n" for p in paths[:n]))
            sizes.append(_peak_rss_mib(command(n), listing))
        print(
            f"   {name:48s} {count:4d} images {sizes[0]:6.0f} MiB, {4 * count:4d} images {sizes[1]:6.0f} MiB: "
            f"{sizes[1] / sizes[0]:4.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["throughput", "early-exit", "memory"])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the memory part always runs on the CPU)")
    args = parser.parse_args()
    import torch

    global DEVICE
    DEVICE = args.device

    where = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "CPU only"
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads, {where}"
    )
    with tempfile.TemporaryDirectory(prefix="hookcli-bench-") as name:
        folder = Path(name)
        paths = make_images(folder, args.images)
        if args.only in (None, "throughput"):
            throughput(paths, args.batch_size, args.workers, args.rounds, folder)
        if args.only in (None, "early-exit"):
            early_exit(paths, args.batch_size, args.workers, args.rounds, folder)
        if args.only in (None, "memory"):
            memory(paths, folder)


if __name__ == "__main__":
    main()
