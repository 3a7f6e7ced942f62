"""--decode device: images read by the workers, decoded and preprocessed batched on the device (the CPU here)."""

import json
import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.events import Damaged
from hookcli.inputs import images as images_module
from hookcli.inputs.decoding import DeviceDecoder, EncodedImages, NoSharedMemory, collate, upright
from hookcli.inputs.images import load_rgb, read_encoded
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_transform
from hookcli.models.loading import load_model
from hookcli.pictures.photos import ModelPhotos, model_photo_scaled
from hookcli.run.pipeline import iter_batches
from hookcli.run.settings import RunSettings

CPU = torch.device("cpu")
PLAIN = {"mean": None, "std": None}  # values in [0, 1], so a level of difference is 1/255


def _decoded(paths, preprocess, on_note=None):
    images = EncodedImages(paths, preprocess)
    indices, encoded, failures, _ = collate([images[i] for i in range(len(paths))])
    indices, batch, failures, damaged = DeviceDecoder(preprocess, CPU, on_note)(indices, encoded, failures)
    assert damaged == []  # the decoder says nothing of a whole JPEG
    return indices, batch, failures


def _default_decoder() -> str:
    """The decoder of --decode device on the default device: torchvision's libjpeg here; on a GPU, nvImageCodec's
    where it is installed, else nvJPEG."""
    from hookcli.inputs.decoding import device_jpeg_decoder

    return device_jpeg_decoder(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _refusing(monkeypatch, path, message: str) -> None:
    """torchvision's decode_jpeg, refusing (``message``) any batch that holds the JPEG at ``path``."""
    import torchvision.io

    original, refused = torchvision.io.decode_jpeg, len(path.read_bytes())

    def fussy(data, **options):
        if any(len(item) == refused for item in (data if isinstance(data, list) else [data])):
            raise RuntimeError(message)
        return original(data, **options)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", fussy)


def _on_cpu(paths, preprocess):
    transform = to_transform(preprocess)
    return [transform(load_rgb(path)) for path in paths]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_comes_out_as_pillow_turns_it(tmp_path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"turned-{orientation}.jpg"
    pixels = np.random.default_rng(orientation).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, exif=exif, quality=95)
    found, _ = read_encoded(path)
    assert (found.orientation, found.data) == (orientation, path.read_bytes())
    _, batch, _ = _decoded([path], Preprocess(resize=None, crop=None, kind="detection", **PLAIN))
    expected = np.array(ImageOps.exif_transpose(Image.open(path)))
    assert batch.shape == (1, 3, *expected.shape[:2])
    assert torch.equal((batch[0] * 255).round().to(torch.uint8).permute(1, 2, 0), torch.from_numpy(expected))


class _Codec:
    """Stands in for nvImageCodec's decoder: HWC images (libjpeg's, through Pillow), None for one it cannot decode."""

    def __init__(self, refused: int) -> None:
        self.refused, self.asked = refused, []

    def decode(self, datas, params, cuda_stream):
        self.asked.append((len(datas), params, cuda_stream))
        return [
            None if len(data) == self.refused else np.array(Image.open(__import__("io").BytesIO(data)).convert("RGB"))
            for data in datas
        ]


def test_nvimagecodec_decodes_a_batch_in_one_call_turned_upright_and_pillow_takes_what_it_cannot(
    photo, tmp_path, monkeypatch
):
    from hookcli.inputs import decoding

    exif = Image.Exif()
    exif[0x0112] = 6
    turned = tmp_path / "turned.jpg"
    Image.open(photo).convert("RGB").resize((60, 40)).save(turned, exif=exif, quality=95)
    codec = _Codec(refused=len(photo.read_bytes()))
    monkeypatch.setattr(decoding, "jpeg_codec", lambda device: decoding.Codec(codec, "params"))
    notes = []
    preprocess = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    indices, rows, failures = _decoded([turned, photo, turned], preprocess, notes.append)
    assert (indices, failures, codec.asked) == ([0, 1, 2], [], [(3, "params", 0)])
    assert [tuple(row.shape) for row in rows] == [(3, 60, 40), (3, 600, 512), (3, 60, 40)]  # upright: turned right
    expected = _on_cpu([turned, photo], preprocess)
    assert torch.equal(rows[0], expected[0]) and torch.equal(rows[1], expected[1]) and torch.equal(rows[2], rows[0])
    assert notes == [
        f"--decode device: nvImageCodec refused '{photo}' (it could not decode it); Pillow decoded it, as it will any "
        "other such image"
    ]


class _FailingCodec:
    def __init__(self, message: str) -> None:
        self.message = message

    def decode(self, datas, params, cuda_stream):
        raise RuntimeError(self.message)


def test_a_batch_nvimagecodec_fails_whole_goes_to_torchvision_and_running_out_of_memory_stops(photo, monkeypatch):
    from hookcli.errors import MemoryLimitError
    from hookcli.inputs import decoding

    failing = decoding.Codec(_FailingCodec("nvImageCodec: Internal error - decode failed"), None)
    monkeypatch.setattr(decoding, "jpeg_codec", lambda device: failing)
    notes = []
    preprocess = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    indices, rows, failures = _decoded([photo, photo], preprocess, notes.append)
    assert (indices, failures) == ([0, 1], []) and torch.equal(rows[0], _on_cpu([photo], preprocess)[0])
    assert notes == [
        "--decode device: nvImageCodec failed on a batch (nvImageCodec: Internal error - decode failed); "
        "torchvision's decoder decoded it, as it will any other such batch"
    ]
    failing.decoder.message = "CUDA out of memory. Tried to allocate 2.00 GiB"
    with pytest.raises(MemoryLimitError, match="the device ran out of memory decoding a batch"):
        _decoded([photo], preprocess)


def test_the_decoder_of_decode_device_is_libjpeg_on_the_cpu_and_nvjpeg_on_a_gpu_without_nvimagecodec(monkeypatch):
    from hookcli.inputs import decoding

    assert decoding.device_jpeg_decoder(CPU) == "libjpeg" and decoding.jpeg_codec(CPU) is None
    monkeypatch.setattr(decoding, "_codec_on", lambda index: None)
    assert decoding.device_jpeg_decoder(torch.device("cuda:0")) == "nvjpeg"
    monkeypatch.setattr(decoding, "_codec_on", lambda index: decoding.Codec("decoder", "params"))
    assert decoding.device_jpeg_decoder(torch.device("cuda:0")) == "nvimgcodec"


def test_a_batch_too_large_for_shared_memory_crosses_as_bytes_rather_than_waiting_forever(
    photo, monkeypatch, tmp_path, make_image
):
    images = EncodedImages([photo, photo], Preprocess(resize=24, crop=20))
    items = [images[0], images[1]]
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # in a decode worker

    def full(self):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2>: No space left on device (28)")

    monkeypatch.setattr(torch.Tensor, "share_memory_", full)
    _, encoded, _, _ = collate(items)
    assert encoded.data is None and [bytes(jpeg.data) for _, jpeg in encoded.unpacked()] == [photo.read_bytes()] * 2
    png = EncodedImages([make_image(tmp_path / "a.png", size=(30, 20))], Preprocess(resize=24, crop=20))
    _, refused, _, _ = collate([*items, png[0]])  # a PNG's preprocessed row has no bytes to fall back on
    assert refused == NoSharedMemory("unable to allocate shared memory(shm) for file </torch_1_2>: No space left on "
                                     "device (28)")  # fmt: skip
    monkeypatch.undo()
    _, packed, _, _ = collate(items)
    assert packed.data is not None and [bytes(jpeg.data) for _, jpeg in packed.unpacked()] == [photo.read_bytes()] * 2


def test_a_jpeg_neither_decoder_reads_is_an_error_with_no_note_that_pillow_read_it(photo, tmp_path, monkeypatch):

    from hookcli.errors import ImageError

    # torchvision's own words, with the place in its sources they come from
    truncated = "decode_jpeg, /__w/vision/torchvision/csrc/io/image/cpu/decode_jpeg.cpp:171, Image is incomplete"
    _refusing(monkeypatch, photo, f"{truncated} or truncated")
    other = tmp_path / "other.jpg"
    Image.open(photo).convert("RGB").resize((40, 30)).save(other)
    notes = []
    preprocess = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    unreadable = ImageError(f"cannot decode image '{photo}': image file is truncated", hint="the file may be damaged")
    from hookcli.inputs import decoding

    def pillow(path, **_):  # Pillow cannot read the photo either
        raise unreadable

    monkeypatch.setattr(decoding, "load_rgb", pillow)
    indices, _, failures = _decoded([other, photo], preprocess, notes.append)
    assert (indices, failures, notes) == ([0], [(1, (unreadable.message, unreadable.hint))], [])
    monkeypatch.undo()
    _refusing(monkeypatch, photo, f"{truncated} or truncated")
    _decoded([other, photo], preprocess, notes.append)
    assert notes == [  # where Pillow reads it, the note says so, without the place in torchvision's sources
        f"--decode device: torchvision's CPU decoder refused '{photo}' (Image is incomplete or truncated); Pillow "
        "decoded it, as it will any other such image"
    ]


def test_upright_turns_tensors_and_leaves_unknown_orientations_alone():
    image = torch.arange(6).reshape(1, 2, 3)
    assert upright(image, 1) is image and upright(image, 9) is image
    assert upright(image, 8).tolist() == [[[2, 5], [1, 4], [0, 3]]]  # counter-clockwise
    assert upright(image, 3).tolist() == [[[5, 4, 3], [2, 1, 0]]]


def test_the_workers_leave_whole_jpegs_as_bytes_and_preprocess_other_images(photo, tmp_path, make_image):
    png = make_image(tmp_path / "a.png", size=(40, 30))
    cmyk = tmp_path / "cmyk.jpg"
    Image.open(photo).convert("CMYK").save(cmyk)
    gray = tmp_path / "gray.jpg"
    Image.open(photo).convert("L").save(gray)
    trailing = tmp_path / "trailing.jpg"
    trailing.write_bytes(photo.read_bytes() + b"a camera's own data")
    preprocess = Preprocess(resize=24, crop=20)
    paths = [photo, png, cmyk, gray, trailing]
    images = EncodedImages(paths, preprocess)
    indices, encoded, failures, pictures = collate([images[i] for i in range(len(paths))])
    assert (indices, failures, pictures) == ([0, 1, 2, 3, 4], [], {})
    assert [(k, jpeg.path, jpeg.size) for k, jpeg in encoded.jpegs] == [
        (0, str(photo), (512, 600)),
        (3, str(gray), (512, 600)),
    ]
    assert encoded.positions == [1, 2, 4]  # a file that goes on after its JPEG ends is Pillow's to read
    # The JPEGs' bytes cross from the worker in one tensor (shared memory), not pickled one by one.
    sizes = [len(photo.read_bytes()), len(gray.read_bytes())]
    assert [jpeg.data for _, jpeg in encoded.jpegs] == [b"", b""] and encoded.spans == [
        (0, sizes[0]),
        (sizes[0], sum(sizes)),
    ]
    assert encoded.data.dtype == torch.uint8 and encoded.data.shape == (sum(sizes),)
    assert [bytes(jpeg.data) for _, jpeg in encoded.unpacked()] == [photo.read_bytes(), gray.read_bytes()]
    assert torch.equal(encoded.prepared, torch.stack(_on_cpu([png, cmyk, trailing], preprocess)))
    _, batch, _ = _decoded(paths, preprocess)
    assert torch.equal(batch[[1, 2, 4]], encoded.prepared)  # exactly as --decode cpu has them
    # A grayscale JPEG is decoded to RGB by the tensor decoder exactly as Pillow does it.
    whole = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    assert torch.equal(_decoded([gray], whole)[1][0], _on_cpu([gray], whole)[0])


def test_the_workers_open_each_file_once_and_make_its_picture_from_what_they_read(
    photo, tmp_path, make_image, monkeypatch
):
    png = make_image(tmp_path / "a.png", size=(40, 30))
    cmyk = tmp_path / "cmyk.jpg"
    Image.open(photo).convert("CMYK").save(cmyk)
    trailing = tmp_path / "trailing.jpg"
    trailing.write_bytes(photo.read_bytes() + b"a camera's own data")
    paths = [photo, png, cmyk, trailing]
    opened = []
    real = images_module.open_input

    def counted(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(images_module, "open_input", counted)
    preprocess = Preprocess(resize=24, crop=20)
    plain = EncodedImages(paths, preprocess)
    items = [plain[i] for i in range(len(paths))]
    assert opened == paths
    pictured = EncodedImages(paths, preprocess, ModelPhotos(preprocess))
    opened.clear()
    with_pictures = [pictured[i] for i in range(len(paths))]
    assert opened == paths
    for (index, item, _, _), (_, same, _, made) in zip(items, with_pictures):
        assert item == same if index == 0 else torch.equal(item, same)  # the JPEG's bytes, or the image's row
        view, scale = model_photo_scaled(paths[index], preprocess)
        assert np.array_equal(made[0], view) and made[1] == scale


def test_the_first_picture_of_an_mpo_is_decoded_as_pillow_reads_it(photo, tmp_path):
    mpo = tmp_path / "camera.jpg"
    first = Image.open(photo).convert("RGB")
    first.save(mpo, format="MPO", save_all=True, append_images=[first.rotate(90)])
    assert Image.open(mpo).format == "MPO" and read_encoded(mpo)[0].path == str(mpo)
    whole = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    assert torch.equal(_decoded([mpo], whole)[1][0], _on_cpu([mpo], whole)[0])


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize(
    "sizes",
    [
        {"resize": 72, "crop": 64},  # a classifier's
        {"resize": 256, "crop": 224},  # the usual sizes: a photo of 512 x 600 shrinks down first in Pillow 13
        {"resize": 40, "crop": 56},  # a crop larger than the image pads it
        {"resize": 56, "crop": 65},  # a crop of the portrait's height and more than its width pads it across
        {"resize": (50, 90), "crop": None},  # squashed to [height, width]
        {"resize": 33, "crop": None, "kind": "segmentation"},
    ],
)
def test_device_pixels_are_the_cpu_paths_value_for_value(photo, tmp_path, make_image, interpolation, sizes):
    png = make_image(tmp_path / "a.png", size=(97, 61))
    preprocess = Preprocess(interpolation=interpolation, **sizes, **PLAIN)
    indices, batch, failures = _decoded([photo, png, photo], preprocess)
    reference = _on_cpu([photo, png, photo], preprocess)
    assert (indices, failures) == ([0, 1, 2], [])
    rows = batch if isinstance(batch, list) else list(batch)
    assert [row.shape for row in rows] == [row.shape for row in reference]
    assert all(torch.equal(row, expected) for row, expected in zip(rows, reference))


def test_images_of_several_sizes_are_preprocessed_as_one_at_a_time(photo, tmp_path, make_image):
    paths = [
        make_image(tmp_path / "a.png", size=(50, 40)),
        photo,
        make_image(tmp_path / "b.png", size=(50, 40), seed=1),
    ]
    preprocess = Preprocess(resize=24, crop=20)
    _, together, _ = _decoded(paths, preprocess)
    for k, path in enumerate(paths):
        assert torch.equal(together[k], _decoded([path], preprocess)[1][0])


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_jpegs_each_of_its_own_size_are_resized_together_to_the_cpu_paths_values(tmp_path, interpolation):
    shapes = [(61, 47), (47, 61), (90, 33), (40, 40), (52, 70), (75, 30), (33, 33), (64, 80)]  # (width, height)
    paths = []
    for k, (width, height) in enumerate(shapes):
        pixels = np.random.default_rng(k).integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{k}.jpg", quality=90)
        paths.append(tmp_path / f"{k}.jpg")
    preprocess = Preprocess(resize=36, crop=34, interpolation=interpolation, **PLAIN)
    indices, batch, failures = _decoded(paths, preprocess)
    assert (indices, failures, tuple(batch.shape)) == (list(range(8)), [], (8, 3, 34, 34))
    assert all(torch.equal(row, expected) for row, expected in zip(batch, _on_cpu(paths, preprocess)))


def test_a_crop_wider_than_a_line_of_pixels_resizes_only_the_crops_stretch_of_it(tmp_path):
    from hookcli.inputs.transforms import to_tensor_steps

    pixels = np.random.default_rng(3).integers(0, 256, (4, 600, 3), dtype=np.uint8)  # 4 rows, 600 columns
    Image.fromarray(pixels).save(tmp_path / "line.jpg", quality=95)
    preprocess = Preprocess(resize=8, crop=12, **PLAIN)  # resized to 8 x 1,200: the height is padded to 12
    assert to_tensor_steps(preprocess)._placed(4, 600) == ((8, 1200), (0, 594, 8, 12))  # not all 1,200 columns
    _, batch, _ = _decoded([tmp_path / "line.jpg"], preprocess)
    assert tuple(batch.shape) == (1, 3, 12, 12) and torch.equal(
        batch[0], _on_cpu([tmp_path / "line.jpg"], preprocess)[0]
    )


def test_a_jpeg_far_larger_than_its_pixels_is_decoded_by_pillow_not_handed_over_whole(tmp_path, monkeypatch):
    pixels = np.random.default_rng(4).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "plain.jpg", quality=90)
    padded = tmp_path / "padded.jpg"  # the picture, then data that is not, then an end marker
    padded.write_bytes((tmp_path / "plain.jpg").read_bytes() + bytes(8 * 20 * 30 * 3) + b"\xff\xd9")
    monkeypatch.setattr(images_module, "_JPEG_EXTRAS", 0)  # so that 14 KB of zeros is far too much
    found, _ = read_encoded(tmp_path / "plain.jpg")
    assert found.size == (30, 20) and len(found.data) == (tmp_path / "plain.jpg").stat().st_size
    found, _ = read_encoded(padded)
    assert isinstance(found, Image.Image) and np.array_equal(np.asarray(found), np.asarray(load_rgb(padded)))


def test_a_batch_is_decoded_a_bounded_number_of_pixels_at_a_time(photo, tmp_path, make_image, monkeypatch):
    import torchvision.io

    from hookcli.inputs import decoding

    calls = []
    original = torchvision.io.decode_jpeg

    def counted(data, **options):
        calls.append(len(data))
        return original(data, **options)

    paths = [photo, make_image(tmp_path / "a.png", size=(50, 40)), photo, photo]
    preprocess = Preprocess(resize=24, crop=20)
    _, whole, _ = _decoded(paths, preprocess)
    monkeypatch.setattr(torchvision.io, "decode_jpeg", counted)
    monkeypatch.setattr(decoding, "PIXELS_AT_ONCE", 512 * 600 + 1)  # one photo at a time
    indices, parts, _ = _decoded(paths, preprocess)
    assert (calls, indices) == ([1, 1, 1], [0, 1, 2, 3])
    assert torch.equal(parts, whole)


def test_segmentation_rows_keep_their_own_shapes(photo, tmp_path, make_image):
    wide = make_image(tmp_path / "wide.png", size=(90, 30))
    preprocess = Preprocess(resize=24, crop=None, kind="segmentation")
    _, rows, _ = _decoded([photo, wide], preprocess)
    assert isinstance(rows, list)
    assert [tuple(row.shape) for row in rows] == [(3, 28, 24), (3, 24, 72)]
    assert [row.shape for row in rows] == [row.shape for row in _on_cpu([photo, wide], preprocess)]


def test_unreadable_images_fail_with_the_cpu_paths_messages(photo, tmp_path):
    data = photo.read_bytes()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "text.jpg"
    text.write_text("not a picture")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    inputs = [photo, truncated, text, empty, tmp_path / "gone.jpg", photo]
    loaded = load_model("resnet18", "none")
    found = {}
    for decode in ("cpu", "device"):
        settings = RunSettings(
            preprocess=loaded.preprocess.replace(resize=32, crop=32, decode=decode), on_error="skip", batch_size=8
        )
        (batch,) = iter_batches(loaded, {"layer1": "layer1"}, inputs, settings)
        found[decode] = batch
    assert found["device"].indices == found["cpu"].indices == [0, 5]
    assert found["device"].failures == found["cpu"].failures
    assert [index for index, _ in found["device"].failures] == [1, 2, 3, 4]
    assert found["device"].failures[0][1].startswith(f"cannot decode image '{truncated}': image file is truncated")


def test_a_jpeg_the_device_decoder_refuses_is_decoded_by_pillow_and_said_once(photo, tmp_path, monkeypatch):

    _refusing(monkeypatch, photo, "nvjpegDecode failed: 6\nmore")  # as nvJPEG refuses a JPEG it does not support
    other = tmp_path / "other.jpg"
    Image.open(photo).convert("RGB").resize((100, 120)).save(other)
    notes = []
    preprocess = Preprocess(resize=None, crop=None, kind="detection", **PLAIN)
    # A first batch of only refused JPEGs is no sign of a decoder that decodes nothing: the run goes on.
    assert _decoded([photo, photo], preprocess)[0] == [0, 1]
    indices, rows, failures = _decoded([other, photo, photo], preprocess, notes.append)
    assert (indices, failures) == ([0, 1, 2], [])
    assert torch.equal(rows[1], _on_cpu([photo], preprocess)[0])
    assert torch.equal(rows[0], _on_cpu([other], preprocess)[0])
    assert notes == [
        f"--decode device: torchvision's CPU decoder refused '{photo}' (nvjpegDecode failed: 6); "
        "Pillow decoded it, as it will any other such image"
    ]


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (
            "nvjpegDecode failed: 6",
            "Error: --decode device: torchvision's CPU decoder decodes none of these JPEGs "
            "(Error while decoding JPEG images: nvjpegDecode failed: 6). Hint: this torchvision may lack nvJPEG; use "
            "--decode cpu",
        ),
        (
            "CUDA out of memory. Tried to allocate 2.00 GiB",
            "Error: --decode device: the device ran out of memory "
            "decoding a batch (Error while decoding JPEG images: CUDA out of memory. Tried to allocate 2.00 GiB). "
            "Hint: "
            "give a smaller --batch-size, or --decode cpu",
        ),
    ],
)
def test_a_decoder_that_decodes_nothing_or_runs_out_of_memory_stops_the_run(
    runner, resnet18_args, photo, monkeypatch, tmp_path, failure, message
):
    import torchvision.io

    monkeypatch.chdir(tmp_path)  # the default output is named in the current folder

    def failing(data, **options):
        raise RuntimeError(f"Error while decoding JPEG images: {failure}")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", failing)
    on_the_cpu = ["-l", "layer1", "--resize", "32", "--crop", "32", "--decode", "device", "-d", "cpu", "-q"]
    result = runner.invoke(main, resnet18_args("extract", *on_the_cpu, *[str(photo)] * 8))
    assert (result.exit_code, result.stderr) == (1 if "memory" in failure else 2, message + "\n")


