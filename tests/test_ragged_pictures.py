"""Pictures of rows of their own shapes (ragged keys: detection maps, segmentation images of their own sizes) and of a
detection model's final detections, in grids and reports, from files, memory and shard folders."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import hookcli
from hookcli.cli import main
from hookcli.inputs.images import load_rgb
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_transform
from hookcli.options.grid import GridOptions
from hookcli.pictures.boxes import BOX_COLOURS
from hookcli.pictures.drawing import render_job
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.photos import model_photo
from hookcli.pictures.render import add_title
from hookcli.storage.features import FeatureFile, Features
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shard_writer import ShardWriter
from hookcli.storage.shards import ShardedFeatures
from hookcli.storage.writers import RowBuffer

#: One channel at one pixel a value, nothing around it: a picture of exactly the row's own height and width.
_EXACT = ["--plain", "--channels", "0", "--padding", "0", "--min-tile", "1"]
_DETECTION_PREPROCESS = json.dumps({"resize": None, "crop": None, "mean": None, "std": None, "kind": "detection"})


def _png(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _rows(features: dict, inputs) -> RowBuffer:
    """``features`` (key → a list of per-row tensors: ragged) buffered as one file's rows."""
    buffer = RowBuffer(len(inputs))
    buffer.add(features, slice(None), [str(p) for p in inputs])
    return buffer


def _write(path, buffer: RowBuffer, **metadata) -> None:
    write_safetensors(
        buffer.tensors(flat=False), {"format": "2", "inputs": json.dumps(buffer.inputs), **metadata}, path
    )


