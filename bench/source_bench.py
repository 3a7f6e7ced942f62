"""Each model source other than torchvision through hookcli.extract, against hooks written by hand on the same model.

Run from the repository root:  python bench/source_bench.py  [--rounds 5] [--quick] [--only timm]

Three rows, random weights (speed does not depend on them), CPU only:

- timm: ``timm:resnet18``, layer ``layer3``;
- hf: a transformers ViTModel the size of a ViT-Small (6 layers of width 384,
  6 heads, 224x224 in patches of 16) written here with ``save_pretrained``,
  next to a ViTImageProcessor of 224x224, and read back as ``hf:FOLDER`` with
  the folder's weights; layer ``layers.3``;
- timm: ``timm:vit_small_patch16_224``, layer ``blocks.5``.

Inputs are JPEGs of 400x300 and 300x400, alternately, written here. Nothing
is downloaded (HF_HUB_OFFLINE=1) and no cache is written to.

Both sides do the same work, one batch after another: decode with Pillow, the
source's own preprocessing, the forward in batches of the same size, and a
copy of the hooked layer's output for every row. The hand-written side builds
the preprocessing from torchvision transforms, reading the model's own
settings: timm's data config (shorter side to floor(224 / crop_pct), bicubic,
centre crop 224) and the folder's processor config (the whole image to
224x224, bilinear, by Pillow as transformers' ViTImageProcessorPil does), then
scales to [0, 1] and normalises with the mean and std given there. It stops
the forward once the layer has run, by raising from its hook, as hookcli's
early exit does. hookcli keeps its defaults: on the CPU, a convolutional
classifier (resnet18) runs channels-last and fused (16 inputs or more); the
ViTs run as written.

Timings are in this process, on one model object per row, after one warm-up
run of each side, best of --rounds rounds in shuffled order. "ratio" is the
hand-written time over hookcli's: above 1, hookcli is faster. "rel. diff" is
the largest relative difference (L2) between a row hookcli stored and the
same row caught by hand.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may be fetched
sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import best_times  # noqa: E402
from family_bench import hand_images, largest_difference, make_images, print_table  # noqa: E402

HF_FOLDER = "vit-384x6"  # the Hugging Face model's folder, inside this run's temporary folder


@dataclass(frozen=True)
class Job:
    """One row: the source, the model as hookcli is given it, the layer and the weights."""

    source: str
    model: str  # "{folder}" stands for this run's temporary folder
    layer: str
    weights: str


JOBS = (
    Job("timm", "timm:resnet18", "layer3", "none"),
    Job("hf", f"hf:{{folder}}/{HF_FOLDER}", "layers.3", "DEFAULT"),
    Job("timm", "timm:vit_small_patch16_224", "blocks.5", "none"),
)


def make_hf_folder(folder: Path) -> Path:
    """A ViTModel of random weights and its image processor, as ``save_pretrained`` writes them."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    config = transformers.ViTConfig(
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=224,
        patch_size=16,
    )
    torch.manual_seed(0)
    transformers.ViTModel(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


# -- the hand-written side -------------------------------------------------------------------------


def hand_transform(job: Job, module, model: str):
    """The source's preprocessing as torchvision transforms of a PIL image, from the model's own settings."""
    from torchvision import transforms as T

    if job.source == "timm":
        import timm.data

        config = timm.data.resolve_model_data_config(module)
        if config.get("crop_mode", "center") != "center":
            raise ValueError(f"{job.model}: timm's crop mode '{config['crop_mode']}' is not built here")
        height, width = config["input_size"][-2:]
        steps = [
            T.Resize(
                math.floor(height / config["crop_pct"]), interpolation=T.InterpolationMode(config["interpolation"])
            ),
            T.CenterCrop((height, width)),
        ]
        mean, std = config["mean"], config["std"]
    else:
        from PIL import Image
        from transformers import ViTImageProcessor

        processor = ViTImageProcessor.from_pretrained(model.removeprefix("hf:"))
        modes = {
            Image.Resampling.BILINEAR: T.InterpolationMode.BILINEAR,
            Image.Resampling.BICUBIC: T.InterpolationMode.BICUBIC,
        }
        steps = [
            T.Resize(
                (processor.size["height"], processor.size["width"]),
                interpolation=modes[Image.Resampling(processor.resample)],
            )
        ]
        mean, std = processor.image_mean, processor.image_std
    return T.Compose([*steps, T.ToTensor(), T.Normalize(mean, std)])


# -- the comparison --------------------------------------------------------------------------------


def compare(job: Job, model: str, paths, batch_size: int, rounds: int) -> dict:
    """``job`` through hookcli and by hand, side by side on one model object: the time of each, their difference."""
    import hookcli

    loaded = hookcli.load_model(model, job.weights)
    kept = {}

    def keep(name, function, *args):
        kept[name] = function(*args)

    transform = hand_transform(job, loaded.module, model)
    best = best_times(
        {
            "hookcli": (
                keep,
                "hookcli",
                lambda: hookcli.extract(loaded, job.layer, paths, batch_size=batch_size, device="cpu"),
            ),
            "hand": (keep, "hand", hand_images, loaded.module, job.layer, paths, transform, batch_size, 1),
        },
        rounds,
    )
    features = kept["hookcli"]
    return {
        "source": job.source,
        "model": job.model.format(folder="TMP"),
        "layer": job.layer,
        "rows": len(features.inputs),
        "hookcli": best["hookcli"],
        "hand": best["hand"],
        "diff": largest_difference(features, kept["hand"]),
        "fused": features.metadata["fused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64, help="JPEGs, 400x300 and 300x400 alternately")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only",
        choices=sorted({job.source for job in JOBS}),
        action="append",
        help="run only this source's rows (repeat for several)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16 images, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.images, args.rounds = 16, 1
    import timm
    import torch
    import transformers

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, timm "
        f"{timm.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} intra-op threads, "
        "CPU only"
    )
    print(
        f"batch {args.batch_size}, random weights, in-process, best of {args.rounds} shuffled rounds after a warm-up:"
    )
    started = time.perf_counter()
    jobs = [job for job in JOBS if not args.only or job.source in args.only]
    with tempfile.TemporaryDirectory(prefix="hookcli-source-bench-") as name:
        folder = Path(name)
        paths = make_images(folder, args.images)
        if any(job.source == "hf" for job in jobs):
            make_hf_folder(folder / HF_FOLDER)
        results = [compare(job, job.model.format(folder=folder), paths, args.batch_size, args.rounds) for job in jobs]
    header = ("source", "model", "layer", "rows", "hand-written s", "hookcli s", "ratio", "rel. diff", "fused")
    table = [header] + [
        (
            r["source"],
            r["model"],
            f"`{r['layer']}`",
            str(r["rows"]),
            f"{r['hand']:.2f}",
            f"{r['hookcli']:.2f}",
            f"{r['hand'] / r['hookcli']:.2f}x",
            f"{r['diff']:.1e}",
            r["fused"],
        )
        for r in results
    ]
    print_table(table)
    print(f"({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