def test_extract_with_device_decoding_records_it_and_keeps_the_values(
    runner, resnet18_args, photo, tmp_path, make_image
):
    png = make_image(tmp_path / "a.png", size=(70, 50))
    base = resnet18_args(
        "extract",
        "-l",
        "layer2",
        "--pool",
        "avg",
        "--resize",
        "40",
        "--crop",
        "32",
        "-q",
        str(photo),
        str(png),
        str(photo),
    )
    results = {
        decode: runner.invoke(
            main, [*base, "--decode", decode, "--workers", "1", "-o", str(tmp_path / f"{decode}.safetensors")]
        )
        for decode in ("cpu", "device")
    }
    assert all(result.exit_code == 0 for result in results.values()), [r.output for r in results.values()]
    files = {decode: safe_open(tmp_path / f"{decode}.safetensors", "pt") for decode in results}
    device, cpu = (files[d].get_tensor("layer2") for d in ("device", "cpu"))
    assert device.shape == cpu.shape == (3, 128)
    if _default_decoder() == "libjpeg":  # libjpeg's pixels, resized as Pillow resizes: the same features
        assert torch.equal(device, cpu)
    else:  # a GPU's decoder gives libjpeg's pixels to a level or more (docs/benchmarks.md)
        assert (device - cpu).abs().max().item() < 0.05 * cpu.abs().max().item()
    assert torch.equal(device[0], device[2])
    assert json.loads(files["device"].metadata()["preprocess"])["decode"] == "device"
    assert json.loads(files["device"].metadata()["preprocess"])["decoder"] == _default_decoder()
    assert "decode" not in json.loads(files["cpu"].metadata()["preprocess"])  # as runs before the option recorded


