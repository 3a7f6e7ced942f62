"""Images decoded and preprocessed on the run's device, a batch at a time (``--decode device``).

With ``--decode cpu`` (the default) the decode workers turn each file into
the model's input whole: Pillow decodes, the weights' preprocessing resizes,
crops and normalises (:mod:`hookcli.inputs.preprocess`). With ``--decode device``
they only read each file and check its header (:func:`hookcli.inputs.images.read_encoded`);
:class:`DeviceDecoder` then decodes a batch's JPEGs in one call of
the best decoder installed (:func:`device_jpeg_decoder`): NVIDIA's nvImageCodec
where it is installed (``pip install "hookcli[gpu-decode-cu13]"``, or ``-cu12``),
which decodes on the GPU's hardware JPEG engine where it has one (A100, H100,
H200) with libjpeg's pixels to a level, else torchvision's ``decode_jpeg`` (nvJPEG);
it turns each upright as its EXIF orientation says, and runs the same
preprocessing there, images of one size together. That is what keeps a large
GPU fed when the CPU's cores cannot decode as fast as it computes.

- Images that are not 8-bit RGB or grayscale JPEGs (PNG, WebP, CMYK JPEGs…),
  and JPEGs that do not end as a whole one does, are decoded and preprocessed
  by the workers exactly as ``--decode cpu`` does, and join the batch on the
  device.
- A JPEG the device's decoder refuses is decoded on the CPU instead; the first
  one is said. One the CPU cannot decode either is an unreadable image, as
  with ``--decode cpu`` (``--on-error``).
- Images resize to the values Pillow gives ``--decode cpu``
  (:mod:`hookcli.inputs.resampling`), so the pixels differ only where the
  decoder's do: nvImageCodec's hardware engine by a level at most, torchvision's
  nvJPEG, which upsamples chroma without libjpeg's smoothing, by up to 32
  (``docs/benchmarks.md``). ``preprocess.decode`` in the metadata records the
  choice, and ``preprocess.decoder`` the decoder.

On the CPU the same steps run in the main process with torchvision's libjpeg
decoder, whose pixels are Pillow's: slower than the workers, and the same
values as ``--decode cpu``.

>>> import torch
>>> from hookcli.inputs.preprocess import Preprocess
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> preprocess = Preprocess(resize=64, crop=56, decode="device")
>>> images = EncodedImages([photo, photo], preprocess)
>>> indices, encoded, failures, pictures = collate([images[0], images[1]])
>>> indices, batch, failures, damaged = DeviceDecoder(preprocess, torch.device("cpu"))(indices, encoded, failures)
>>> indices, tuple(batch.shape), failures, damaged
([0, 1], (2, 3, 56, 56), [], [])
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import itertools
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torchvision.io
from PIL import Image
from torchvision.io import ImageReadMode
from torchvision.transforms.functional import pil_to_tensor

from hookcli.console import stderr_captured
from hookcli.errors import DeviceError, ImageError, MemoryLimitError, first_line, out_of_memory
from hookcli.inputs.images import JpegBytes, PictureMaker, load_rgb, read_encoded
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_tensor_steps, to_transform

__all__ = [
    "PIXELS_AT_ONCE",
    "DeviceDecoder",
    "Encoded",
    "EncodedImages",
    "NoSharedMemory",
    "collate",
    "device_jpeg_decoder",
    "jpeg_codec",
    "shared",
    "upright",
]


#: Pixels decoded and resized at once, at most (one image more where one alone is larger): 64 megapixels are 192 MiB
#: as uint8 and 768 MiB as the floats resizing works in, whether they are 256 ImageNet photos or five from a camera.
PIXELS_AT_ONCE = 1 << 26


class EncodedImages:
    """A dataset of images as the decode workers leave them for the device: a JPEG's bytes
    (:class:`~hookcli.inputs.images.JpegBytes`), any other image decoded and preprocessed as ``--decode cpu`` does it,
    each file opened once; items are ``(index, image, failure, picture)``, a failure as a value ``(message, hint)``,
    never raised in a worker, and ``picture`` what ``picture`` makes of the image (None without one)."""

    def __init__(self, paths: Sequence, preprocess: Preprocess, picture: PictureMaker | None = None) -> None:
        self.paths, self.transform, self.picture = paths, to_transform(preprocess), picture

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        try:
            found, made = read_encoded(path, self.picture)
            return index, found if isinstance(found, JpegBytes) else self.transform(found), None, made
        except ImageError as err:
            return index, None, (err.message, err.hint), None


class Encoded(NamedTuple):
    """A batch as the workers hand it over: ``jpegs`` as ``(position, JpegBytes)``, and the other images, already
    preprocessed, at ``positions``: ``prepared`` is them stacked when they share a shape (a list otherwise, None
    when there are none), so a batch of PNGs crosses from a worker as one tensor.

    The JPEGs' bytes cross as one tensor too, ``data``, each JPEG's at its ``spans`` entry (``(start, end)``), and
    the ``JpegBytes`` empty: a tensor passes through shared memory, where bytes would be pickled through the one pipe
    every worker shares, which then limits a large GPU (:meth:`unpacked` gives them back, views of ``data``)."""

    jpegs: list
    prepared: torch.Tensor | list | None
    positions: list
    data: torch.Tensor | None = None
    spans: list | None = None

    def packed(self) -> Encoded:
        """The JPEGs' bytes in one tensor (see the class's description). In a decode worker the tensor is moved to
        shared memory here: where that is too small for it (a container's 64 MiB ``/dev/shm`` and camera photos),
        the bytes stay as they are and go through the pipe, where torch's queue would have failed to send the
        tensor and left the run waiting for it."""
        if not self.jpegs or self.data is not None:
            return self
        joined = bytearray().join(jpeg.data for _, jpeg in self.jpegs)
        data = torch.frombuffer(joined, dtype=torch.uint8)
        if torch.utils.data.get_worker_info() is not None:
            try:
                data.share_memory_()
            except RuntimeError:  # unable to allocate shared memory: no space left on the device
                return self
        ends = list(itertools.accumulate(len(jpeg.data) for _, jpeg in self.jpegs))
        return self._replace(
            jpegs=[(k, dataclasses.replace(jpeg, data=b"")) for k, jpeg in self.jpegs],
            data=data,
            spans=list(zip([0, *ends[:-1]], ends)),
        )

    def unpacked(self) -> list:
        """``jpegs``, each with its bytes (a view of ``data`` where they crossed in it)."""
        if self.data is None or self.spans is None:
            return self.jpegs
        view = self.data.numpy().data  # a memoryview: slices of it copy nothing
        return [(k, dataclasses.replace(jpeg, data=view[a:b])) for (k, jpeg), (a, b) in zip(self.jpegs, self.spans)]


class NoSharedMemory(NamedTuple):
    """What a decode worker hands over instead of a batch that shared memory had no room for (``reason``: torch's
    words)."""

    reason: str


def shared(batch):
    """``batch`` moved to shared memory here, in a decode worker, as torch's queue would move it: where there is no
    room, the queue fails in a thread of its own and the run waits forever for the batch; here it becomes a
    :class:`NoSharedMemory` that the run refuses in one line."""
    if batch is None or torch.utils.data.get_worker_info() is None:
        return batch
    parts = batch if isinstance(batch, tuple) else (batch,)
    try:
        for part in parts:
            for tensor in part if isinstance(part, list) else [part]:
                tensor.share_memory_()
    except RuntimeError as err:  # unable to allocate shared memory: no space left on the device
        return NoSharedMemory(first_line(err)[:200])
    return batch


def collate(items) -> tuple[list[int], Encoded | NoSharedMemory, list, dict]:
    """``(indices, Encoded, failures, pictures)`` of a batch of :class:`EncodedImages` items, ``pictures`` by input
    index; the JPEGs' bytes packed in one tensor (:meth:`Encoded.packed`)."""
    good = [(i, item) for i, item, error, _ in items if error is None]
    jpegs = [(k, item) for k, (_, item) in enumerate(good) if isinstance(item, JpegBytes)]
    positions = [k for k, (_, item) in enumerate(good) if not isinstance(item, JpegBytes)]
    rows = [good[k][1] for k in positions]
    prepared: torch.Tensor | list = rows
    if rows and all(row.shape == rows[0].shape for row in rows):
        prepared = torch.stack(rows)
    encoded = Encoded(jpegs, prepared if positions else None, positions).packed()
    refused = shared(encoded.prepared) if encoded.prepared is not None else None  # the other images' rows
    return (
        [i for i, _ in good],
        refused if isinstance(refused, NoSharedMemory) else encoded,
        [(i, e) for i, _, e, _ in items if e is not None],
        {i: made for i, _, _, made in items if made is not None},
    )


class DeviceDecoder:
    """Turns a batch from the workers (:func:`collate`) into the model's input on ``device``.

    The result is ``(indices, images, failures, damaged)``: images stacked when they share a shape, else a list of rows
    (segmentation without a crop), None when none could be read; ``damaged`` lists ``(index, the decoder's message)``
    for each JPEG decoded though damaged (libjpeg's ``Corrupt JPEG data: …``, kept off standard error). Images are
    decoded and resized :data:`PIXELS_AT_ONCE` pixels at a time, so camera photos need no more device memory than small
    ones. On CUDA the work runs on its own stream, which the model's waits for: nvJPEG writes without waiting for the
    stream it was allocated on, so it must never get memory that the model's queued kernels still read.
    ``on_note(text)`` hears, once, that the device's decoder refused a JPEG that Pillow then decoded.
    """

    def __init__(self, preprocess: Preprocess, device, on_note: Callable[[str], None] | None = None) -> None:
        self.steps, self.device, self.on_note = to_tensor_steps(preprocess), device, on_note
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.codec = jpeg_codec(device)  # nvImageCodec's, where installed; else torchvision's decode_jpeg
        self._held: list = []  # nvImageCodec's images of the last chunk: its memory, freed once the stream is done
        self._codec_failed = False  # whether a batch call of nvImageCodec failed (said once)
        self._noted = False
        self._device_decoded = False  # whether the device's decoder has decoded any JPEG yet
        self._pillow_only = 0  # JPEGs the device's decoder refused and Pillow decoded, while it decoded none

    def __call__(
        self, indices: list[int], encoded: Encoded, failures: list
    ) -> tuple[list[int], object, list, list[tuple[int, str]]]:
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            rows, failed, damaged = self._rows(encoded)
            kept = [k for k, row in enumerate(rows) if row is not None]
            rows = [rows[k] for k in kept]
            batch = (torch.stack(rows) if all(row.shape == rows[0].shape for row in rows) else rows) if rows else None
        if self.stream is not None and batch is not None:
            model_stream = torch.cuda.current_stream(self.device)
            model_stream.wait_stream(self.stream)
            for tensor in [batch] if isinstance(batch, torch.Tensor) else batch:
                tensor.record_stream(model_stream)  # freed only once the model's stream is done with it
        failures = sorted([*failures, *((indices[k], error) for k, error in failed)])
        return [indices[k] for k in kept], batch, failures, [(indices[k], said) for k, said in damaged]

    def _rows(self, encoded: Encoded) -> tuple[list, list, list]:
        """Each image's row on the device (None for one that failed), the failures ``(position, (message,
        hint))``, and ``(position, what the decoder said)`` for each JPEG it decoded though it found it damaged."""
        count = len(encoded.jpegs) + len(encoded.positions)
        rows: list = [None] * count
        if encoded.prepared is not None:
            for position, row in zip(encoded.positions, encoded.prepared):
                rows[position] = row.to(self.device, non_blocking=True)
        failed: list = []
        damaged: list[tuple[int, str]] = []
        for chunk in _bounded(encoded.unpacked(), PIXELS_AT_ONCE):
            cropped = []
            images, said = self._decoded([jpeg for _, jpeg in chunk])
            damaged.extend((chunk[k][0], text) for k, text in said.items())
            for (position, _), image in zip(chunk, images):
                if isinstance(image, ImageError):
                    failed.append((position, (image.message, image.hint)))
                else:
                    cropped.append((position, image))
            for position, row in zip([p for p, _ in cropped], self._preprocessed([image for _, image in cropped])):
                rows[position] = row
        return rows, failed, sorted(damaged)

    def _preprocessed(self, images: list) -> list:
        """Rows of uint8 images: resized and cropped together, sizes and all, then scaled and normalised at once."""
        cropped = self.steps.geometry_each(images)
        if cropped and all(row.shape == cropped[0].shape for row in cropped):
            return list(self.steps.scaled(torch.stack(cropped)))
        return [self.steps.scaled(row) for row in cropped]

    def _decoded(self, jpegs: list) -> tuple[list, dict[int, str]]:
        """Each JPEG decoded upright on the device, or by Pillow where the device's decoder refuses it (an
        :class:`ImageError` for one neither can decode); and, by position, what the device's decoder said of those
        it decoded though they are damaged (libjpeg prints it to standard error: it is kept, to be said naming the
        file, or not at all)."""
        if not jpegs:
            return [], {}
        if self.stream is not None:
            self.stream.synchronize()  # what this stream freed is free: nvJPEG will not wait for it
        self._held = []
        found = self._by_codec(jpegs) if self.codec is not None else None
        if found is not None:
            return found, {}
        data = [_as_tensor(jpeg.data) for jpeg in jpegs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision points to TorchCodec; it still decodes
            try:
                with stderr_captured() as said:
                    images = torchvision.io.decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
                self._device_decoded = True
                return [upright(image, jpeg.orientation) for image, jpeg in zip(images, jpegs)], self._damaged(
                    data, said.text
                )
            except RuntimeError as err:  # the call decodes all or nothing: find the ones at fault
                _refuse_out_of_memory(err)
            found, damaged = [], {}
            refusals: list[tuple[Any, RuntimeError]] = []
            for k, (jpeg, encoded) in enumerate(zip(jpegs, data)):
                try:
                    with stderr_captured() as said:
                        image = torchvision.io.decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
                    found.append(upright(image, jpeg.orientation))
                    self._device_decoded = True
                    if _first_warning(said.text):
                        damaged[k] = _first_warning(said.text)
                except RuntimeError as err:
                    _refuse_out_of_memory(err)
                    found.append(self._by_pillow(jpeg, err, refusals))
        if refusals:
            self._refused(refusals, decoded=sum(not isinstance(image, ImageError) for image in found))
        return found, damaged

    def _by_codec(self, jpegs: list) -> list | None:
        """Each JPEG decoded upright by nvImageCodec, in one call, or by Pillow where nvImageCodec cannot; None where
        the call fails whole (torchvision's decoder then takes the batch), out of memory refused."""
        assert self.codec is not None, "called only where nvImageCodec decodes"
        try:
            with stderr_captured():  # what it logs of an image it cannot decode: Pillow's verdict is the one said
                images = self.codec.decoder.decode(
                    [bytes(jpeg.data) for jpeg in jpegs],
                    params=self.codec.params,
                    cuda_stream=self.stream.cuda_stream if self.stream is not None else 0,
                )
        except RuntimeError as err:
            _refuse_out_of_memory(err)
            if self.on_note is not None and not self._codec_failed:
                self.on_note(
                    f"--decode device: nvImageCodec failed on a batch ({first_line(err)[:160]}); torchvision's decoder "
                    "decoded it, as it will any other such batch"
                )
            self._codec_failed = True
            return None
        self._held = list(images)  # views of these below: kept until the stream has used them
        found: list = []
        refusals: list[tuple[Any, RuntimeError]] = []
        for jpeg, image in zip(jpegs, images):
            if image is None:
                found.append(self._by_pillow(jpeg, RuntimeError("it could not decode it"), refusals))
            else:
                found.append(upright(torch.as_tensor(image, device=self.device).permute(2, 0, 1), jpeg.orientation))
                self._device_decoded = True
        if refusals:
            self._refused(refusals, decoded=sum(not isinstance(image, ImageError) for image in found))
        return found

    def _damaged(self, data: list, said: str) -> dict[int, str]:
        """What the decoder ``said`` while it decoded ``data`` at once, by the position of the JPEG it is about: the
        one JPEG, or each one that makes it say something when decoded again alone (only where something was said,
        which a whole JPEG never makes it)."""
        if not _first_warning(said) or len(data) == 1:
            return {0: _first_warning(said)} if _first_warning(said) else {}
        damaged = {}
        for k, encoded in enumerate(data):
            with stderr_captured() as again, contextlib.suppress(RuntimeError):
                torchvision.io.decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            if _first_warning(again.text):
                damaged[k] = _first_warning(again.text)
        return damaged

    def _by_pillow(self, jpeg, refused: RuntimeError, refusals: list):
        """``jpeg`` decoded by Pillow, where the device's decoder ``refused`` it (added to ``refusals``), or the
        :class:`ImageError` of one Pillow cannot decode either (an unreadable image, not a refusal)."""
        try:
            image = pil_to_tensor(load_rgb(jpeg.path, data=jpeg.data)).to(self.device, non_blocking=True)
        except ImageError as err:
            return err
        refusals.append((jpeg, refused))
        return image

    def _refused(self, refusals: list, decoded: int) -> None:
        """Say the first refusal of a JPEG Pillow could decode; stop where the device's decoder refuses every JPEG
        Pillow reads, as a build without it does, rather than decode a whole run in this one thread."""
        jpeg, err = refusals[0]
        reason = _SOURCE_PLACE.sub("", first_line(err))[:160]
        name = "nvImageCodec" if self.codec is not None else f"torchvision's {self.device.type.upper()} decoder"
        self._pillow_only = 0 if self._device_decoded else self._pillow_only + decoded
        if self._pillow_only >= REFUSED_BEFORE_STOPPING:
            raise DeviceError(
                f"--decode device: {name} decodes none of these JPEGs ({reason})",
                hint="use --decode cpu"
                if self.codec is not None
                else "this torchvision may lack nvJPEG; use --decode cpu",
            )
        if decoded and not self._noted and self.on_note is not None:
            self.on_note(
                f"--decode device: {name} refused '{jpeg.path}' ({reason}); Pillow decoded it, as it will "
                "any other such image"
            )
            self._noted = True


class Codec(NamedTuple):
    """nvImageCodec's decoder on one GPU and what it is asked for: RGB, as libjpeg gives it, not yet turned upright."""

    decoder: Any
    params: Any


#: What ``preprocess.decoder`` in the metadata names: nvImageCodec, torchvision's nvJPEG, or libjpeg on the CPU.
NVIMGCODEC, NVJPEG, LIBJPEG = "nvimgcodec", "nvjpeg", "libjpeg"


def device_jpeg_decoder(device) -> str:
    """The decoder of ``--decode device`` on ``device``: nvImageCodec where it is installed and starts on that GPU
    (:func:`jpeg_codec`), else torchvision's nvJPEG; libjpeg on the CPU.

    >>> device_jpeg_decoder(torch.device("cpu"))
    'libjpeg'
    """
    if torch.device(device).type != "cuda":
        return LIBJPEG
    return NVIMGCODEC if jpeg_codec(device) is not None else NVJPEG


def jpeg_codec(device) -> Codec | None:
    """nvImageCodec's decoder on CUDA ``device`` (one a process, kept), or None: not CUDA, not installed, or it does
    not decode a JPEG there. Its backends in its own order: the GPU's hardware JPEG engine first where it has one,
    then CUDA, then the CPU, image by image."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return _codec_on(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _codec_on(index: int) -> Codec | None:
    codec = _nvimgcodec()
    if codec is None:
        return None
    params = codec.DecodeParams(
        apply_exif_orientation=False,  # turned upright here, as the other decoders' images are
        color_spec=codec.ColorSpec.SRGB,
        sample_format=codec.SampleFormat.I_RGB,
    )
    probe = _probe_jpeg()
    for backends in (None, [codec.Backend(codec.BackendKind.HW_GPU_ONLY)]):  # its choice; else the engine alone
        try:
            with stderr_captured():  # a backend this GPU lacks is logged, not said
                decoder = codec.Decoder(device_id=index, **({} if backends is None else {"backends": backends}))
                found = decoder.decode([probe], params=params)
            if found and found[0] is not None and tuple(found[0].shape) == (16, 16, 3):
                return Codec(decoder, params)
        except Exception:  # noqa: BLE001, S112  # whatever it raises, torchvision's decoder stays
            continue
    return None


def _nvimgcodec():
    """nvImageCodec's module, or None. Found also where its wheel went beside torch's own ``nvidia`` packages (pip
    install ``--target``), which a regular ``nvidia`` package would hide."""
    try:
        return importlib.import_module("nvidia.nvimgcodec")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001  # a build that cannot load here (no driver) is one not installed
        return None
    try:
        nvidia = importlib.import_module("nvidia")
        for entry in sys.path:
            folder = Path(entry or ".") / "nvidia"
            if (folder / "nvimgcodec").is_dir() and str(folder) not in list(nvidia.__path__):
                nvidia.__path__.append(str(folder))
        return importlib.import_module("nvidia.nvimgcodec")
    except Exception:  # noqa: BLE001
        return None


def _probe_jpeg() -> bytes:
    """A JPEG of 16 x 16 pixels, as a photo is stored (YCbCr, chroma halved): what tells a decoder that starts
    from one that decodes."""
    made = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 120, 40)).save(made, "JPEG", quality=90)
    return made.getvalue()


#: Where in its C++ sources torchvision says an error arose (``decode_jpeg, /__w/vision/…/decode_jpeg.cpp:171, Image
#: is incomplete``): nothing a user can act on.
_SOURCE_PLACE = re.compile(r"[^,\s]*,?\s*/\S+\.(?:cpp|cu|h):\d+,?\s*")


#: JPEGs the device's decoder refuses, and Pillow reads, before it has decoded any, that make it taken for one that
#: decodes nothing: one damaged photo in the first batch must not stop a run.
REFUSED_BEFORE_STOPPING = 8


def _as_tensor(data: bytes | memoryview) -> torch.Tensor:
    """A JPEG's bytes as the 1-D uint8 tensor torchvision decodes: a view of a batch's tensor where they are one
    (writable), else a copy."""
    if isinstance(data, memoryview) and not data.readonly:
        return torch.frombuffer(data, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _first_warning(said: str) -> str:
    """The first line a decoder printed, and how many more there were: ``Corrupt JPEG data: 3 extraneous bytes
    before marker 0xda (and 1 more)``; empty text where it printed nothing."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")


def _refuse_out_of_memory(err: RuntimeError) -> None:
    if out_of_memory(err):
        raise MemoryLimitError(
            f"--decode device: the device ran out of memory decoding a batch ({first_line(err)})",
            hint="give a smaller --batch-size, or --decode cpu",
        ) from None


def _bounded(pairs: list, budget: int):
    """``(position, JpegBytes)`` pairs in runs of consecutive ones whose pixels add up to ``budget`` at most (a run
    holds one pair at least)."""
    run: list = []
    pixels = 0
    for pair in pairs:
        count = pair[1].size[0] * pair[1].size[1]
        if run and pixels + count > budget:
            yield run
            run, pixels = [], 0
        run.append(pair)
        pixels += count
    if run:
        yield run


#: What each EXIF orientation asks of a ``[C, H, W]`` image to turn it upright, as Pillow's ``exif_transpose``:
#: flips of the width (-1) and height (-2) axes, after a transpose where ``True``.
_TURNS = {
    2: (False, (-1,)),
    3: (False, (-2, -1)),
    4: (False, (-2,)),
    5: (True, ()),
    6: (True, (-1,)),
    7: (True, (-2, -1)),
    8: (True, (-2,)),
}


def upright(image, orientation: int):
    """``image`` (``[C, H, W]``) turned upright as EXIF ``orientation`` (1 to 8) asks.

    >>> import torch
    >>> image = torch.arange(6).reshape(1, 2, 3)
    >>> upright(image, 6).tolist()  # shot with the camera turned right: turn it back, clockwise
    [[[3, 0], [4, 1], [5, 2]]]
    """
    if orientation not in _TURNS:
        return image
    transpose, axes = _TURNS[orientation]
    if transpose:
        image = image.transpose(-2, -1)
    return image.flip(axes) if axes else image