def _maps(*shapes, seed=0) -> list[torch.Tensor]:
    """Positive random rows (so the zero padding, were it drawn, would change every scale)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(shape, generator=generator) + 1.0 for shape in shapes]


@pytest.fixture
def photos(tmp_path, make_image):
    """Three photos of their own sizes (width × height): wide, tall and square."""
    return [
        make_image(tmp_path / f"{name}.png", size=size, seed=i)
        for i, (name, size) in enumerate([("wide", (96, 40)), ("tall", (40, 96)), ("square", (64, 64))])
    ]


def _detection_rows(photos) -> RowBuffer:
    """Ragged maps, and final detections of two boxes for the first photo, none for the second."""
    return _rows(
        {
            "maps": _maps((4, 5, 12), (4, 12, 5)),
            "detections#boxes": [torch.tensor([[4.0, 2.0, 40.0, 30.0], [50.0, 10.0, 90.0, 38.0]]), torch.zeros(0, 4)],
            "detections#labels": [torch.tensor([3, 12]), torch.zeros(0, dtype=torch.int64)],
            "detections#scores": [torch.tensor([0.875, 0.25]), torch.zeros(0)],
            "detections#masks": [torch.ones(2, 1, 40, 96), torch.zeros(0, 1, 96, 40)],
        },
        photos[:2],
    )


@pytest.fixture
def detections(tmp_path, photos):
    """A detection file of :func:`_detection_rows`."""
    path = tmp_path / "d.safetensors"
    _write(path, _detection_rows(photos), family="detection", preprocess=_DETECTION_PREPROCESS)
    return path


# -- feature maps of rows of their own shapes ---------------------------------------------------------


def _shard_folder(tmp_path, photos) -> str:
    folder = tmp_path / "feats"
    writer = ShardWriter(folder, {"run": 1, "inputs": 3, "shard_size": 2}, 3)
    writer.start_writing(
        {
            "hookcli_index": 1,
            "identity": {"run": 1, "inputs": 3, "shard_size": 2},
            "shard_size": 2,
            "inputs": 3,
            "shard_name": "features-{:05d}.safetensors",
            "metadata": {"format": "2", "family": "segmentation"},
        }
    )
    maps = _maps((3, 5, 12), (3, 12, 5), (3, 7, 7))
    for number, rows in enumerate((slice(0, 2), slice(2, 3))):
        buffer = _rows({"maps": maps[rows]}, photos[rows])
        writer.submit(
            number,
            buffer.tensors(flat=False),
            {"format": "2", "shard": str(number), "inputs": json.dumps(buffer.inputs)},
            buffer.inputs,
            [],
        )
    writer.close()
    return str(folder)


def _one_file(tmp_path, photos) -> str:
    path = tmp_path / "r.safetensors"
    _write(path, _rows({"maps": _maps((3, 5, 12), (3, 12, 5), (3, 7, 7))}, photos), family="segmentation")
    return str(path)


@pytest.mark.parametrize("source", [_one_file, _shard_folder])
def test_each_row_is_drawn_at_its_own_shape(runner, tmp_path, photos, source):
    where = source(tmp_path, photos)
    result = runner.invoke(main, ["grid", where, *_EXACT, "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    names = ["maps__00000_wide.png", "maps__00001_tall.png", "maps__00002_square.png"]
    assert result.stdout.split() == [str(tmp_path / "g" / name) for name in names]
    assert [_png(tmp_path / "g" / name).shape for name in names] == [(5, 12, 3), (12, 5, 3), (7, 7, 3)]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"top": 2},
        {"scale": "grid"},
        {"channels": "1:3"},
        {"plain": True, "cmap": "gray"},
        {"columns": 1},
    ],
)
def test_a_ragged_rows_picture_is_that_of_the_same_row_stored_plainly(tmp_path, photos, options):
    buffer = _rows({"maps": _maps((4, 5, 12), (4, 12, 5), (4, 7, 7))}, photos)
    ragged = Features(buffer.tensors(flat=False), {"inputs": json.dumps(buffer.inputs)})
    grid_options = GridOptions(**options)
    drawn = {job.row: render_job(ragged, job, grid_options) for job in plan_grids(ragged, grid_options, None)}
    assert ragged.ragged("maps") and ragged.shape("maps") == [3, 4, 12, 12]
    for row in range(3):
        alone = Features({"maps": ragged.read("maps", row)[None]}, {"inputs": json.dumps(buffer.inputs[row : row + 1])})
        [job] = plan_grids(alone, grid_options, None)
        assert np.array_equal(drawn[row], render_job(alone, job, grid_options))


def test_a_report_gives_and_measures_each_rows_own_shape(tmp_path, photos):
    index = hookcli.report(_shard_folder(tmp_path, photos), output=tmp_path / "r", page_size=2)
    pages = [index, index.parent / "page-00002.html"]
    text = "".join(page.read_text() for page in pages)
    assert re.findall(r'<p class="shape">([^<]*)</p>', text) == [
        f"F32, {shape} for this image (images differ in shape; the largest is [3,12,12])"
        for shape in ("[3,5,12]", "[3,12,5]", "[3,7,7]")
    ]
    with ShardedFeatures(tmp_path / "feats") as features:
        low = [float(features.read("maps", row).min()) for row in range(3)]
    found = [float(v) for v in re.findall(r'<table class="stats">.*?<td data-value="([^"]+)"', text)]
    assert found == pytest.approx(low) and min(found) >= 1.0  # the padding's zeros are no row's minimum


def test_a_row_with_no_values_is_skipped_alone(runner, tmp_path, photos):
    path = tmp_path / "r.safetensors"
    _write(path, _rows({"maps": _maps((2, 4, 6), (2, 0, 6), (2, 6, 4))}, photos))
    result = runner.invoke(main, ["grid", str(path), *_EXACT, "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert "Note: skipped 'maps' of image 1 (tall.png): it holds no values" in result.stderr
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["maps__00000_wide.png", "maps__00002_square.png"]
    index = hookcli.report(str(path), output=tmp_path / "r")
    assert index.read_text().count('<p class="missing">No picture: it holds no values.</p>') == 1


def test_ragged_optical_flow_fields_are_drawn_at_their_own_size(runner, tmp_path, photos):
    path = tmp_path / "flow.safetensors"
    _write(path, _rows({"flow": _maps((2, 6, 10), (2, 9, 4))}, photos[:2]), family="optical_flow")
    result = runner.invoke(main, ["grid", str(path), "--plain", "--min-tile", "1", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert [_png(p).shape for p in result.stdout.split()] == [(6, 10, 3), (9, 4, 3)]


# -- overlays over the model's view -------------------------------------------------------------------


def test_model_photo_without_a_crop_is_the_whole_photo_the_model_was_given(photos):
    detection = Preprocess(resize=None, crop=None, mean=None, std=None, kind="detection")
    segmentation = Preprocess(resize=48, crop=None, kind="segmentation")
    for photo in photos:
        width, height = Image.open(photo).size
        assert model_photo(photo, detection, enlarge=False).shape == (height, width, 3)
        assert np.array_equal(model_photo(photo, detection, enlarge=False), np.asarray(load_rgb(photo)))
        given = to_transform(segmentation)(load_rgb(photo))  # what the model was given: [3, H, W]
        assert model_photo(photo, segmentation, enlarge=False).shape == (*given.shape[1:], 3)
        enlarged = model_photo(photo, segmentation)
        assert min(enlarged.shape[:2]) == 512 and enlarged.shape[1] / enlarged.shape[0] == pytest.approx(
            given.shape[2] / given.shape[1], rel=0.02
        )


def test_a_real_segmentation_models_maps_overlay_the_photo_at_its_size(runner, tmp_path, photos):
    path = tmp_path / "s.safetensors"
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "lraspp_mobilenet_v3_large",
            "-w",
            "none",
            "-l",
            "classifier",
            "--resize",
            "48",
            *map(str, photos[:2]),
            "-o",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    with FeatureFile(path) as features:
        assert features.ragged("classifier")
        shapes = [features.row_shape("classifier", row) for row in range(2)]
    assert shapes[0][1] < shapes[0][2] and shapes[1][1] > shapes[1][2]  # wide and tall maps
    result = runner.invoke(main, ["grid", str(path), *_EXACT, "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert [_png(p).shape[:2] for p in result.stdout.split()] == [tuple(shape[1:]) for shape in shapes]
    result = runner.invoke(main, ["grid", str(path), "--overlay", "--plain", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    given = [
        to_transform(Preprocess(resize=48, crop=None, kind="segmentation"))(load_rgb(p)).shape[1:] for p in photos[:2]
    ]
    assert [_png(p).shape[:2] for p in result.stdout.split()] == [tuple(g) for g in given]


def test_detection_maps_overlay_the_whole_photo(runner, tmp_path, detections, photos):
    result = runner.invoke(
        main, ["grid", str(detections), "-k", "maps", "--overlay", "--plain", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    assert [_png(p).shape for p in result.stdout.split()] == [(40, 96, 3), (96, 40, 3)]


# -- final detections ---------------------------------------------------------------------------------


def test_grid_draws_each_images_detections_over_its_photo(runner, tmp_path, detections, photos):
    result = runner.invoke(main, ["grid", str(detections), "--plain", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert [p.rsplit("/", 1)[1] for p in result.stdout.split()] == [  # keys by name: no layers metadata
        "detections__00000_wide.png",
        "detections__00001_tall.png",
        "maps__00000_wide.png",
        "maps__00001_tall.png",
    ]
    assert (
        "Note: not drawn: 'detections#masks' (the detections picture shows each image's boxes, labels and scores)"
    ) in result.stderr
    boxed, empty = (_png(tmp_path / "g" / f"detections__{name}.png") for name in ("00000_wide", "00001_tall"))
    photo = np.asarray(load_rgb(photos[0]))
    assert boxed.shape == photo.shape
    assert boxed[2, 20].tolist() == list(BOX_COLOURS[3]) and boxed[10, 70].tolist() == list(BOX_COLOURS[12 % 10])
    assert np.array_equal(boxed[6:26, 8:36], photo[6:26, 8:36])  # inside the box: the photo as it is
    assert np.array_equal(empty, np.asarray(load_rgb(photos[1])))  # no detections: the photo alone


def test_a_detections_picture_is_enlarged_and_captioned_with_its_count(tmp_path, detections):
    with FeatureFile(detections) as features:
        options = GridOptions(keys="detections#*")
        jobs = plan_grids(features, options, None)
        assert [job.path.name for job in jobs] == ["detections__00000_wide.png", "detections__00001_tall.png"]
        assert jobs.detections == ("detections#boxes", "detections#labels", "detections#masks", "detections#scores")
        captioned = [render_job(features, job, options) for job in jobs]
    # Enlarged to 512 pixels on the shorter side (96 x 40 to 1229 x 512), under a caption.
    sizes = [(512, 1229), (1229, 512)]
    captions = [
        ["detections", "wide.png", "2 detections", "label (class index) and score on each box"],
        ["detections", "tall.png", "no detections"],
    ]
    for pixels, (height, width), caption in zip(captioned, sizes, captions):
        assert pixels.shape[1] == width
        assert np.array_equal(pixels[:-height], add_title(np.zeros((height, width, 3), np.uint8), caption)[:-height])


def test_detections_need_the_photos(runner, tmp_path, photos):
    unlisted = tmp_path / "unlisted.safetensors"
    write_safetensors(_detection_rows(photos).tensors(flat=False), {"format": "2", "family": "detection"}, unlisted)
    result = runner.invoke(main, ["grid", str(unlisted), "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert (
        "Note: skipped the detections ('detections#boxes', 'detections#labels', 'detections#masks', "
        "'detections#scores'): they are drawn over the input images, and "
        f"'{unlisted}' does not list them"
    ) in result.stderr
    assert [p.rsplit("/", 1)[1] for p in result.stdout.split()] == [
        "maps__00000_row00000.png",
        "maps__00001_row00001.png",
    ]
    result = runner.invoke(main, ["grid", str(unlisted), "-k", "detections#*", "-o", str(tmp_path / "h")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: nothing to draw in '{unlisted}': the detections (")


def test_report_lists_each_images_detections(tmp_path, detections):
    index = hookcli.report(str(detections), output=tmp_path / "r")
    text = index.read_text()
    first, second = re.findall(r'<article class="detections" id="(image-\d-detections)">(.*?)</article>', text, re.S)
    assert first[0] == "image-0-detections" and second[0] == "image-1-detections"
    cells = [re.sub(r"<[^>]+>", " ", row).split() for row in re.findall(r"<tr>(.*?)</tr>", first[1])]
    assert cells == [
        ["detection", "label", "score", "x1", "y1", "x2", "y2"],
        ["#0", "3", "0.875", "4.0", "2.0", "40.0", "30.0"],
        ["#1", "12", "0.250", "50.0", "10.0", "90.0", "38.0"],
    ]
    assert "<caption>2 detections: label (class index), score, and box corners in pixels" in first[1]
    assert '<p class="none">No detections.</p>' in second[1] and "<table" not in second[1]
    assert first[1].count("<img ") == second[1].count("<img ") == 1
    assert '<a href="#image-1-detections">detections</a>' in text
    # The detections are not drawn again as tensors, and the summary says they are in the report.
    assert re.findall(r'<article class="tensor" id="[^"]+">\n<h3>([^<]+)</h3>', text) == ["maps", "maps"]
    for key in ("detections#boxes", "detections#labels", "detections#scores", "detections#masks"):
        assert re.search(rf"<tr><td>{key}</td>.*?<td>yes</td></tr>", text)


def test_a_real_detection_model_with_no_detections(runner, tmp_path, photos):
    path = tmp_path / "d.safetensors"
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            "-w",
            "none",
            "-l",
            "backbone.fpn",
            "--detections",
            *map(str, photos[:2]),
            "-o",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    with FeatureFile(path) as features:
        assert features.shape("detections#boxes") == [2, 0, 4]  # random weights find nothing
        shapes = [features.row_shape("backbone.fpn#0", row) for row in range(2)]
    assert shapes[0][1] < shapes[0][2] and shapes[1][1] > shapes[1][2]
    result = runner.invoke(
        main, ["grid", str(path), "-k", "backbone.fpn#0", "-k", "detections#*", *_EXACT, "-o", str(tmp_path / "g")]
    )
    assert result.exit_code == 0, result.output
    written = result.stdout.split()
    assert [_png(p).shape[:2] for p in written[:2]] == [tuple(shape[1:]) for shape in shapes]
    assert [_png(p).shape[:2] for p in written[2:]] == [(40, 96), (96, 40)]
    index = hookcli.report(str(path), output=tmp_path / "r", channels="0:4")
    assert index.read_text().count('<p class="none">No detections.</p>') == 2