def test_a_folder_started_on_one_decoder_is_not_continued_on_the_other(runner, resnet18_args, photo, tmp_path):
    base = resnet18_args(
        "extract", "-l", "layer1", "--resize", "32", "--crop", "32", "-q", "-o", f"{tmp_path}/feats/", str(photo)
    )
    assert runner.invoke(main, [*base, "--decode", "device"]).exit_code == 0
    result = runner.invoke(main, [*base, "--decode", "cpu"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: '{tmp_path}/feats/' holds a different run (it "
        f"differs in: preprocess (the folder's alone: decode device, decoder {_default_decoder()})). Hint: run "
        "the same command to continue it, add --force to replace it, or use another folder\n",
    )


def test_grad_runs_on_device_decoded_images(runner, resnet18_args, photo, tmp_path):
    out = tmp_path / "grads.safetensors"
    result = runner.invoke(
        main,
        resnet18_args(
            "grad",
            "-l",
            "layer4",
            "--resize",
            "32",
            "--crop",
            "32",
            "--decode",
            "device",
            "-q",
            "-o",
            str(out),
            str(photo),
        ),
    )
    assert result.exit_code == 0, result.output
    assert safe_open(out, "pt").get_tensor("layer4").shape == (1, 512, 1, 1)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["-m", "resnet18", "--decode", "device", "--fast-decode"],
            "Error: --fast-decode and --decode device cannot be combined. Hint: --fast-decode is a reduced scale of "
            "the "
            "CPU's decoder; give one of them\n",
        ),
        (
            ["-m", "r3d_18", "--decode", "device"],
            "Error: --decode device reads image files, and this video model takes frames decoded on the CPU. Hint: "
            "leave "
            "out --decode device\n",
        ),
        (["-m", "resnet18", "--decode", "gpu"], None),
    ],
)
def test_device_decoding_is_refused_where_it_cannot_apply(runner, photo, arguments, message):
    result = runner.invoke(main, ["extract", "-w", "none", "-l", "layer1", *arguments, str(photo)])
    assert result.exit_code == 2
    if message is None:
        assert "Invalid value for '--decode': 'gpu' is not one of 'cpu', 'device'." in result.stderr
    else:
        assert result.stderr == message


