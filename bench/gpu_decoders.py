"""JPEG decoders that can feed a GPU, side by side: images/s and pixels against the CPU's libjpeg.

Run from the repository root on a GPU machine:

    python bench/gpu_decoders.py --images 2048 --batch-size 256

Photo-sized JPEGs (500x375, as ImageNet's) are made once. Each decoder turns batches of their bytes into uint8
RGB tensors on the device (after one warm-up batch, the device synchronised before the clock stops):

- ``cpu``: torchvision's ``decode_jpeg`` on one core, image by image (libjpeg-turbo: hookcli's CPU path);
- ``torchvision``: torchvision's batched ``decode_jpeg(..., device="cuda")`` (nvJPEG: today's ``--decode device``);
- ``nvimgcodec-*``: NVIDIA's nvImageCodec, when installed, with each backend it offers (``hw`` is the A100/H100
  hardware JPEG engine), and ``gpu-fancy`` with the chroma upsampling libjpeg uses.

For each, the pixels of the first ``--compare`` images against ``cpu``: the largest difference in levels of 255,
the mean, and the share of values that differ. A decoder that is missing or fails prints one line and the rest go on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def torchvision_cpu(datas, device) -> Callable[[list], list]:
    """libjpeg-turbo on one core, image by image, then to the device."""
    import torch
    import torchvision.io as io

    torch.set_num_threads(1)

    def decode(batch: list) -> list:
        return [io.decode_jpeg(t, mode=io.ImageReadMode.RGB).to(device) for t in batch]

    return decode


def torchvision_device(datas, device) -> Callable[[list], list]:
    """nvJPEG through torchvision, a batch at a time."""
    import torchvision.io as io

    def decode(batch: list) -> list:
        return io.decode_jpeg(batch, mode=io.ImageReadMode.RGB, device=device)

    return decode


def nvimgcodec_decoder(kind: str, options: str = "") -> Callable:
    """nvImageCodec restricted to one backend kind; its images become CHW tensors on the device (no copy)."""

    def make(datas, device) -> Callable[[list], list]:
        import nvidia
        import torch

        for entry in sys.path:  # a wheel installed with --target beside torch's own nvidia/ packages
            folder = Path(entry) / "nvidia"
            if (folder / "nvimgcodec").is_dir() and str(folder) not in list(nvidia.__path__):
                nvidia.__path__.append(str(folder))
        from nvidia import nvimgcodec

        backend = nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))
        decoder = nvimgcodec.Decoder(device_id=device.index or 0, backends=[backend], options=options)
        params = nvimgcodec.DecodeParams(
            apply_exif_orientation=True,
            color_spec=nvimgcodec.ColorSpec.SRGB,
            sample_format=nvimgcodec.SampleFormat.I_RGB,
        )

        def decode(batch: list) -> list:
            images = decoder.decode(batch, params=params)
            if any(image is None for image in images):
                raise RuntimeError(f"{sum(image is None for image in images)} of {len(images)} images not decoded")
            return [torch.as_tensor(image, device=device).permute(2, 0, 1) for image in images]

        return decode

    return make


DECODERS: dict[str, tuple[str, Callable]] = {
    "cpu": ("tensors", torchvision_cpu),
    "torchvision": ("tensors", torchvision_device),
    "nvimgcodec-hw": ("bytes", nvimgcodec_decoder("HW_GPU_ONLY")),
    "nvimgcodec-gpu": ("bytes", nvimgcodec_decoder("GPU_ONLY")),
    "nvimgcodec-gpu-fancy": ("bytes", nvimgcodec_decoder("GPU_ONLY", ":fancy_upsampling=1")),
    "nvimgcodec-hybrid": ("bytes", nvimgcodec_decoder("HYBRID_CPU_GPU")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--decoders", default=",".join(DECODERS))
    parser.add_argument("--compare", type=int, default=64, help="images whose pixels are compared with cpu's")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_images(Path(tmp), args.images)
        raw = [path.read_bytes() for path in paths]
    tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in raw]
    reference = DECODERS["cpu"][1](raw, torch.device("cpu"))(tensors[: args.compare])
    print(f"{args.images} JPEGs of 500x375, batch {args.batch_size}, device {device}")
    print("| decoder | img/s | largest difference | mean | values differing |\n|---|---|---|---|---|")
    for name in args.decoders.split(","):
        takes, make = DECODERS[name]
        inputs = raw if takes == "bytes" else tensors
        try:
            decode = make(raw, device)
            decode(inputs[: args.batch_size])  # warm-up: handles, buffers, the first kernels
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for batch in _batches(inputs, args.batch_size):
                decode(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            rate = len(inputs) / (time.perf_counter() - start)
            got = [image.cpu() for image in decode(inputs[: args.compare])]
        except Exception as error:  # a decoder missing or refusing: say so, measure the others
            print(f"| {name} | {type(error).__name__}: {str(error).splitlines()[0][:120]} | | | |")
            continue
        if any(a.shape != b.shape for a, b in zip(got, reference)):
            print(f"| {name} | {rate:,.0f} | shapes {tuple(got[0].shape)}, cpu's {tuple(reference[0].shape)} | | |")
            continue
        difference = torch.cat([(a.int() - b.int()).abs().flatten() for a, b in zip(got, reference)])
        print(
            f"| {name} | {rate:,.0f} | {int(difference.max())} | {difference.float().mean():.3f} "
            f"| {float((difference > 0).float().mean()):.1%} |"
        )


if __name__ == "__main__":
    main()
