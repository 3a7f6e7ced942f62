"""Large photos: decoding whole against --fast-decode (JPEG decoded at a reduced scale).

Run from the repository root:  python bench/decode_bench.py  [--images 32] [--width 4000 --height 3000]

Camera-sized JPEGs (12 MP by default) cost far more to decode than a small
network's forward. Whole processes on the same files, best of --rounds
shuffled rounds: the hand-written loop, hookcli as it is, and hookcli
--fast-decode, each in fp32 and bf16; with the relative difference of the
stored logits from the loop's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from speed_bench import LOOP, best_times  # noqa: E402


def make_photos(folder: Path, count: int, size: tuple[int, int]) -> list[str]:
    """Camera-sized JPEGs: the sample photo that ships with matplotlib, enlarged, shifted and grained per file."""
    import matplotlib.cbook
    import numpy as np
    from PIL import Image

    photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        left, top = int(rng.integers(0, 100)), int(rng.integers(0, 200))
        enlarged = np.asarray(photo.crop((left, top, left + 400, top + 300)).resize(size, Image.BICUBIC))
        grain = rng.integers(-6, 7, size=enlarged.shape)
        path = folder / f"{i:04d}.jpg"
        Image.fromarray((enlarged + grain).clip(0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--layer", default="fc")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="hookcli-decode-") as name:
        folder = Path(name)
        paths = make_photos(folder, args.images, (args.width, args.height))
        megabytes = sum(os.path.getsize(p) for p in paths) / len(paths) / 2**20
        script = folder / "loop.py"
        script.write_text(LOOP)
        hookcli = [sys.executable, "-m", "hookcli", "extract", "-m", args.model, "-w", "none", "-l", args.layer]
        hookcli += ["-b", str(args.batch_size), "-q", "-f", "--device", "cpu"]
        contenders = {
            "hand-written loop": [
                sys.executable,
                str(script),
                args.model,
                args.layer,
                str(folder / "loop.safetensors"),
                str(args.batch_size),
                "cpu",
                *paths,
            ]
        }
        for precision in ("fp32", "bf16"):
            for fast in (False, True):
                label = f"hookcli --precision {precision}" + (" --fast-decode" if fast else "")
                out = folder / f"{precision}{'-fast' if fast else ''}.safetensors"
                contenders[label] = [
                    *hookcli,
                    "--precision",
                    precision,
                    *(["--fast-decode"] if fast else []),
                    "-o",
                    str(out),
                    *paths,
                ]
        best = best_times(contenders, args.rounds)
        reference = load_file(str(folder / "loop.safetensors"))[args.layer]
        errors = {}
        for label, command in contenders.items():
            if label != "hand-written loop":
                stored = load_file(command[command.index("-o") + 1])[args.layer].float()
                errors[label] = ((stored - reference).norm() / reference.norm()).item()
    loop = best["hand-written loop"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, CPU")
    print(
        f"{args.model} {args.layer}, {args.images} JPEGs of {args.width}x{args.height} ({megabytes:.1f} MB each), "
        f"batch {args.batch_size}, whole processes, best of {args.rounds} shuffled rounds:"
    )
    for label, seconds in best.items():
        extra = f"  rel. error {errors[label]:.1e}" if label in errors else ""
        print(f"  {label:38s} {seconds:6.1f} s  {args.images / seconds:6.2f} img/s  {loop / seconds:5.2f}x{extra}")


if __name__ == "__main__":
    main()