@pytest.mark.parametrize(("model", "kind"), [("r3d_18", "video"), ("raft_small", "optical flow")])
def test_device_decoding_of_a_video_model_is_refused_before_its_inputs_are_read(
    runner, photo, monkeypatch, model, kind
):
    monkeypatch.setitem(sys.modules, "av", None)  # reading a video's frames would need PyAV: the refusal does not
    asked = ["extract", "-w", "none", "-l", "layer1", "-m", model, "--decode", "device", str(photo)]
    result = runner.invoke(main, asked)
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: --decode device reads image files, and this {kind} model takes frames decoded on the CPU. Hint: "
        "leave out --decode device\n",
    )


def test_preprocessing_with_device_decoding_reads_back_from_metadata():
    spec = Preprocess(resize=64, crop=56, decode="device")
    assert Preprocess.from_metadata(spec.to_json()) == spec
    assert json.loads(Preprocess(resize=64, crop=56).to_json()).get("decode") is None
    with pytest.raises(ValueError, match="^decode must be one of cpu, device, not 'gpu'$"):
        Preprocess.from_metadata(json.dumps({"resize": 64, "crop": 56, "decode": "gpu"}))
    with pytest.raises(ValueError, match="^its decode is not a name$"):
        Preprocess.from_metadata(json.dumps({"resize": 64, "crop": 56, "decode": 1}))


