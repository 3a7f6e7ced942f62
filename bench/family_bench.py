"""Each model family through hookcli.extract, against hooks written by hand on the same model and inputs.

Run from the repository root:  python bench/family_bench.py  [--rounds 5] [--quick]

One row per family: resnet18, quantized_resnet18, lraspp_mobilenet_v3_large,
fasterrcnn_mobilenet_v3_large_320_fpn, r3d_18 and raft_small, random weights
(speed does not depend on them), CPU only, on small inputs written here: JPEGs
of 400x300 and 300x400 (the two sizes alternate, so segmentation and detection
batches hold rows of two shapes) and short MP4s of 160x128 written with PyAV.

Both sides do the same work, one batch after another: decode, the weights'
own preprocessing at the same sizes (torchvision's presets on the hand-written
side), the forward in batches of the same size, and a copy of the hooked
layer's output for every row (cut to each image's part of the padded batch for
detection; every call of a layer that runs several times). The hand-written
side stops the forward once the layer has run its last time, by raising from
its hook, as hookcli's early exit does. hookcli keeps its defaults: on the CPU,
classification and segmentation run channels-last and fused (16 inputs or
more); the other families run as written.

Timings are in this process, on one model object, after one warm-up run of
each side, best of --rounds rounds in shuffled order. Rows are images, clips or
pairs of frames. "rel. diff" is the largest relative difference (L2) between a
row hookcli stored and the same row caught by hand.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import best_times  # noqa: E402

VIDEO_SIZE = (160, 128)  # width, height: RAFT needs sides divisible by 8 and at least 128


@dataclass(frozen=True)
class Job:
    """One family's row: the model, the layer, the inputs and hookcli's options."""

    family: str
    model: str
    layer: str
    inputs: str  # "images", "videos" or "flow"
    options: dict = field(default_factory=dict)
    calls: int = 1  # how often the layer runs in one forward


JOBS = (
    Job("classification", "resnet18", "layer3", "images", {"resize": 144, "crop": 128}),
    Job("quantized", "quantized_resnet18", "layer3", "images", {"resize": 144, "crop": 128}),
    Job("segmentation", "lraspp_mobilenet_v3_large", "classifier", "images", {"resize": 128}),
    Job("detection", "fasterrcnn_mobilenet_v3_large_320_fpn", "backbone", "images"),
    Job("video", "r3d_18", "layer3", "videos", {"resize": 64, "crop": 56, "clip_length": 8, "clips_per_video": 0}),
    Job("optical_flow", "raft_small", "update_block.flow_head", "flow", calls=12),  # RAFT's 12 refinement steps
)


def make_images(folder: Path, count: int) -> list[Path]:
    """JPEGs cut from matplotlib's sample photo, alternately landscape and portrait."""
    import matplotlib.cbook
    import numpy as np
    from PIL import Image

    photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        width, height = (400, 300) if i % 2 == 0 else (300, 400)
        left, top = int(rng.integers(0, photo.width - width)), int(rng.integers(0, photo.height - height))
        path = folder / f"{i:05d}.jpg"
        photo.crop((left, top, left + width, top + height)).save(path, quality=90)
        paths.append(path)
    return paths


def make_inputs(folder: Path, images: int, videos: int, frames: int, pairs: int) -> dict[str, list[Path]]:
    """:func:`make_images`, and MP4s panning over the same photo."""
    import av
    import matplotlib.cbook
    import numpy as np
    from PIL import Image

    photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    found: dict[str, list[Path]] = {"images": make_images(folder, images), "videos": [], "flow": []}

    def video(path: Path, count: int, offset: int) -> Path:
        width, height = VIDEO_SIZE
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=25)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for t in range(count):
                left, top = offset + 2 * t, t
                pixels = np.asarray(photo.crop((left, top, left + 2 * width, top + 2 * height)).resize(VIDEO_SIZE))
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        return path

    found["videos"] = [video(folder / f"clip{i}.mp4", frames, 40 * i) for i in range(videos)]
    found["flow"] = [video(folder / "pan.mp4", pairs + 1, 0)]
    return found


# -- the hand-written side -------------------------------------------------------------------------


class _LastCall(Exception):
    """Raised from the hand-written hook after the layer's last call: the rest of the forward is not needed."""


