"""Whole-process speed: hookcli's default and bf16 modes against a hand-written loop.

Run from the repository root:  python bench/speed_bench.py  [--images 384] [--model resnet50]

Each contender is a fresh process on the same JPEGs (imports, model build and
writing included), run in a shuffled order for --rounds rounds; the best time
of each is kept. The hand-written loop is what a user would write: Pillow
decode -> the weights' transforms -> model(x) under inference_mode -> save.
Goals: hookcli default >= 1.2x the loop's throughput; --precision bf16 >= 3x,
with the relative error of its stored features (against the loop's fp32) shown.

Then, in-process after a warm-up: hookcli's pipeline (decode, transfer, forward,
copy back) in images/s divided by the pure forward of the same network (fused
on the CPU) on batches decoded beforehand and already on the device, per
precision. Goal on a GPU: >= 0.9.
With --device cuda the loop and hookcli run on the GPU too.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hookcli.inputs.transforms import to_transform

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402

DEFAULT = "hookcli (default)"
BF16 = "hookcli --precision bf16"
LOOP = """
import sys, torch, torchvision
from PIL import Image
from safetensors.torch import save_file
name, layer, out, batch_size, device, *paths = sys.argv[1:]
batch_size = int(batch_size)
torch.manual_seed(0)
model = torchvision.models.get_model(name, weights=None).eval().to(device)
transform = torchvision.models.get_model_weights(name).DEFAULT.transforms()
outputs = []
with torch.inference_mode():
    for start in range(0, len(paths), batch_size):
        batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[start:start + batch_size]])
        outputs.append(model(batch.to(device)).cpu())
save_file({layer: torch.cat(outputs)}, out)
"""


def run(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def round_times(contenders: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """Each command's wall times over ``rounds`` rounds, the order shuffled in each round."""
    times: dict[str, list[float]] = {label: [] for label in contenders}
    shuffler = random.Random(0)
    for _ in range(rounds):
        for label in shuffler.sample(list(contenders), len(contenders)):
            times[label].append(run(contenders[label]))
    return times


def best_times(contenders: dict[str, list[str]], rounds: int) -> dict[str, float]:
    """Each command's best wall time over ``rounds`` rounds, the order shuffled in each round."""
    return {label: min(times) for label, times in round_times(contenders, rounds).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--layer", default="fc", help="the last layer, so both compute the whole network")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    import torch
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="hookcli-speed-") as name:
        folder = Path(name)
        paths = [str(p) for p in make_images(folder, args.images)]
        listing = folder / "inputs.txt"
        listing.write_text("".join(f"{p}\n" for p in paths))
        script = folder / "loop.py"
        script.write_text(LOOP)
        hookcli = [sys.executable, "-m", "hookcli", "extract", "-m", args.model, "-w", "none", "-l", args.layer]
        hookcli += ["-b", str(args.batch_size), "-q", "-f", "--device", args.device]
        contenders = {
            "hand-written loop": [
                sys.executable,
                str(script),
                args.model,
                args.layer,
                str(folder / "loop.safetensors"),
                str(args.batch_size),
                args.device,
                *paths,
            ],
            DEFAULT: [*hookcli, "-o", str(folder / "default.safetensors"), str(folder)],
            "hookcli --no-fuse": [*hookcli, "--no-fuse", "-o", str(folder / "unfused.safetensors"), str(folder)],
            BF16: [*hookcli, "--precision", "bf16", "-o", str(folder / "bf16.safetensors"), str(folder)],
            "hookcli --precision bf16 --no-fuse": [
                *hookcli,
                "--precision",
                "bf16",
                "--no-fuse",
                "-o",
                str(folder / "bf16-unfused.safetensors"),
                str(folder),
            ],
        }
        if args.device.startswith("cuda"):  # fusion is for the CPU: on a GPU the --no-fuse runs would repeat the others
            del contenders["hookcli --no-fuse"], contenders["hookcli --precision bf16 --no-fuse"]
        best = best_times(contenders, args.rounds)
        reference = load_file(str(folder / "loop.safetensors"))[args.layer]

        def error(file: str) -> str:
            stored = load_file(str(folder / file))[args.layer]
            return f"{((stored.float() - reference).norm() / reference.norm()).item():.1e}"

        files = {
            DEFAULT: "default",
            "hookcli --no-fuse": "unfused",
            BF16: "bf16",
            "hookcli --precision bf16 --no-fuse": "bf16-unfused",
        }
        errors = {label: error(f"{files[label]}.safetensors") for label in contenders if label in files}
        goals = {DEFAULT: ">= 1.2x", BF16: ">= 3x"}
        efficiency = pipeline_efficiency(paths, args)
    loop = best["hand-written loop"]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU only"
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {device}")
    print(
        f"{args.model} {args.layer}, {args.images} JPEGs 500x375, batch {args.batch_size}, whole processes, "
        f"best of {args.rounds} shuffled rounds:"
    )
    for label, seconds in best.items():
        extra = f"  rel. error {errors[label]}" if label in errors else ""
        extra += f"  (goal {goals[label]})" if label in goals else ""
        print(f"  {label:36s} {seconds:6.1f} s  {args.images / seconds:6.1f} img/s  {loop / seconds:5.2f}x{extra}")
    print("in-process, after a warm-up: hookcli pipeline / pure forward on pre-decoded batches on the device:")
    for precision, (ours, pure) in efficiency.items():
        print(
            f"  {precision:5s} hookcli {ours:6.1f} img/s, pure forward {pure:6.1f} img/s: {ours / pure:4.2f}"
            "   (goal on a GPU >= 0.9)"
        )


