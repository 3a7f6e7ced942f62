"""Whole-process time of a one-image run, and of a longer one, against scripts written by hand.

Run from the repository root:  python bench/first_image_bench.py  [--rounds 5] [--images 64] [--before DIR]

Contenders, each a fresh process (imports, model build and writing included),
resnet50 up to `fc` with random weights (--weights none), on the CPU:

- one image (matplotlib's grace_hopper.jpg, 512x600): a script written by hand
  (torch, torchvision, Pillow, the weights' transforms, model(x) under
  inference_mode, safetensors) against `hookcli extract`, fp32 and
  --precision bf16;
- --images JPEGs of 500x375 (224x224 into the model), batch 16: the same
  script looping over batches against `hookcli extract`, to show that a long
  run keeps its speed.

--before DIR adds the same hookcli commands run from another source tree (the
folder holding its `hookcli` package, e.g. a copy of the code before a change),
side by side in the same rounds. The order is shuffled in each round; printed
are the median wall time of each contender over --rounds rounds (and the
fastest and slowest), its ratio to the hand-written script and the difference in
seconds, how many convolutions ran fused (from the file's metadata) and the
relative difference of the stored `fc` from the script's. TORCH_HOME points at
a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402
from speed_bench import LOOP, round_times  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HAND_ONE, HAND_MANY = "hand-written script", "hand-written loop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=64, help="images of the longer run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--before", type=Path, help="another hookcli source tree to run side by side")
    args = parser.parse_args()
    import matplotlib.cbook
    import torch
    from safetensors import safe_open

    photo = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    trees = {"": ROOT, " (before)": args.before.resolve()} if args.before else {"": ROOT}
    with tempfile.TemporaryDirectory(prefix="hookcli-first-image-") as name:
        folder = Path(name)
        os.environ["TORCH_HOME"] = str(folder / "torch-home")
        paths = [str(p) for p in make_images(folder, args.images)]
        script = folder / "hand.py"
        script.write_text(LOOP)
        outputs: dict[str, Path] = {}

        def hand(label: str, inputs: list[str]) -> list[str]:
            outputs[label] = folder / f"{len(outputs)}.safetensors"
            return [
                sys.executable,
                str(script),
                "resnet50",
                "fc",
                str(outputs[label]),
                str(args.batch_size),
                "cpu",
                *inputs,
            ]

        def hookcli(label: str, tree: Path, inputs: list[str], *options: str) -> list[str]:
            outputs[label] = folder / f"{len(outputs)}.safetensors"
            # -P: the hookcli package comes from PYTHONPATH, not from the folder the bench runs in.
            return [
                "env",
                f"PYTHONPATH={tree}",
                sys.executable,
                "-P",
                "-m",
                "hookcli",
                "extract",
                "-m",
                "resnet50",
                "-l",
                "fc",
                "--weights",
                "none",
                "-b",
                str(args.batch_size),
                "-q",
                "-f",
                *options,
                "-o",
                str(outputs[label]),
                *inputs,
            ]

        one = {HAND_ONE: hand(HAND_ONE, [photo])}
        many = {HAND_MANY: hand(HAND_MANY, paths)}
        for suffix, tree in trees.items():
            one[f"hookcli{suffix}"] = hookcli(f"hookcli{suffix}", tree, [photo])
            one[f"hookcli --precision bf16{suffix}"] = hookcli(
                f"hookcli --precision bf16{suffix}", tree, [photo], "--precision", "bf16"
            )
            many[f"hookcli, {args.images} images{suffix}"] = hookcli(
                f"hookcli, {args.images} images{suffix}", tree, paths
            )
        times = round_times({**one, **many}, args.rounds)

        def stored(label: str) -> tuple[str, torch.Tensor]:
            with safe_open(str(outputs[label]), "pt") as handle:
                return (handle.metadata() or {}).get("fused", ""), handle.get_tensor("fc").float()

        def report(title: str, contenders: dict, reference: str) -> None:
            print(title)
            base = statistics.median(times[reference])
            expected = stored(reference)[1]
            for label in contenders:
                median = statistics.median(times[label])
                fused, fc = stored(label)
                line = f"  {label:40s} {median:6.2f} s  ({min(times[label]):5.2f}-{max(times[label]):5.2f})"
                if label != reference:
                    difference = ((fc - expected).norm() / expected.norm()).item()
                    line += (
                        f"  {median / base:5.2f}x  {median - base:+6.2f} s  fused {fused:>2s}"
                        f"  rel. diff {difference:.1e}"
                    )
                print(line, flush=True)

        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, CPU only; resnet50 fc, --weights none; whole processes; "
            f"median of {args.rounds} shuffled rounds (fastest-slowest)"
        )
        report("one image (grace_hopper.jpg, 512x600):", one, HAND_ONE)
        report(f"{args.images} JPEGs of 500x375 (224x224 into the model), batch {args.batch_size}:", many, HAND_MANY)


if __name__ == "__main__":
    main()