def test_libjpegs_warnings_about_a_damaged_jpeg_become_one_note_naming_it_and_none_with_q(
    runner, photo, tmp_path, capfd
):
    data = photo.read_bytes()
    marker = data.index(b"\xff\xda")  # the start of the scan
    damaged = tmp_path / "damaged.jpg"
    damaged.write_bytes(data[:marker] + b"\x00\x11\x22" + data[marker:])
    arguments = ["extract", "-m", "resnet18", "-w", "none", "-l", "layer1", "--pool", "avg", "--decode", "device"]
    arguments += ["-d", "cpu", "--resize", "64", "--crop", "56", "-b", "3", str(photo), str(damaged), str(photo)]
    quiet = runner.invoke(main, [*arguments, "-q", "-o", str(tmp_path / "quiet.safetensors")])
    assert (quiet.exit_code, quiet.stderr, capfd.readouterr().err) == (0, "", "")
    told = runner.invoke(main, [*arguments, "-o", str(tmp_path / "told.safetensors")])
    assert (told.exit_code, capfd.readouterr().err) == (0, "")
    assert told.stderr == (
        f"Note: '{damaged}' is damaged (Corrupt JPEG data: 3 extraneous bytes before marker 0xda); decoded anyway\n"
    )
    events = []
    hookcli.extract(
        "resnet18", "layer1", [damaged], weights="none", decode="device", device="cpu", progress=events.append
    )
    assert Damaged(str(damaged), "Corrupt JPEG data: 3 extraneous bytes before marker 0xda") in events
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(("decode", "pinned"), [("device", False), ("cpu", True)])
def test_rows_for_a_gpu_are_pinned_and_jpeg_bytes_are_not(photo, decode, pinned):
    from hookcli.run.batches import image_loader

    preprocess = Preprocess(resize=24, crop=20, decode=decode)
    settings = RunSettings(preprocess=preprocess, device=torch.device("cuda"), batch_size=2, workers=0)
    assert image_loader([photo], settings).pin_memory is pinned  # bytes the device's decoder reads on the host
    assert (
        image_loader([photo], RunSettings(preprocess=preprocess, device=torch.device("cpu"), workers=0)).pin_memory
        is False
    )
