"""Images decoded and preprocessed on the run's device, a batch at a time (``--decode device``).

With ``--decode cpu`` (the default) the decode workers turn each file into
the model's input whole: Pillow decodes, the weights' preprocessing resizes,
crops and normalises (:mod:`hookcli.preprocess`). With ``--decode device``
they only read each file and check its header (:func:`hookcli.images.read_jpeg`);
:class:`DeviceDecoder` then decodes a batch's JPEGs in one call of
torchvision's ``decode_jpeg`` on the device (nvJPEG on CUDA), turns each
upright as its EXIF orientation says, and runs the same preprocessing there,
images of one size together. That is what keeps a large GPU fed when the
CPU's cores cannot decode as fast as it computes.

- Images that are not 8-bit RGB or grayscale JPEGs (PNG, WebP, CMYK JPEGs…)
  are decoded by the workers as usual and preprocessed on the device with the
  rest.
- A JPEG the device's decoder refuses is decoded on the CPU instead; the first
  one is said. One the CPU cannot decode either is an unreadable image, as
  with ``--decode cpu`` (``--on-error``).
- The pixels differ slightly from ``--decode cpu``: tensor resizing rounds a
  little differently from Pillow's, and nvJPEG's inverse DCT and chroma
  upsampling from libjpeg's. The README gives the measured differences;
  ``preprocess.decode`` in the metadata records the choice.

On the CPU the same steps run in the main process (torchvision's libjpeg
decoder): slower than the workers, but the way to see what the tensor path
changes without a GPU.

>>> import torch
>>> from hookcli.preprocess import Preprocess
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> images = EncodedImages([photo, photo])
>>> indices, items, failures = collate([images[0], images[1]])
>>> decode = DeviceDecoder(Preprocess(resize=64, crop=56, decode="device"), torch.device("cpu"))
>>> indices, batch, failures = decode(indices, items, failures)
>>> indices, tuple(batch.shape), failures
([0, 1], (2, 3, 56, 56), [])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from hookcli.errors import ImageError
from hookcli.preprocess import Preprocess

__all__ = ["PIXELS_AT_ONCE", "DeviceDecoder", "EncodedImages", "collate", "upright"]


class EncodedImages:
    """A dataset of images as the decode workers leave them for the device: a JPEG's bytes
    (:class:`~hookcli.images.JpegBytes`), any other image decoded to ``[3, H, W]`` uint8; a failure comes back as a
    value ``(message, hint)``, never raised in a worker."""

    def __init__(self, paths: Sequence) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from hookcli.images import load_rgb, read_jpeg

        path = self.paths[index]
        try:
            found = read_jpeg(path)
            if found is None:
                from torchvision.transforms.functional import pil_to_tensor

                found = pil_to_tensor(load_rgb(path))
            return index, found, None
        except ImageError as err:
            return index, None, (err.message, err.hint)


def collate(items) -> tuple[list[int], list, list]:
    """``(indices, items, failures)`` of a batch of :class:`EncodedImages` items; the items are left unstacked."""
    good = [(i, item) for i, item, error in items if error is None]
    return [i for i, _ in good], [item for _, item in good], [(i, e) for i, _, e in items if e is not None]


class DeviceDecoder:
    """Turns a batch of :class:`EncodedImages` items into the model's input on ``device``: ``(indices, images,
    failures)``, the images stacked when they share a shape (a list of rows otherwise, as segmentation without a
    crop gives), None when none could be read.

    Images are decoded and resized :data:`PIXELS_AT_ONCE` pixels at a time, so a batch of camera photos needs no
    more device memory than a batch of small ones. ``on_note(text)`` hears, once, that the device's decoder refused
    a JPEG the CPU then decoded.
    """

    def __init__(self, preprocess: Preprocess, device, on_note: Callable[[str], None] | None = None) -> None:
        self.transform, self.device, self.on_note = preprocess.to_transform(), device, on_note
        self._noted = False

    def __call__(self, indices: list[int], items: list, failures: list) -> tuple[list[int], object, list]:
        import torch

        failures, kept, rows = list(failures), [], []
        for chunk in _bounded(list(zip(indices, items)), PIXELS_AT_ONCE):
            good = []
            for (index, _), image in zip(chunk, self._pixels([item for _, item in chunk])):
                if isinstance(image, ImageError):
                    failures.append((index, (image.message, image.hint)))
                else:
                    good.append((index, image))
            if good:
                kept.extend(index for index, _ in good)
                rows.extend(self._preprocessed([image for _, image in good]))
        if not kept:
            return [], None, sorted(failures)
        batch = torch.stack(rows) if all(row.shape == rows[0].shape for row in rows) else rows
        return kept, batch, sorted(failures)

    def _pixels(self, items: list) -> list:
        """Each item as a uint8 ``[3, H, W]`` image on the device (JPEGs decoded there), or an ImageError."""
        from hookcli.images import JpegBytes

        jpegs = [k for k, item in enumerate(items) if isinstance(item, JpegBytes)]
        pixels = [None if isinstance(item, JpegBytes) else item.to(self.device, non_blocking=True) for item in items]
        for k, decoded in zip(jpegs, self._decoded([items[k] for k in jpegs])):
            pixels[k] = decoded if isinstance(decoded, ImageError) else decoded.to(self.device, non_blocking=True)
        return pixels

    def _preprocessed(self, images: list) -> list:
        """The preprocessing of each image, run once for each size the images come in."""
        import torch

        by_size: dict[tuple, list[int]] = {}
        for k, image in enumerate(images):
            by_size.setdefault(tuple(image.shape), []).append(k)
        rows: list = [None] * len(images)
        for members in by_size.values():
            for k, row in zip(members, self.transform(torch.stack([images[k] for k in members]))):
                rows[k] = row
        return rows

    def _decoded(self, jpegs: list) -> list:
        """Each JPEG decoded upright on the device, or on the CPU where the device's decoder refuses it; an
        :class:`ImageError` for one neither can decode."""
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        if not jpegs:
            return []
        data = [torch.frombuffer(bytearray(jpeg.data), dtype=torch.uint8) for jpeg in jpegs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision points to TorchCodec; it still decodes
            try:
                images = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
                return [upright(image, jpeg.orientation) for image, jpeg in zip(images, jpegs)]
            except RuntimeError:  # the call decodes all or nothing: find the ones at fault
                pass
            found = []
            for jpeg, encoded in zip(jpegs, data):
                try:
                    found.append(upright(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device),
                                         jpeg.orientation))
                except RuntimeError as err:
                    found.append(self._on_cpu(jpeg, err))
            return found

    def _on_cpu(self, jpeg, refusal: Exception):
        from torchvision.transforms.functional import pil_to_tensor

        from hookcli.errors import first_line
        from hookcli.images import load_rgb

        try:
            image = pil_to_tensor(load_rgb(jpeg.path, data=jpeg.data))
        except ImageError as err:
            return err
        if not self._noted and self.on_note is not None:
            self.on_note(f"--decode device: torchvision's {self.device.type.upper()} decoder refused '{jpeg.path}' "
                         f"({first_line(refusal)[:160]}); Pillow decoded it, as it will any other such image")
            self._noted = True
        return image


#: Pixels decoded and resized at once, at most (one image more where one alone is larger): 64 megapixels are 192 MiB
#: as uint8 and 768 MiB as the floats resizing works in, whether they are 256 ImageNet photos or five from a camera.
PIXELS_AT_ONCE = 1 << 26


def _bounded(pairs: list, budget: int):
    """``(index, item)`` pairs in runs of consecutive ones whose pixels add up to ``budget`` at most (a run holds
    one pair at least)."""
    from hookcli.images import JpegBytes

    run, pixels = [], 0
    for pair in pairs:
        item = pair[1]
        count = item.size[0] * item.size[1] if isinstance(item, JpegBytes) else item.shape[-2] * item.shape[-1]
        if run and pixels + count > budget:
            yield run
            run, pixels = [], 0
        run.append(pair)
        pixels += count
    if run:
        yield run


#: What each EXIF orientation asks of a ``[C, H, W]`` image to turn it upright, as Pillow's ``exif_transpose``:
#: flips of the width (-1) and height (-2) axes, after a transpose where ``True``.
_TURNS = {2: (False, (-1,)), 3: (False, (-2, -1)), 4: (False, (-2,)), 5: (True, ()), 6: (True, (-1,)),
          7: (True, (-2, -1)), 8: (True, (-2,))}


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
