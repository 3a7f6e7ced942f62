"""Fused against eager forward, per model, fp32 and bf16, on the CPU.

Run from the repository root:  python bench/fusion_bench.py  [--models resnet50 mobilenet_v2 ...] [--batch-size 16]

Each model (random weights, BatchNorm statistics randomised so that folding
them changes the weights) runs channels-last, in inference mode, on the same
random batch: the model as written, then hookcli's fused graph
(hookcli.run.fusion, nothing hooked), interleaved for --rounds rounds, best time
kept. bf16 is autocast for both. Printed: ms per image, the ratio, and the
relative difference of the outputs (fused against eager, same precision).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

MODELS = ["resnet50", "vgg16_bn", "mobilenet_v2", "efficientnet_b0", "regnet_y_400mf", "densenet121"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    import torchvision

    from hookcli.run.fusion import fused_for_inference
    from hookcli.run.speed import compute_dtype, compute_precision

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU; batch {args.batch_size}, 224x224, best of {args.rounds}"
    )
    print(f"  {'model':18s} {'precision':9s} {'eager':>9s} {'fused':>9s}  {'ratio':>5s}  fused convs  rel. diff")
    cpu = torch.device("cpu")
    for name in args.models:
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None).eval()
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
        model = model.to(memory_format=torch.channels_last)
        batch = torch.randn(args.batch_size, 3, 224, 224).contiguous(memory_format=torch.channels_last)
        for precision in ("fp32", "bf16"):
            fused, count = fused_for_inference(model, [], dtype=compute_dtype(precision), channels_last=True)
            best = {"eager": float("inf"), "fused": float("inf")}
            outputs = {}
            with torch.inference_mode(), compute_precision(precision, cpu):
                for label, network in (("eager", model), ("fused", fused)):
                    outputs[label] = network(batch).float()  # warm-up (oneDNN builds its kernels)
                for _ in range(args.rounds):
                    for label, network in (("eager", model), ("fused", fused)):
                        start = time.perf_counter()
                        network(batch)
                        best[label] = min(best[label], time.perf_counter() - start)
            difference = ((outputs["fused"] - outputs["eager"]).norm() / outputs["eager"].norm()).item()
            eager, quick = (best[k] / args.batch_size * 1000 for k in ("eager", "fused"))
            print(
                f"  {name:18s} {precision:9s} {eager:6.2f} ms {quick:6.2f} ms  {eager / quick:4.2f}x  "
                f"{count:11d}  {difference:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
