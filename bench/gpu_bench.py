"""Feeding a GPU: the whole pipeline against the model's forward alone, CPU decoding against --decode device.

Run from the repository root on a GPU machine:

    python bench/gpu_bench.py                      # resnet50 and vit_b_16, fp32 and bf16, batch 256
    python bench/gpu_bench.py --processes 1,2,4,8  # and torchrun on 1 to 8 GPUs

It runs on the CPU as well (``--device cpu --models resnet18 --images 64 --batch-size 16``), to check the
script; the figures that matter are a GPU's.

Photo-sized JPEGs (500x375, as ImageNet's) are made once. For each model,
precision and decoder, in this one process and on the same images:

- forward: the model alone on batches already preprocessed and on the device
  (the memory format and autocast hookcli picks), after a warm-up;
- decode: the input stage alone: the loader's batches on the device, without
  the model (with ``--decode device``, decoded and preprocessed there);
- pipeline: ``hookcli.extract`` of the model's output (``.``), in memory, in
  steady state (from the end of the first batch to the end of the last) and
  whole (start-up included);
- ratio: pipeline (steady) / forward, goal >= 0.9. Where it falls short, the
  slower of the two stages is named as the limit.

Then the pixel differences between the decoders (levels of 255, before
normalisation), and the relative difference of the model's outputs. With
``--processes``, whole ``torchrun`` commands on 1..N processes (one GPU each).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hookcli.inputs.transforms import to_transform

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_rate(loaded, batch, precision: str, device, repeat: int) -> float:
    """Images/s of the model alone on ``batch`` (already on the device), after a warm-up."""
    import torch

    from hookcli.run.speed import choose_memory_format, compute_precision, float32_math, to_memory_format

    memory_format = choose_memory_format(loaded.module, device)
    model = to_memory_format(loaded.module.to(device), memory_format)
    batch = to_memory_format(batch.to(device), memory_format)
    with torch.inference_mode(), float32_math(precision, device), compute_precision(precision, device):
        model(batch)
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(repeat):
            model(batch)
        _synchronize(device)
    model.to(memory_format=torch.contiguous_format)
    return repeat * len(batch) / (time.perf_counter() - start)


def _steady(marks: list[tuple[float, int]], total: int) -> float:
    """Images/s over the second half of a run: ``marks`` are (time, images so far). From half-way on, the workers'
    start and the batches they prefetched meanwhile are behind (the run must hold more than they prefetch)."""
    half = next(((when, done) for when, done in marks if done >= total // 2), marks[-1])
    if marks[-1][0] <= half[0]:
        return float("nan")
    return (marks[-1][1] - half[1]) / (marks[-1][0] - half[0])


def decode_rate(loaded, paths, decode: str, batch_size: int, device) -> tuple[float, float]:
    """Images/s of the input stage alone (files to preprocessed batches on the device): steady and whole."""
    from hookcli.run.batches import Decoded, image_loader
    from hookcli.run.settings import RunSettings
    from hookcli.run.speed import resolve_settings

    settings = resolve_settings(
        RunSettings(preprocess=loaded.preprocess.replace(decode=decode), device=device, batch_size=batch_size),
        loaded,
        len(paths),
    )
    start = time.perf_counter()
    count = 0
    marks = []
    for loaded_batch in Decoded(image_loader(paths, settings), settings, None):
        loaded_batch.batch.to(device, non_blocking=True)
        count += len(loaded_batch.indices)
        marks.append((time.perf_counter(), count))
    _synchronize(device)
    return _steady(marks, count), count / (time.perf_counter() - start)


def pipeline_rate(loaded, paths, options: dict) -> tuple[float, float]:
    """Images/s of ``hookcli.extract`` in steady state (its second half) and whole."""
    import hookcli
    from hookcli.events import Advanced

    marks: list[tuple[float, int]] = []

    def progress(event) -> None:
        if isinstance(event, Advanced):
            marks.append((time.perf_counter(), (marks[-1][1] if marks else 0) + event.count))

    hookcli.extract(loaded, ".", paths[: 2 * options["batch_size"]], **options)  # warm-up: kernels, autotuning
    start = time.perf_counter()
    hookcli.extract(loaded, ".", paths, progress=progress, **options)
    whole = len(paths) / (time.perf_counter() - start)
    if len(marks) < 2:
        return whole, whole
    return _steady(marks, len(paths)), whole


def pixel_differences(loaded, paths, device) -> tuple[int, float, float]:
    """Largest and mean difference in levels of 255, and the share of values that differ, between the two
    decoders' preprocessed images (without normalisation)."""
    import torch

    from hookcli.inputs.decoding import DeviceDecoder, EncodedImages, collate
    from hookcli.inputs.images import load_rgb

    plain = dataclasses.replace(loaded.preprocess, mean=None, std=None, decode="device")
    transform = to_transform(plain.replace(decode="cpu"))
    images = EncodedImages(paths, plain)
    indices, encoded, failures, _ = collate([images[i] for i in range(len(paths))])
    _, batch, *_ = DeviceDecoder(plain, device)(indices, encoded, failures)
    reference = torch.stack([transform(load_rgb(p)) for p in paths])
    levels = ((batch.float().cpu() - reference).abs() * 255).round()
    return int(levels.max()), levels.mean().item(), (levels > 0).float().mean().item()


