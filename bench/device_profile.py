"""Where a GPU run's time goes: the stages of ``--decode device`` one by one, and what ``stats`` and ``compare``
add to ``extract --pool avg`` per batch and once per run.

Run from the repository root on a GPU machine (``--device cpu`` and small counts check the script on a CPU):

    python bench/device_profile.py --out /tmp/profile        # 2,048 JPEGs, batch 256; 1,024 and 2,048 photos

Decoding (500x375 JPEGs, as ImageNet's; resnet50's preprocessing): the decode workers' batches alone (files read
and handed over, nothing decoded) and the input stage whole (their batches decoded on the device), each in steady
state over the files read ``--repeat`` times, with the time the input stage waits for the workers and decodes, with
every worker and with 4 (do idle cores speed the decoder?); then for the same batches in this process, each stage
synchronised and timed on its own: the bytes made tensors, ``decode_jpeg`` on the device (and nvImageCodec's
decoder, where it decodes, from copies of the bytes and from views of them), turning upright, resize and crop, scale
and normalise, and ``DeviceDecoder`` whole; and ``DeviceDecoder`` on a batch of JPEGs each of its own size.

Gathering (resnet50 ``layer3`` and ``layer4``, batch 128, in this process, warmed up): ``extract --pool avg``,
``stats --top 9`` and ``compare`` over two counts of photos, so that the time per photo and the time once per run
part; then ``torch.profiler``'s tables (host time and device time per operation) and ``cProfile``'s functions of
one ``stats`` and one ``compare`` run, written under ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import importlib
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402
from measured import photos  # noqa: E402


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device, work):
    _sync(device)
    start = time.perf_counter()
    result = work()
    _sync(device)
    return result, time.perf_counter() - start


def _steady(marks: list[tuple[float, int]]) -> float:
    """Images/s over the second half of ``marks`` ((time, images so far)): the workers' start behind."""
    half = next((mark for mark in marks if mark[1] >= marks[-1][1] // 2), marks[0])
    return (marks[-1][1] - half[1]) / max(marks[-1][0] - half[0], 1e-9)


def decode_stages(paths: list[str], batch_size: int, device, repeat: int) -> None:
    """The workers' share alone and the input stage whole (steady, over the files ``repeat`` times), what the
    input stage waits for, then each stage of ``--decode device`` alone, per batch."""
    import numpy as np
    import torch
    import torchvision.io
    from torchvision.io import ImageReadMode

    from hookcli.inputs.decoding import DeviceDecoder, device_jpeg_decoder, upright
    from hookcli.models.loading import load_model
    from hookcli.run.batches import image_loader
    from hookcli.run.settings import RunSettings
    from hookcli.run.speed import resolve_settings

    loaded = load_model("resnet50", "none")
    preprocess = loaded.preprocess.replace(decode="device")
    many = paths * repeat
    settings = resolve_settings(
        RunSettings(preprocess=preprocess, device=device, batch_size=batch_size), loaded, len(many)
    )
    marks = []
    for indices, *_ in image_loader(many, settings):
        marks.append((time.perf_counter(), (marks[-1][1] if marks else 0) + len(indices)))
    print(
        f"workers' share alone ({settings.workers} workers: read, check, hand over), steady: {_steady(marks):9.1f} "
        f"img/s"
    )
    decoder = DeviceDecoder(preprocess, device)
    print(f"decoder: {device_jpeg_decoder(device)}")
    for workers in sorted({settings.workers, min(4, settings.workers)}, reverse=True):
        _input_stage(many, dataclasses.replace(settings, workers=workers), decoder, device)
    batches = list(image_loader(paths, settings))
    totals: dict[str, float] = {}
    for turn, (indices, encoded, failures, _) in enumerate(batches):
        jpegs = [jpeg for _, jpeg in encoded.unpacked()]
        data, tensors = _timed(
            device, lambda: [torch.frombuffer(bytearray(jpeg.data), dtype=torch.uint8) for jpeg in jpegs]
        )
        images, decoding = _timed(
            device, lambda: torchvision.io.decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        )
        stages = [("bytes to tensors", tensors), ("decode_jpeg", decoding)]
        if decoder.codec is not None:
            codec = decoder.codec
            _, seconds = _timed(
                device, lambda: codec.decoder.decode([bytes(j.data) for j in jpegs], params=codec.params)
            )
            stages.append(("nvImageCodec", seconds))
            # The same batch handed over as views of the bytes the workers shared (no copy a JPEG), as code streams:
            # what DeviceDecoder._by_codec would gain from views, where this line is faster than the one above.
            codec_module = importlib.import_module("nvidia.nvimgcodec")
            _, seconds = _timed(device, lambda: codec.decoder.decode(
                [codec_module.CodeStream(np.frombuffer(j.data, dtype=np.uint8)) for j in jpegs], params=codec.params
            ))  # fmt: skip
            stages.append(("nvImageCodec, views", seconds))
        images, turning = _timed(device, lambda: [upright(i, j.orientation) for i, j in zip(images, jpegs)])
        stacked, stacking = _timed(device, lambda: torch.stack(images))
        cropped, geometry = _timed(device, lambda: decoder.steps.geometry(stacked))
        _, scaling = _timed(device, lambda: decoder.steps.scaled(cropped))
        _, whole = _timed(device, lambda: decoder(indices, encoded, failures))
        if turn == 0:
            continue  # warm-up
        stages += [
            ("upright", turning),
            ("stack", stacking),
            ("resize and crop", geometry),
            ("scale and normalise", scaling),
            ("DeviceDecoder whole", whole),
        ]
        for name, seconds in stages:
            totals[name] = totals.get(name, 0.0) + seconds
    counted = sum(len(indices) for indices, *_ in batches[1:])
    for name, seconds in totals.items():
        print(f"  {name:22s} {1000 * seconds / (len(batches) - 1):8.2f} ms a batch  {counted / seconds:10.1f} img/s")


def _input_stage(paths: list[str], settings, decoder, device) -> None:
    """The input stage whole (``settings.workers`` workers, their batches decoded here), steady, with the time it
    waits for the workers and the time it decodes: decoding well above ``DeviceDecoder`` alone means the workers or
    other threads take the cores the decoder needs."""
    from hookcli.run.batches import image_loader

    marks, waited, decoding = [], 0.0, 0.0
    loader = iter(image_loader(paths, settings))
    while True:
        start = time.perf_counter()
        found = next(loader, None)
        middle = time.perf_counter()
        if found is None:
            break
        decoder(*found[:3])
        _sync(device)
        end = time.perf_counter()
        if marks:  # the first batch waits for the workers to start
            waited, decoding = waited + middle - start, decoding + end - middle
        marks.append((end, (marks[-1][1] if marks else 0) + len(found[0])))
    after = max(len(marks) - 1, 1)
    print(
        f"input stage whole, {settings.workers} workers, steady: {_steady(marks):9.1f} img/s; a batch after the "
        f"first: {1000 * waited / after:.2f} ms waiting for the workers, {1000 * decoding / after:.2f} ms decoding"
    )


def mixed_sizes(folder: Path, count: int, device) -> None:
    """``DeviceDecoder`` on one batch of ``count`` JPEGs each of its own size, as a scraped set has them, twice: the
    first time its passes are planned, the second they are kept (``resized_windows`` resizes them together)."""
    from hookcli.inputs.decoding import DeviceDecoder, EncodedImages, collate
    from hookcli.models.loading import load_model

    rng = __import__("numpy").random.default_rng(1)
    sizes = {(int(rng.integers(300, 640)), int(rng.integers(240, 480))) for _ in range(4 * count)}
    paths = [make_images(folder, 1, (w, h))[0].rename(folder / f"{w}x{h}.jpg") for w, h in sorted(sizes)[:count]]
    preprocess = load_model("resnet50", "none").preprocess.replace(decode="device")
    images = EncodedImages([str(p) for p in paths], preprocess)
    batch = collate([images[i] for i in range(len(paths))])[:3]
    decoder = DeviceDecoder(preprocess, device)
    for turn in ("first", "again"):
        _, seconds = _timed(device, lambda: decoder(*batch))
        print(f"  {len(paths)} sizes in a batch, {turn}: DeviceDecoder whole {1000 * seconds:8.2f} ms a batch  "
              f"{len(paths) / seconds:10.1f} img/s")  # fmt: skip


def gather_costs(folder: Path, counts: list[int], device, out: Path) -> None:
    """extract --pool avg, stats and compare in this process at two counts; profiles of stats and compare."""
    import torch

    import hookcli
    from hookcli.models.loading import load_model

    loaded = load_model("resnet50", "none")
    made = photos(folder / "photos", max(counts))
    layers = ["layer3", "layer4"]
    options = {"batch_size": 128, "device": str(device)}
    runs = {
        "extract --pool avg": lambda p: hookcli.extract(loaded, layers, p, pool="avg", **options),
        "stats --top 9": lambda p: hookcli.stats(loaded, layers, p, top=9, **options),
        "compare linear-cka": lambda p: hookcli.compare(loaded, layers, p, **options),
    }
    for run in runs.values():
        run(made[:256])  # warm-up: kernels, workers' imports
    times: dict[str, list[float]] = {}
    for name, run in runs.items():
        for count in counts:
            _, seconds = _timed(device, lambda run=run, count=count: run(made[:count]))
            times.setdefault(name, []).append(seconds)
        small, large = times[name]
        per = (large - small) / (counts[1] - counts[0])
        print(
            f"{name:20s} {counts[0]}: {small:6.2f} s  {counts[1]}: {large:6.2f} s  "
            f"per photo {1000 * per:6.3f} ms  once {small - per * counts[0]:6.2f} s",
            flush=True,
        )
    base = times["extract --pool avg"]
    for name, values in times.items():
        print(f"{name:20s} ratio to extract at {counts[1]}: {values[1] / base[1]:.2f}")
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for name in ("stats --top 9", "compare linear-cka"):
        stem = name.split()[0]
        with profile(activities=activities) as profiled:
            runs[name](made[: counts[0]])
        table = profiled.key_averages()
        text = table.table(sort_by="self_cpu_time_total", row_limit=40)
        if device.type == "cuda":
            text += "\n" + table.table(sort_by="self_cuda_time_total", row_limit=25)
        (out / f"{stem}_ops.txt").write_text(text)
        profiler = cProfile.Profile()
        profiler.enable()
        runs[name](made[: counts[0]])
        profiler.disable()
        report = io.StringIO()
        pstats.Stats(profiler, stream=report).sort_stats("cumulative").print_stats(45)
        (out / f"{stem}_calls.txt").write_text(report.getvalue())
        print(f"{name}: profiles in {out}/{stem}_ops.txt and {stem}_calls.txt")
    del torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048, help="JPEGs whose decoding is timed")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--photos", default="1024,2048", help="the two counts of photos gathered over")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="/tmp/device-profile")
    parser.add_argument("--repeat", type=int, default=4, help="times the JPEGs are read for the steady rates")
    parser.add_argument("--skip", default="", help="decode or gather: parts left out")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "decode" not in args.skip:
            (folder / "images").mkdir()
            paths = [str(p) for p in make_images(folder / "images", args.images)]
            decode_stages(paths, args.batch_size, device, args.repeat)
            (folder / "mixed").mkdir()
            mixed_sizes(folder / "mixed", args.batch_size, device)
        if "gather" not in args.skip:
            gather_costs(folder, [int(n) for n in args.photos.split(",")], device, out)


if __name__ == "__main__":
    main()
