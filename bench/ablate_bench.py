"""What an ablation sweep costs, against its floor: the forward of the layers after the ablated one, once a unit.

Run from the repository root:  python bench/ablate_bench.py  [--images 64] [--batch-size 16] [--repeat 3]

For resnet18's ``layer4`` (512 units) and mobilenet_v2's ``features.14`` (160 units), random weights, over
``--images`` random 224 x 224 inputs already on the device (decoding is not what is measured): the sweep
(:class:`hookcli.run.ablation.UnitAblation`, every unit, the layers before included) is timed side by side with
its floor, the part of the model after the ablated layer alone, run on the layer's output once for each unit (each
batch's output copied per unit, as the sweep copies it, with nothing ablated and nothing measured). The ratio is
the sweep's time over the floor's, and over the floor and the layers before it run once a batch (the least a sweep
can cost); the best of ``--repeat`` runs of each is taken.
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision

from hookcli.run.ablation import UnitAblation

CASES = (("resnet18", "layer4"), ("mobilenet_v2", "features.14"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.randn(args.images, 3, 224, 224)
    print(f"{'model':14s} {'layer':12s} {'units':>5s} {'sweep s':>8s} {'after s':>8s} {'before s':>8s}  ratios")
    for name, layer in CASES:
        model = getattr(torchvision.models, name)().eval()
        sweep = UnitAblation(model, layer, how="zero", effect_on=".")
        assert sweep.traced, f"{name} traces"
        batches = images.split(args.batch_size)
        with torch.inference_mode():
            units = sweep.effects(batches[0][:1])["kl"].shape[1]
            swept = _best(args.repeat, lambda: [sweep.effects(batch) for batch in batches])
            before = _best(args.repeat, lambda: [sweep._first(batch) for batch in batches])
            envs = [sweep._first(batch)[0] for batch in batches]  # the layers before: not part of the floor
            floor = _best(args.repeat, lambda: [_floor(sweep, env, units) for env in envs])
        print(
            f"{name:14s} {layer:12s} {units:5d} {swept:8.2f} {floor:8.2f} {before:8.2f}  "
            f"{swept / floor:5.2f}x of after, {swept / (floor + before):5.2f}x of after + before"
        )


def _floor(sweep: UnitAblation, env: dict, units: int) -> None:
    """The part after the layer, on the layer's output copied once a unit, in the sweep's chunks."""
    layer = env[sweep._layer_node]
    per_copy = layer.numel() * layer.element_size() * 3
    chunk = max(1, min(units, sweep.chunk_bytes // per_copy))
    for start in range(0, units, chunk):
        count = min(chunk, units - start)
        sweep._replayed(env, layer.repeat(count, *([1] * (layer.dim() - 1))))


def _best(repeat: int, run) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


if __name__ == "__main__":
    main()