def _forward_all(model, batches, precision: str, device) -> None:
    import torch

    from hookcli.run.speed import compute_precision

    with torch.inference_mode(), compute_precision(precision, device):
        for batch in batches:
            model(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()


def pipeline_efficiency(paths: list[str], args) -> dict[str, tuple[float, float]]:
    """Per precision: (hookcli pipeline img/s, model forward alone img/s), both after a warm-up."""
    import torch

    import hookcli
    from hookcli.inputs.images import load_rgb
    from hookcli.models.loading import load_model
    from hookcli.run.fusion import fused_for_inference
    from hookcli.run.settings import default_workers
    from hookcli.run.speed import choose_memory_format, compute_dtype, to_memory_format

    device = torch.device(args.device)
    loaded = load_model(args.model, "none")
    transform = to_transform(loaded.preprocess)
    batches = [
        torch.stack([transform(load_rgb(p)) for p in paths[i : i + args.batch_size]])
        for i in range(0, len(paths), args.batch_size)
    ]
    memory_format = choose_memory_format(loaded.module, device)
    results = {}
    for precision in ("fp32", "bf16"):
        options = {
            "batch_size": args.batch_size,
            "device": args.device,
            "precision": precision,
            "workers": default_workers(device, len(paths), args.batch_size),
        }
        hookcli.extract(loaded, args.layer, paths[: args.batch_size * 2], **options)  # warm-up
        start = time.perf_counter()
        hookcli.extract(loaded, args.layer, paths, **options)
        ours = len(paths) / (time.perf_counter() - start)
        model = to_memory_format(loaded.module.to(device), memory_format)
        # The same network hookcli runs: fused on the CPU (a no-op on a GPU).
        forward = fused_for_inference(
            model, [args.layer], dtype=compute_dtype(precision), channels_last=memory_format == "channels_last"
        )[0]
        on_device = [to_memory_format(b.to(device), memory_format) for b in batches]
        _forward_all(forward, on_device, precision, device)  # warm-up
        start = time.perf_counter()
        _forward_all(forward, on_device, precision, device)
        results[precision] = (ours, len(paths) / (time.perf_counter() - start))
        model.to(memory_format=torch.contiguous_format)
    return results


if __name__ == "__main__":
    main()
