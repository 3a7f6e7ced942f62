"""What comparisons cost: ``hookcli compare`` of saved features against thingsvision's CKA (or a straightforward
n x n implementation in numpy) on the same features, a comparison of two models run on the fly against the two
models' forward alone, and peak memory at four times the images.

Run from the repository root:  python bench/compare_bench.py  [--images 160] [--rows 160 1000 2000]
[--thingsvision WHEEL]

The photos are crops of the sample photo of Grace Hopper (``bench/measured.py``). Saved features: resnet18's
eight stages (``layer1.0`` … ``layer4.1``, random weights) pooled by the mean over the photos, repeated to as
many rows as ``--rows`` asks, each row with noise of its own. hookcli's ``linear-cka`` compares all 8 x 8 pairs
from running sums in one pass (after one untimed call: the imports are not the comparison's). thingsvision
(``--thingsvision``: its wheel, from ``pip download --no-deps thingsvision``; its CKA modules are loaded from it
alone) and the numpy reference build two n x n Gram matrices a pair and centre them, which grows as n³: they are
given at most ``--largest`` rows. On the fly: ``compare`` of resnet18's four stages against resnet34's, against
``extract --pool avg`` of each model's four stages, one after the other (each in a fresh process, the same photos
and options). Memory: ``compare --method linear-cka`` and ``minibatch-cka`` of the two models over 1x and 4x the
photos.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import measured, photos  # noqa: E402  (bench/ is no package)

import hookcli  # noqa: E402
from hookcli.storage.features import Features  # noqa: E402

STAGES = ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1"]


def numpy_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA the straightforward way: n x n Gram matrices, centred, their HSIC."""
    n = len(x)
    centring = np.eye(n) - np.ones((n, n)) / n
    k, ell = centring @ (x @ x.T) @ centring, centring @ (y @ y.T) @ centring
    return float(np.sum(k * ell) / np.sqrt(np.sum(k * k) * np.sum(ell * ell)))


def thingsvision_cka(wheel: Path, scratch: Path):
    """thingsvision's NumPy CKA, its modules loaded from the wheel without the package's own imports."""
    folder = scratch / "thingsvision"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder, [n for n in archive.namelist() if n.startswith("thingsvision/core/cka/")])
    for name in ("thingsvision", "thingsvision.core", "thingsvision.core.cka"):
        package = types.ModuleType(name)
        package.__path__ = [str(folder / name.replace(".", "/"))]
        sys.modules[name] = package
    for name in ("cka_base", "cka_numpy"):
        path = folder / "thingsvision/core/cka" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"thingsvision.core.cka.{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["thingsvision.core.cka.cka_numpy"].CKANumPy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=160)
    parser.add_argument("--thingsvision", type=Path, help="thingsvision's wheel (pip download --no-deps thingsvision)")
    parser.add_argument("--rows", type=int, nargs="+", default=[160, 1000, 2000], help="rows compared [160 1000 2000]")
    parser.add_argument("--largest", type=int, default=2000, help="the most rows the n x n methods are given [2000]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        paths = photos(Path(scratch) / "photos", args.images * 4)
        once = paths[: args.images]
        saved = f"{scratch}/stages.safetensors"
        layers = [x for stage in STAGES for x in ("-l", stage)]
        measured(["extract", "-m", "resnet18", "-w", "none", *layers, "--pool", "avg", "-q", "-o", saved, *once])

        features = hookcli.open_features(saved)
        real = {key: np.asarray(features[key], dtype=np.float64) for key in STAGES}
        hookcli.compare(features=saved)  # once first: the imports are not the comparison's
        tv = thingsvision_cka(args.thingsvision, Path(scratch)) if args.thingsvision else None
        print(f"saved features: resnet18's {len(STAGES)} stages pooled, 8 x 8 pairs (linear CKA)")
        print(f"{'rows':>6} {'hookcli s':>10} {'numpy n x n s':>14} {'ratio':>7} {'thingsvision s':>15} {'ratio':>7}")
        for rows in args.rows:
            # More rows than photos: the photos' rows again, each with a little noise of its own.
            noise = np.random.default_rng(rows)
            tiled = {k: np.resize(v, (rows, v.shape[1])) for k, v in real.items()}
            tiled = {k: v + noise.normal(scale=1e-3, size=v.shape) * v.std() for k, v in tiled.items()}
            names = json.dumps([f"row {n}" for n in range(rows)])
            table = Features({k: torch.from_numpy(v) for k, v in tiled.items()}, {"inputs": names})
            start = time.perf_counter()
            found = hookcli.compare(features=table, batch_size=256)["linear-cka"].numpy()
            ours = time.perf_counter() - start
            line = f"{rows:>6} {ours:>10.3f}"
            for contender in (numpy_cka, tv(m=rows, kernel="linear").compare if tv else None):
                if contender is None or rows > args.largest:
                    line += f" {'-':>14} {'-':>7}" if contender is numpy_cka else f" {'-':>15} {'-':>7}"
                    continue
                start = time.perf_counter()
                theirs = np.array([[contender(tiled[a], tiled[b]) for b in STAGES] for a in STAGES])
                elapsed = time.perf_counter() - start
                assert np.abs(found - theirs).max() < 1e-9, np.abs(found - theirs).max()
                width = 14 if contender is numpy_cka else 15
                line += f" {elapsed:>{width}.3f} {ours / elapsed:>7.3f}"
            print(line)

        common = ["-w", "none", "-q", "--force", "-b", "16"]
        four = ["-l", "layer1", "-l", "layer2", "-l", "layer3", "-l", "layer4"]
        both = ["compare", "-m", "resnet18", *four, "--model2", "resnet34", "--layer2", "layer*", *common]
        first = ["extract", "-m", "resnet18", *four, "--pool", "avg", *common, "-o", f"{scratch}/a.safetensors"]
        second = ["extract", "-m", "resnet34", *four, "--pool", "avg", *common, "-o", f"{scratch}/b.safetensors"]
        (a, _), (b, _) = measured([*first, *once]), measured([*second, *once])
        together, peak_once = measured([*both, "-o", f"{scratch}/c.safetensors", *once])
        print(f"on the fly: resnet18 against resnet34, four stages each, {args.images} photos")
        print(f"  extract --pool avg of each:    {a + b:7.1f} s ({a:.1f} + {b:.1f})")
        print(f"  compare in one pass:           {together:7.1f} s   ratio {together / (a + b):.3f}")
        for method in ("linear-cka", "minibatch-cka"):
            run = [*both, "--method", method, "-o", f"{scratch}/{method}.safetensors"]
            _, small = (0.0, peak_once) if method == "linear-cka" else measured([*run, *once])
            _, large = measured([*run, *paths])
            print(f"  {method} peak memory: {small} MiB over {len(once)} photos, {large} MiB over {len(paths)}")


if __name__ == "__main__":
    main()