def _copied(output):
    """The hooked output, off the graph and safe from later in-place ops; quantized tensors as their values."""
    if isinstance(output, dict):
        return {name: _copied(value) for name, value in output.items()}
    return output.dequantize() if output.is_quantized else output.detach().clone()


def hooked(model, layer: str, forward, calls: int = 1) -> list:
    """What ``layer`` returns during ``forward()``, one copy per call; the forward stops after call ``calls``."""
    import torch

    caught = []

    def hook(module, inputs, output):
        caught.append(_copied(output))
        if len(caught) == calls:
            raise _LastCall

    handle = model.get_submodule(layer).register_forward_hook(hook)
    try:
        with torch.inference_mode():
            forward()
    except _LastCall:
        pass
    finally:
        handle.remove()
    return caught


def hand_images(model, layer, paths, transform, batch_size, calls) -> dict[str, list]:
    """Images of one shape stacked into one forward per batch (segmentation keeps sizes: a forward per shape)."""
    import torch
    from PIL import Image

    rows = []
    for start in range(0, len(paths), batch_size):
        images = [transform(Image.open(p).convert("RGB")) for p in paths[start : start + batch_size]]
        found = [None] * len(images)
        for shape in dict.fromkeys(image.shape for image in images):
            picked = [i for i, image in enumerate(images) if image.shape == shape]
            batch = torch.stack([images[i] for i in picked])
            (output,) = hooked(model, layer, lambda: model(batch), calls)
            for position, i in enumerate(picked):
                found[i] = output[position]
        rows += found
    return {layer: rows}


def hand_detection(model, layer, paths, transform, batch_size, calls) -> dict[str, list]:
    """A list of images per forward; each map cut to the part that covers its image in the model's padded batch."""
    from PIL import Image

    sizes = {}

    def on_transform(module, inputs, output):
        sizes["images"], sizes["padded"] = output[0].image_sizes, output[0].tensors.shape[-2:]

    rows: dict[str, list] = {}
    with model.transform.register_forward_hook(on_transform):
        for start in range(0, len(paths), batch_size):
            images = [transform(Image.open(p).convert("RGB")) for p in paths[start : start + batch_size]]
            (output,) = hooked(model, layer, lambda: model(images), calls)
            (padded_height, padded_width) = sizes["padded"]
            for name, maps in output.items():
                height, width = maps.shape[-2:]
                rows.setdefault(f"{layer}#{name}", []).extend(
                    maps[i, :, : math.ceil(height * h / padded_height), : math.ceil(width * w / padded_width)]
                    for i, (h, w) in enumerate(sizes["images"])
                )
    return rows


def _decoded(path):
    """Every frame of a video, ``uint8 [T, H, W, 3]``."""
    import av
    import numpy as np

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def hand_clips(model, layer, paths, transform, batch_size, calls, *, length) -> dict[str, list]:
    """Each video decoded once and cut into every whole clip of ``length`` frames from frame 0."""
    import torch

    rows = []
    clips = []
    for path in paths:
        frames = torch.from_numpy(_decoded(path)).permute(0, 3, 1, 2)
        clips += [transform(frames[start : start + length]) for start in range(0, len(frames) - length + 1, length)]
    for start in range(0, len(clips), batch_size):
        batch = torch.stack(clips[start : start + batch_size])
        (output,) = hooked(model, layer, lambda: model(batch), calls)
        rows += list(output)
    return {layer: rows}


def hand_pairs(model, layer, paths, transform, batch_size, calls) -> dict[str, list]:
    """Every pair of consecutive frames, a batch of first frames and one of second frames per forward."""
    import torch

    rows: dict[str, list] = {f"{layer}:{call}": [] for call in range(calls)}
    for path in paths:
        frames = torch.from_numpy(_decoded(path)).permute(0, 3, 1, 2)
        for start in range(0, len(frames) - 1, batch_size):
            stop = min(start + batch_size, len(frames) - 1)
            first, second = transform(frames[start:stop], frames[start + 1 : stop + 1])
            for call, output in enumerate(hooked(model, layer, lambda: model(first, second), calls)):
                rows[f"{layer}:{call}"] += list(output)
    return rows