def output_difference(loaded, paths, options: dict) -> tuple[str, float]:
    """The layer compared (the pooled features before the classifier, whose random weights are zeros in
    torchvision's vision transformers) and the relative difference of its outputs between the decoders."""
    import hookcli

    names = dict(loaded.module.named_modules())
    layer = next((name for name in ("encoder.ln", "avgpool") if name in names), ".")
    found = {
        decode: next(iter(hookcli.extract(loaded, layer, paths, **{**options, "decode": decode}).values()))
        for decode in ("cpu", "device")
    }
    return layer, ((found["device"] - found["cpu"]).float().norm() / found["cpu"].float().norm()).item()


def process_scaling(paths: list[Path], args, folder: Path) -> None:
    counts = [int(n) for n in args.processes.split(",")]
    listing = folder / "inputs.txt"
    listing.write_text("".join(f"{p}\n" for p in paths))
    model, precision, decode = args.models.split(",")[0], args.precisions.split(",")[-1], args.decoders.split(",")[-1]
    print(f"\nprocesses (torchrun, {model}, {precision}, decode {decode}, whole commands):")
    base = None
    for count in counts:
        command = [
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            str(count),
            "-m",
            "hookcli",
            "extract",
            "-m",
            model,
            "-w",
            "none",
            "-l",
            ".",
            "-b",
            str(args.batch_size),
            "--precision",
            precision,
            "--decode",
            decode,
            "-d",
            args.device,
            "-q",
            "-o",
            f"{folder}/scaling-{count}/",
            "-",
        ]
        start = time.perf_counter()
        with open(listing) as stdin:  # hookcli sets each process's threads itself: OMP_NUM_THREADS only quiets torchrun
            subprocess.run(
                command, stdin=stdin, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
        rate = len(paths) / (time.perf_counter() - start)
        base = base or rate
        print(f"  {count} process{'es' if count > 1 else '  '}: {rate:8.1f} img/s  {rate / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20480, help="the run's inputs: the files made, repeated")
    parser.add_argument("--unique", type=int, default=4096, help="JPEG files made (read again from the page cache)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--models", default="resnet50,vit_b_16")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--decoders", default="cpu,device")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=10, help="forward passes timed for the forward alone")
    parser.add_argument("--compare", type=int, default=64, help="images whose pixels and outputs are compared")
    parser.add_argument("--processes", default=None, help="e.g. 1,2,4,8: torchrun on that many GPUs")
    args = parser.parse_args()

    import torch

    from hookcli.models.loading import load_model
    from hookcli.run.settings import default_workers

    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(
        f"{name}; {os.cpu_count()} cores; torch {torch.__version__}; {args.images} images 500x375 "
        f"({min(args.unique, args.images)} files); batch {args.batch_size}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "images").mkdir()
        made = [str(p) for p in make_images(folder / "images", min(args.unique, args.images))]
        paths = [made[i % len(made)] for i in range(args.images)]
        workers = default_workers(device, len(paths), args.batch_size)
        from hookcli.inputs.decoding import device_jpeg_decoder

        print(f"decode workers: {workers}; --decode device decodes with {device_jpeg_decoder(device)}\n")
        print(
            f"{'model':10s} {'prec':5s} {'decode':7s} {'forward':>9s} {'decode':>9s} {'/worker':>8s} {'whole':>9s} "
            f"{'steady':>9s} {'whole':>9s} {'ratio':>6s} {'whole':>6s}  limit\n{'':33s}{'(input stage alone)':>28s}"
            f"{'(hookcli.extract)':>20s}   (img/s, steady: the second half; ratios to forward, goals 0.9 and 0.8)"
        )
        for model in args.models.split(","):
            loaded = load_model(model, "none")
            transform = to_transform(loaded.preprocess)
            from hookcli.inputs.images import load_rgb

            sample = torch.stack([transform(load_rgb(paths[i % len(paths)])) for i in range(args.batch_size)])
            for precision in args.precisions.split(","):
                forward = forward_rate(loaded, sample, precision, device, args.repeat)
                for decode in args.decoders.split(","):
                    options = {
                        "batch_size": args.batch_size,
                        "device": args.device,
                        "precision": precision,
                        "decode": decode,
                        "workers": workers,
                    }
                    decoding, decoding_whole = decode_rate(loaded, paths, decode, args.batch_size, device)
                    steady, whole = pipeline_rate(loaded, paths, options)
                    ratio = steady / forward
                    limit = (
                        ""
                        if ratio >= 0.9
                        else (
                            f"decoding ({decode})" if decoding < forward else "the loop: hooks, storing rows, transfers"
                        )
                    )
                    print(
                        f"{model:10s} {precision:5s} {decode:7s} {forward:9.1f} {decoding:9.1f} "
                        f"{decoding / max(1, workers):8.1f} {decoding_whole:9.1f} {steady:9.1f} "
                        f"{whole:9.1f} {ratio:6.2f} {whole / forward:6.2f}  {limit}",
                        flush=True,
                    )
            worst, mean, share = pixel_differences(loaded, paths[: args.compare], device)
            layer, relative = output_difference(
                loaded, paths[: args.compare], {"batch_size": args.batch_size, "device": args.device, "workers": 0}
            )
            print(
                f"{model:10s} decode device vs cpu on {args.compare} images: pixels differ by at most {worst} "
                f"levels (mean {mean:.3f}, {share:.1%} of values); {layer} by {relative:.1e} (relative)"
            )
        if args.processes:
            process_scaling([Path(p) for p in paths], args, folder)


if __name__ == "__main__":
    main()
