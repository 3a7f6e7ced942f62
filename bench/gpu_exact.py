"""hookcli's results on a GPU against the same on the CPU, one line a check: what ``--precision fp32`` promises
(the CPU's values, to float32 rounding) and what the faster precisions give up.

Run from the repository root on a GPU machine (``--device cpu`` runs the script against itself, to try it):

    python bench/gpu_exact.py                 # 16 photos
    python bench/gpu_exact.py --photos 64

Each line: relative L2 difference by key (``|gpu - cpu| / |cpu|``), and whether the chosen targets agree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measured import photos  # noqa: E402


def relative(found, expected) -> float:
    """``|found - expected| / |expected|`` over all values, in float64."""
    import numpy as np
    import torch

    found = torch.as_tensor(np.asarray(found), dtype=torch.float64)
    expected = torch.as_tensor(np.asarray(expected), dtype=torch.float64)
    return ((found - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def report(name: str, check) -> None:
    """One line: what ``check()`` says, or how it failed, and how long it took."""
    start = time.perf_counter()
    try:
        said = check()
    except Exception as err:  # one check's failure is a line of the report, not the end of it
        said = f"FAILED {type(err).__name__}: {str(err)[:300]}"
    print(f"{name:52s} {said}   ({time.perf_counter() - start:.1f} s)", flush=True)


def by_key(found, expected, keys) -> str:
    return " ".join(f"{key}:{relative(found[key], expected[key]):.1e}" for key in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--photos", type=int, default=16)
    args = parser.parse_args()

    import hookcli

    device = args.device
    with tempfile.TemporaryDirectory() as folder:
        paths = photos(Path(folder) / "photos", args.photos)
        common = {"weights": "none", "batch_size": 8}

        def features(model, layers, where, **options):
            found = hookcli.extract(model, layers, paths, device=where, **common, **options)
            return {key: found[key].float().cpu() for key in found}

        models = [
            ("resnet50", ["layer1", "layer3", "fc"]),
            ("vgg16_bn", ["features.18", "features.40"]),
            ("vit_b_16", ["encoder.layers.encoder_layer_5", "heads"]),
        ]
        for model, layers in models:
            on_cpu = features(model, layers, "cpu")
            for precision in ("fp32", "tf32", "bf16"):
                report(
                    f"extract {model} {precision} vs the CPU's fp32",
                    lambda: by_key(features(model, layers, device, precision=precision), on_cpu, on_cpu),
                )

        def gradients():
            on_cpu = hookcli.grad("resnet50", "layer4", paths, device="cpu", **common)
            here = hookcli.grad("resnet50", "layer4", paths, device=device, **common)
            agree = on_cpu.metadata["targets"] == here.metadata["targets"]
            return f"{by_key(here, on_cpu, on_cpu)} targets agree: {agree}"

        report("grad resnet50 layer4", gradients)

        def maps():
            on_cpu = hookcli.cam("resnet50", paths, device="cpu", **common)
            here = hookcli.cam("resnet50", paths, device=device, **common)
            return f"cam:{relative(here['cam'], on_cpu['cam']):.1e}"

        report("cam resnet50", maps)

        def statistics():
            on_cpu = hookcli.stats("resnet50", "layer3", paths, device="cpu", top=4, **common)
            here = hookcli.stats("resnet50", "layer3", paths, device=device, top=4, **common)
            keys = [f"layer3@{name}" for name in ("mean", "std", "quantiles", "top_values", "pca_values")]
            rows = (here["layer3@top_rows"] == on_cpu["layer3@top_rows"]).float().mean().item()
            return f"{by_key(here, on_cpu, keys)} top rows the same: {rows:.3f}"

        report("stats resnet50 layer3", statistics)

        def similarity():
            on_cpu = hookcli.compare("resnet18", "layer*", paths, device="cpu", **common)
            here = hookcli.compare("resnet18", "layer*", paths, device=device, **common)
            import numpy as np

            difference = np.abs(np.asarray(here["linear-cka"]) - np.asarray(on_cpu["linear-cka"])).max()
            return f"largest difference {difference:.1e}"

        report("compare resnet18 layer* linear-cka", similarity)

        def decoders():
            by_cpu = features("resnet50", ["layer1", "fc"], device)
            by_device = features("resnet50", ["layer1", "fc"], device, decode="device")
            return by_key(by_device, by_cpu, by_cpu)

        report("extract resnet50, decode device vs cpu", decoders)


if __name__ == "__main__":
    main()
