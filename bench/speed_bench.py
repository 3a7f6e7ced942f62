"""Whole-process speed: hookcli's default and bf16 modes against a hand-written loop.

Run from the repository root:  python bench/speed_bench.py  [--images 384] [--model resnet50]

Each contender is a fresh process on the same JPEGs (imports, model build and
writing included), run in a shuffled order for --rounds rounds; the best time
of each is kept. The hand-written loop is what a user would write: Pillow
decode -> the weights' transforms -> model(x) under inference_mode -> save.
Goals: hookcli default >= 1.2x the loop's throughput; --precision bf16 >= 3x,
with the relative error of its stored features (against the loop's fp32) shown.
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

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402

LOOP = '''
import sys, torch, torchvision
from PIL import Image
from safetensors.torch import save_file
name, layer, out, batch_size, *paths = sys.argv[1:]
batch_size = int(batch_size)
torch.manual_seed(0)
model = torchvision.models.get_model(name, weights=None).eval()
transform = torchvision.models.get_model_weights(name).DEFAULT.transforms()
outputs = []
with torch.inference_mode():
    for start in range(0, len(paths), batch_size):
        batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[start:start + batch_size]])
        outputs.append(model(batch))
save_file({layer: torch.cat(outputs)}, out)
'''


def run(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--layer", default="fc", help="the last layer, so both compute the whole network")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
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
        hookcli = [sys.executable, "-m", "hookcli", "extract", "-m", args.model, "-w", "none", "-l", args.layer,
                   "-b", str(args.batch_size), "-q", "-f"]
        contenders = {
            "hand-written loop": [sys.executable, str(script), args.model, args.layer, str(folder / "loop.safetensors"),
                                  str(args.batch_size), *paths],
            "hookcli (default: channels-last)": [*hookcli, "-o", str(folder / "default.safetensors"), str(folder)],
            "hookcli --precision bf16": [*hookcli, "--precision", "bf16", "-o", str(folder / "bf16.safetensors"),
                                         str(folder)],
        }
        best = {label: float("inf") for label in contenders}
        shuffler = random.Random(0)
        for _ in range(args.rounds):
            for label in shuffler.sample(list(contenders), len(contenders)):
                best[label] = min(best[label], run(contenders[label]))
        reference = load_file(str(folder / "loop.safetensors"))[args.layer]

        def error(file: str) -> str:
            stored = load_file(str(folder / file))[args.layer]
            return f"{((stored.float() - reference).norm() / reference.norm()).item():.1e}"

        errors = {"hookcli (default: channels-last)": error("default.safetensors"),
                  "hookcli --precision bf16": error("bf16.safetensors")}
        goals = {"hookcli (default: channels-last)": ">= 1.2x", "hookcli --precision bf16": ">= 3x"}
    loop = best["hand-written loop"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, CPU only")
    print(f"{args.model} {args.layer}, {args.images} JPEGs 500x375, batch {args.batch_size}, whole processes, "
          f"best of {args.rounds} shuffled rounds:")
    for label, seconds in best.items():
        extra = f"  rel. error {errors[label]}  (goal {goals[label]})" if label in errors else ""
        print(f"  {label:34s} {seconds:6.1f} s  {args.images / seconds:6.1f} img/s  {loop / seconds:5.2f}x{extra}")


if __name__ == "__main__":
    main()