def hand_loop(job: Job, loaded, paths, batch_size) -> tuple:
    """``(function, *arguments)`` of the hand-written side of ``job``, with torchvision's preset at hookcli's sizes."""
    import functools

    import torchvision.models

    preset = torchvision.models.get_model_weights(job.model).DEFAULT.transforms
    if job.family == "video":
        function = functools.partial(hand_clips, length=job.options["clip_length"])
        transform = preset(crop_size=(job.options["crop"],) * 2, resize_size=(job.options["resize"],))
    elif job.family in ("detection", "optical_flow"):
        function, transform = (hand_detection if job.family == "detection" else hand_pairs), preset()
    else:
        sizes = {
            name: job.options[key]
            for key, name in (("resize", "resize_size"), ("crop", "crop_size"))
            if key in job.options
        }
        function, transform = hand_images, preset(**sizes)
    return function, loaded.module, job.layer, paths, transform, batch_size, job.calls


# -- the comparison --------------------------------------------------------------------------------


def largest_difference(features, rows: dict[str, list]) -> float:
    """The largest relative L2 difference between a row hookcli stored and the one caught by hand."""
    worst = 0.0
    for key, expected in rows.items():
        if len(expected) != len(features.inputs):
            raise AssertionError(f"{key}: {len(expected)} rows by hand, {len(features.inputs)} from hookcli")
        for index, row in enumerate(expected):
            stored = features.row(key, index)
            if tuple(stored.shape) != tuple(row.shape):
                raise AssertionError(f"{key}, row {index}: hookcli {list(stored.shape)}, by hand {list(row.shape)}")
            worst = max(worst, ((stored - row).norm() / row.norm().clamp_min(1e-30)).item())
    return worst


def compare(job: Job, paths, batch_size: int, rounds: int) -> dict:
    """``job`` through hookcli and by hand, side by side on one model object: rows/s of each and their difference."""
    import hookcli

    loaded = hookcli.load_model(job.model, "none")
    kept = {}

    def keep(name, function, *args):
        kept[name] = function(*args)

    options = {"batch_size": batch_size, "device": "cpu", **job.options}
    best = best_times(
        {
            "hookcli": (keep, "hookcli", lambda: hookcli.extract(loaded, job.layer, paths, **options)),
            "hand": (keep, "hand", *hand_loop(job, loaded, paths, batch_size)),
        },
        rounds,
    )
    features = kept["hookcli"]
    count = len(features.inputs)
    return {
        "family": job.family,
        "model": job.model,
        "layer": job.layer,
        "rows": count,
        "hookcli": count / best["hookcli"],
        "hand": count / best["hand"],
        "diff": largest_difference(features, kept["hand"]),
        "fused": features.metadata["fused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64, help="JPEGs for the image families")
    parser.add_argument("--videos", type=int, default=2, help="videos for r3d_18, each cut into clips of 8 frames")
    parser.add_argument("--frames", type=int, default=64, help="frames of each of those videos")
    parser.add_argument("--pairs", type=int, default=16, help="pairs of frames for raft_small")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only",
        choices=[job.family for job in JOBS],
        action="append",
        help="run only this family (repeat for several)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 8 images, 2 clips, 4 pairs, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.images, args.videos, args.frames, args.pairs, args.rounds = 8, 1, 16, 4, 1
    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads, CPU only"
    )
    print(
        f"batch {args.batch_size}, random weights, in-process, best of {args.rounds} shuffled rounds after a warm-up:"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hookcli-family-bench-") as name:
        inputs = make_inputs(Path(name), args.images, args.videos, args.frames, args.pairs)
        results = [
            compare(job, inputs[job.inputs], args.batch_size, args.rounds)
            for job in JOBS
            if not args.only or job.family in args.only
        ]
    header = ("family", "model", "layer", "rows", "hookcli rows/s", "hand rows/s", "ratio", "rel. diff", "fused")
    table = [header] + [
        (
            r["family"],
            r["model"],
            f"`{r['layer']}`",
            str(r["rows"]),
            f"{r['hookcli']:.1f}",
            f"{r['hand']:.1f}",
            f"{r['hookcli'] / r['hand']:.2f}x",
            f"{r['diff']:.1e}",
            r["fused"],
        )
        for r in results
    ]
    print_table(table)
    print(f"({time.perf_counter() - started:.0f} s in all)")


def print_table(table: list) -> None:
    """Rows of cells as a Markdown table, the first row its header."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for number, row in enumerate(table):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |")
        if number == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")


if __name__ == "__main__":
    main()
