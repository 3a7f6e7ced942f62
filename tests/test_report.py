"""hookcli report: pages and their links, lazy reads, statistics against numpy, escaping, refusals, CAM and grad
files, the command line, and the pages in a real browser."""

import base64
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hookcli
from hookcli.cli import main
from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.boxes import BOX_COLOURS, place_tabs
from hookcli.pictures.drawing import render_job
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.html import PAGE_WINDOW, page_name
from hookcli.pictures.photos import model_thumbnail
from hookcli.pictures.reports import CONTENT_SECURITY_POLICY, DEFAULT_PAGE_SIZE, write_report
from hookcli.storage.features import Features
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shards import open_features

SMALL = {"weights": "none", "resize": 64, "crop": 64}


@pytest.fixture(scope="module")
def photo_path() -> Path:
    import matplotlib.cbook

    return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, photo_path) -> Path:
    """A shard folder of 7 rows in shards of 3 (resnet18 at 64 px: layer1 [64, 16, 16] and logits [1000])."""
    where = tmp_path_factory.mktemp("shards")
    noise = []
    for seed in range(2):
        pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
        noise.append(where / f"noise{seed}.png")
        Image.fromarray(pixels).save(noise[-1])
    inputs = [photo_path, *noise, photo_path, *noise, photo_path]
    hookcli.extract("resnet18", ["layer1", "fc=logits"], inputs, output=f"{where}/feats/", shard_size=3, **SMALL)
    return where / "feats"


def _sections(page: Path, tag: str, css: str) -> dict[str, str]:
    """The HTML of each ``<tag class="css" id=…>`` on a page, by id."""
    found = re.findall(rf'<{tag} class="{css}" id="([^"]+)">(.*?)</{tag}>', page.read_text(), flags=re.S)
    return dict(found)


def _pictures(text: str) -> list[np.ndarray]:
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
        for data in re.findall(r'<img src="data:image/png;base64,([^"]+)"', text)
    ]


def _links(page: Path) -> dict[str, str]:
    """The pager's first/prev/next/last links: rel → file name."""
    return dict((rel, href) for href, rel in re.findall(r'<a href="([^"]+)" rel="(\w+)">', page.read_text()))


# -- pages -----------------------------------------------------------------------------------------


def test_a_shard_folder_is_paged_and_the_pages_link_to_each_other(folder, tmp_path):
    events = []
    index = hookcli.report(folder, output=tmp_path / "r", page_size=3, progress=events.append)
    assert index == tmp_path / "r" / "index.html"
    assert sorted(p.name for p in index.parent.iterdir()) == ["index.html", "page-00002.html", "page-00003.html"]
    pages = [index.parent / page_name(n) for n in (1, 2, 3)]
    assert [list(_sections(p, "section", "image")) for p in pages] == [
        ["image-0", "image-1", "image-2"],
        ["image-3", "image-4", "image-5"],
        ["image-6"],
    ]
    assert list(_sections(pages[1], "article", "tensor")) == [
        f"image-{row}-tensor-{k}" for row in (3, 4, 5) for k in (0, 1)
    ]
    assert [len(_pictures(p.read_text())) for p in pages] == [9, 9, 3]  # a thumbnail and two tensors an image
    assert [_links(p) for p in pages] == [
        {"next": "page-00002.html", "last": "page-00003.html"},
        {"first": "index.html", "prev": "index.html", "next": "page-00003.html", "last": "page-00003.html"},
        {"first": "index.html", "prev": "page-00002.html"},
    ]
    text = pages[1].read_text()
    assert f"<title>{folder} · hookcli report · page 2 of 3</title>" in text
    assert f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">' in text
    assert '<a href="#image-4">Image 4: noise0.png</a>' in text  # the table of contents
    assert '<a href="#image-4-tensor-1">logits</a>' in text
    assert '<a href="index.html#summary">Summary of the file</a>' in text
    assert 'id="summary"' in pages[0].read_text() and 'id="summary"' not in text
    assert events[0] == Started(total=7) and events[-1] == Wrote(index)
    assert events.count(Advanced(1)) == 7 and len(events) == 9


def test_nothing_is_fetched_and_nothing_runs(folder, tmp_path):
    index = hookcli.report(folder, output=tmp_path / "r", page_size=3)
    for page in index.parent.iterdir():
        text = page.read_text()
        assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text
        sources = re.findall(r'\b(?:src|href)="([^"]*)"', text)
        assert sources and all(s.startswith(("data:image/png;base64,", "#", "index.html", "page-")) for s in sources)


def test_a_picture_is_what_grid_draws_for_the_same_tensor_and_image(folder, tmp_path):
    index = hookcli.report(folder, output=tmp_path / "r", page_size=3, channels="0:8", cmap="gray")
    article = _sections(index.parent / "page-00002.html", "article", "tensor")["image-4-tensor-0"]
    options = GridOptions(channels="0:8", cmap="gray")
    with open_features(folder) as features:
        [job] = plan_grids(features, GridOptions(keys="layer1", images="4", channels="0:8", cmap="gray"), None)
        expected = render_job(features, job, options)
    assert [p.tolist() for p in _pictures(article)] == [expected.tolist()]


class _Recording:
    """A reader that lists each read it is asked for, ``(key, row, part)``, and refuses reads of many rows."""

    def __init__(self, features, reads: list):
        self._features, self._reads = features, reads

    def __getattr__(self, name):
        return getattr(self._features, name)

    def read(self, key, index=None, part=None):
        self._reads.append((key, index, part))
        return self._features.read(key, index, part)

    def read_rows(self, key, start, stop):
        raise AssertionError("a report reads single rows")


def test_rows_are_read_lazily_one_row_and_tensor_at_a_time(folder, tmp_path):
    reads = []
    with open_features(folder) as features:
        write_report(_Recording(features, reads), tmp_path / "r", GridOptions(), page_size=3)
    expected = [(key, row, None) for row in range(7) for key in ("layer1", "logits")]
    assert sorted(reads, key=lambda r: (r[1], r[0])) == expected
    assert [row for _, row, _ in reads] == [3, 3, 4, 4, 5, 5, 6, 6, 0, 0, 1, 1, 2, 2]  # index.html comes last


def test_each_rows_detections_are_read_once_for_their_picture_and_table(tmp_path, photo_path):
    boxes = np.array([[[10.0, 20.0, 200.0, 300.0], [50.0, 60.0, 90.0, 100.0]]] * 2, dtype=np.float32)
    tensors = {
        "detections#boxes": boxes,
        "detections#labels": np.array([[1, 2]] * 2),
        "detections#scores": np.array([[0.9, 0.5]] * 2, dtype=np.float32),
    }
    metadata = {"family": "detection", "inputs": json.dumps([str(photo_path)] * 2)}
    reads = []
    text = write_report(_Recording(Features(tensors, metadata), reads), tmp_path / "r", GridOptions()).read_text()
    assert sorted(reads) == sorted((key, row, None) for key in tensors for row in (0, 1))
    articles = re.findall(r'<article class="detections" id="image-\d-detections">(.*?)</article>', text, re.S)
    assert [(len(_pictures(a)), a.count("<tr><td>#")) for a in articles] == [(1, 2), (1, 2)]


def test_many_pages_link_to_a_window_of_nearby_pages(tmp_path):
    features = Features({"x": np.arange(40 * 4, dtype=np.float32).reshape(40, 4)}, {})
    index = write_report(features, tmp_path / "r", GridOptions(), page_size=1)
    assert len(list(index.parent.iterdir())) == 40
    text = (index.parent / "page-00020.html").read_text()
    pager = re.search(r'<nav class="pages".*?</nav>', text).group(0)
    numbers = [int(n) for n in re.findall(r'<a href="page-\d+\.html">(\d+)</a>', pager)]
    assert numbers == [17, 18, 19, 21, 22, 23] == [*range(20 - PAGE_WINDOW, 20), *range(21, 21 + PAGE_WINDOW)]
    assert '<span aria-current="page">20</span>' in pager and pager.count("…") == 2
    assert _links(index.parent / "page-00020.html") == {
        "first": "index.html",
        "prev": "page-00019.html",
        "next": "page-00021.html",
        "last": "page-00040.html",
    }


def test_the_first_page_opens_with_pictures_and_keeps_the_files_details_collapsed_below(folder, tmp_path):
    text = hookcli.report(folder, output=tmp_path / "r", page_size=3).read_text()
    summary = re.search(r'<section id="summary">.*?</section>', text, flags=re.S).group(0)
    assert f"<tr><th>source</th><td>{folder}</td></tr>" in summary
    assert "<tr><th>images (rows)</th><td>7</td></tr>" in summary
    assert "<tr><th>pages</th><td>3 of up to 3 images</td></tr>" in summary
    assert '<table class="tensors">' not in summary and "metadata" not in summary.replace("tensors and metadata", "")
    assert '<ol start="0">' in text and '<ol start="3">' in (tmp_path / "r" / "page-00002.html").read_text()
    first_image = text.index('<section class="image"')
    details = text.index(
        '<details class="about">\n<summary>The file: its tensors and metadata</summary>\n<div id="file">'
    )
    assert text.index(summary) < text.index('<nav id="contents"') < first_image < details
    summary = text[details : text.index("</details>", details)]  # collapsed: no open attribute
    assert "<tr><td>layer1</td><td>F32</td><td>[7,64,16,16]</td><td>448.0 KiB</td><td>yes</td></tr>" in summary
    assert "<tr><td>logits</td><td>F32</td><td>[7,1000]</td><td>27.3 KiB</td><td>yes</td></tr>" in summary
    assert "<tr><th>model</th><td>resnet18</td></tr>" in summary
    assert "<tr><th>resize</th><td>64</td></tr>" in summary  # preprocess, parsed from JSON into a table
    assert "<tr><th>mean</th><td>0.485, 0.456, 0.406</td></tr>" in summary
    assert f"<tr><th>hookcli</th><td>{hookcli.__version__}</td></tr>" in summary  # versions
    assert '<tr><th>shards</th><td><table class="inner"><tr><th>count</th><td>3</td></tr>' in summary


def test_long_lists_in_the_metadata_show_their_ends(tmp_path):
    inputs = [f"/photos/{n:03d}.jpg" for n in range(12)]
    features = Features({"x": np.zeros((12, 3), dtype=np.float32)}, {"inputs": json.dumps(inputs)})
    text = write_report(features, tmp_path / "r", GridOptions(), page_size=12).read_text()
    listed = re.search(r'<tr><th>inputs</th><td><ol class="inner" start="0">(.*?)</ol>', text).group(1)
    assert re.findall(r'<li value="(\d+)">([^<]*)</li>', listed) == [
        (str(n), f"/photos/{n:03d}.jpg") for n in (0, 1, 2, 3, 4, 10, 11)
    ]
    assert '<li class="more">… 5 more …</li>' in listed


# -- values ----------------------------------------------------------------------------------------


def _shown_values(article: str) -> tuple[dict, list]:
    header = re.search(r'<table class="stats"><tr>(.*?)</tr>', article).group(1)
    values = re.findall(r'<td data-value="([^"]+)">', re.search(r'<table class="stats">.*?</table>', article).group(0))
    stats = dict(zip(re.findall(r"<th>(.*?)</th>", header), map(float, values)))
    channels = re.findall(r'<tr><td>(\d+)</td><td data-value="([^"]+)">', article)
    return stats, [(int(i), float(mean)) for i, mean in channels]


def test_statistics_and_most_active_channels_are_numpys(tmp_path):
    rng = np.random.default_rng(7)
    maps = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    maps[0, 3] = 0.0
    maps[1, 2, 0, :3] = [np.nan, np.inf, -np.inf]
    maps[1, 5] = np.nan  # a channel without finite values is not listed
    tokens = rng.standard_normal((2, 10, 6)).astype(np.float32)
    features = Features({"maps": maps, "tokens": tokens}, {})
    index = write_report(features, tmp_path / "r", GridOptions(), page_size=2)
    articles = _sections(index, "article", "tensor")
    for key, number, channel_axis in (("maps", 0, 0), ("tokens", 1, 1)):
        for row in (0, 1):
            values = features.read(key, row).astype(np.float64)
            finite = values[np.isfinite(values)]
            stats, channels = _shown_values(articles[f"image-{row}-tensor-{number}"])
            expected = {
                "min": finite.min(),
                "mean": finite.mean(),
                "max": finite.max(),
                "zeros": np.count_nonzero(values == 0) / values.size,
            }
            if finite.size < values.size:
                expected["NaN/inf"] = values.size - finite.size
            assert stats == expected
            per_channel = np.moveaxis(values, channel_axis, 0).reshape(values.shape[channel_axis], -1)
            means = [(i, c[np.isfinite(c)].mean()) for i, c in enumerate(per_channel) if np.isfinite(c).any()]
            assert channels == sorted(means, key=lambda m: -m[1])[:5]
    stats, _ = _shown_values(articles["image-1-tensor-0"])
    assert stats["NaN/inf"] == 3 + 25


def test_targets_of_a_gradient_folder_are_shown_per_row(tmp_path, photo_path):
    out = hookcli.grad(
        "resnet18", "layer4", [photo_path, photo_path], output=f"{tmp_path}/g/", shard_size=1, target="top2", **SMALL
    )
    index = hookcli.report(out.parent, output=tmp_path / "r")
    sections = _sections(index, "section", "image")
    for row in (0, 1):
        with open_features(out.parent / f"features-{row:05d}.safetensors") as shard:
            [targets] = json.loads(shard.metadata["targets"])
        shown = re.findall(
            r"<tr><td>(\d)</td><td>(\d+)</td><td>-</td><td>([-\d.]+)</td><td>([\d.]+)%</td></tr>",
            sections[f"image-{row}"],
        )
        assert shown == [
            (str(k + 1), str(t["class"]), f"{t['logit']:.2f}", f"{t['probability'] * 100:.1f}")
            for k, t in enumerate(targets)
        ]
        second = targets[1]["class"]
        assert (
            f"F32, [512,2,2] per image · gradient of the target logit with respect to &#x27;layer4&#x27;, "
            f"for target 2: class {second}</p>"
        ) in sections[f"image-{row}"]


def _table_cells(text: str, css: str) -> list[list[str]]:
    """The text of each cell of the first ``<table class="css">``, row by row, headings first."""
    table = re.search(rf'<table class="{css}">(.*?)</table>', text, flags=re.S).group(1)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]


def test_a_segmentations_targets_show_each_class_mask_its_pixels_and_share(tmp_path, photo_path):
    out = hookcli.grad(
        "lraspp_mobilenet_v3_large",
        "backbone.12",
        photo_path,
        weights="none",
        resize=32,
        target="top2",
        output=tmp_path / "s.safetensors",
    )
    with open_features(out) as features:
        [targets] = json.loads(features.metadata["targets"])
    text = hookcli.report(out, output=tmp_path / "r").read_text()
    assert _table_cells(text, "targets segmentation") == [
        ["target", "class", "name", "pixels", "share", "score"],
        *(
            [
                str(k + 1),
                str(t["class"]),
                "-",
                f"{t['pixels']:,}",
                f"{t['pixels'] / (32 * 37):.1%}",
                f"{t['score']:.4g}",
            ]
            for k, t in enumerate(targets)
        ),
    ]  # the photo (512 x 600) resized to 32 x 37
    assert "gradient of the target score with respect to &#x27;backbone.12&#x27;, for target 2" in text


def test_a_detection_models_targets_show_each_detection_its_label_score_and_box(tmp_path):
    targets = [
        [
            {"detection": 4, "class": 3, "name": "car", "score": 0.75, "box": [1.0, 2.25, 30.0, 40.5]},
            {"detection": None, "class": None, "name": None, "score": None, "box": None},
        ]
    ]
    metadata = {"family": "detection", "target": "top2", "targets": json.dumps(targets)}
    features = Features({"x@grad#0": np.ones((1, 3), np.float32), "x@grad#1": np.ones((1, 3), np.float32)}, metadata)
    text = write_report(features, tmp_path / "r", GridOptions()).read_text()
    assert _table_cells(text, "targets detection") == [
        ["target", "detection", "label", "name", "score", "x1", "y1", "x2", "y2"],
        ["1", "#4", "3", "car", "0.750", "1.0", "2.2", "30.0", "40.5"],
        ["2", "none", "-", "-", "-", "-", "-", "-", "-"],
    ]
    assert (
        "gradient of the target score with respect to &#x27;x&#x27;, for target 1: detection #4, car (class 3)" in text
    )
    assert "for target 2: no such detection</p>" in text


def test_cams_are_drawn_over_the_photo_and_without_it_when_it_is_gone(tmp_path, photo_path):
    photo = tmp_path / "hopper.jpg"
    shutil.copy(photo_path, photo)
    cams = hookcli.cam("resnet18", photo, output=tmp_path / "cams", target="top2", **SMALL)
    index = hookcli.report(cams, output=tmp_path / "r")
    articles = _sections(index, "article", "tensor")
    assert list(articles) == ["image-0-tensor-0", "image-0-tensor-1"]
    with open_features(cams) as features:
        [first, second] = json.loads(features.metadata["targets"])[0]
    assert (
        f"F32, [2,2] per image · class-activation map (gradcam at &#x27;layer4&#x27;), for target 1: "
        f"class {first['class']}"
    ) in articles["image-0-tensor-0"]
    [over_photo] = _pictures(articles["image-0-tensor-0"])
    assert len(np.unique(over_photo.reshape(-1, 3), axis=0)) > 2000  # a photo, not a 2x2 map

    photo.unlink()
    events = []
    index = hookcli.report(cams, output=tmp_path / "r2", progress=events.append)
    assert [e for e in events if isinstance(e, Note)] == [
        Note(
            "images whose photo cannot be read are shown without it (no thumbnail, CAMs as plain maps), first image "
            f"0: image not found: '{photo}'"
        )
    ]
    [plain] = _pictures(_sections(index, "article", "tensor")["image-0-tensor-0"])
    assert len(np.unique(plain.reshape(-1, 3), axis=0)) < len(np.unique(over_photo.reshape(-1, 3), axis=0))


def test_targets_that_are_not_one_list_per_image_are_left_out_with_a_note(tmp_path):
    metadata = {"target": "top1", "targets": json.dumps([[{"class": 3}]])}  # one entry for two rows
    features = Features({"x@grad": np.ones((2, 3), dtype=np.float32)}, metadata, name="odd")
    events = []
    text = write_report(features, tmp_path / "r", GridOptions(), progress=events.append).read_text()
    assert [e for e in events if isinstance(e, Note)] == [
        Note("'odd' has targets that are not one list of objects per image; they are left out")
    ]
    assert '<table class="targets' not in text
    assert "F32, [3] per image · gradient of the target logit with respect to &#x27;x&#x27;</p>" in text


# -- selection, escaping, refusals -----------------------------------------------------------------


def test_images_by_index_name_and_range_are_shown_in_file_order(folder, tmp_path):
    index = hookcli.report(folder, output=tmp_path / "r", images=["5", "0:2", "-1"], page_size=2)
    pages = [index.parent / page_name(n) for n in (1, 2)]
    assert [list(_sections(p, "section", "image")) for p in pages] == [["image-0", "image-1"], ["image-5", "image-6"]]
    assert "<tr><th>images (rows)</th><td>7, 4 of them shown</td></tr>" in index.read_text()
    index = hookcli.report(folder, output=tmp_path / "n", images=["noise1.png", "4:"])
    assert list(_sections(index, "section", "image")) == ["image-2", "image-4", "image-5", "image-6"]
    index = hookcli.report(folder, output=tmp_path / "past", images="5:100")  # a range past the end is cut to it
    assert list(_sections(index, "section", "image")) == ["image-5", "image-6"]


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"keys": "nope"},
            "no tensor 'nope' in '{folder}' (closest: logits, layer1). Hint: 'hookcli info' lists the keys",
        ),
        (
            {"images": "9"},
            "image index 9 is out of range: the file has 7 images. Hint: use 0 to 6, or an input file name",
        ),
        (
            {"images": "cat.jpg"},
            "no image named 'cat.jpg' in the file. Hint: give a row index, a range A:B or an input's "
            "file name ('hookcli info' lists them)",
        ),
        (
            {"images": "9:12"},
            "image range '9:12' selects no images: the file has 7 images. Hint: A:B takes rows A to "
            "B-1, as a Python slice does; the rows are 0 to 6",
        ),
        (
            {"images": "5:2"},
            "image range '5:2' selects no images: the file has 7 images. Hint: A:B takes rows A to B-1, "
            "as a Python slice does; the rows are 0 to 6",
        ),
        (
            {"page_size": 0},
            "page_size must be a whole number of at least 1, not 0. Hint: see --help for the values each option takes",
        ),
    ],
)
def test_bad_selections_are_refused_as_grid_refuses_them(folder, tmp_path, options, message):
    with pytest.raises(UsageProblem) as caught:
        hookcli.report(folder, output=tmp_path / "r", **options)
    assert str(caught.value) == message.format(folder=folder)
    assert not (tmp_path / "r").exists()


def test_a_report_needs_a_folder(folder):
    with pytest.raises(UsageProblem) as caught:
        hookcli.report(folder, output=None)
    assert str(caught.value) == (
        "a report is a folder of pages and has no in-memory form. Hint: give output a "
        "folder, or leave it out for <file stem>_report"
    )


def test_an_empty_file_and_a_file_without_tensors_are_refused(tmp_path):
    (tmp_path / "empty.safetensors").write_bytes(b"")
    write_safetensors({}, {"format": "1"}, tmp_path / "none.safetensors")
    for name, message in (
        ("empty", "'{}' is empty. Hint: it holds no safetensors data"),
        ("none", "'{}' holds no tensors. Hint: 'hookcli info' shows what it holds"),
    ):
        source = tmp_path / f"{name}.safetensors"
        with pytest.raises(FeatureFileError) as caught:
            hookcli.report(source, output=tmp_path / "r")
        assert str(caught.value) == message.format(source)


def test_an_existing_report_is_refused_unless_forced(folder, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "index.html").write_text("mine")
    with pytest.raises(OutputExistsError) as caught:
        hookcli.report(folder, output=out, page_size=3)
    assert str(caught.value) == (
        f"'{out / 'index.html'}' already exists. Hint: add --force to overwrite, or choose another folder with -o"
    )
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]
    hookcli.report(folder, output=out, page_size=3, force=True)
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "page-00002.html", "page-00003.html"]


HOSTILE = "<script>alert('x')</script>"
HOSTILE_NAME = "<svg onload=alert('x')>"  # a file name has no slash


def test_names_keys_and_metadata_from_the_file_are_escaped(tmp_path):
    inputs = [f"/photos/{HOSTILE}/{HOSTILE_NAME}.jpg", "/photos/\x1b[31mred\n.jpg"]
    metadata = {
        "inputs": json.dumps(inputs),
        "model": HOSTILE,
        "layers": json.dumps({HOSTILE: {"key": HOSTILE}}),
        HOSTILE: '<img src="x" onerror="alert(1)">',
        "note": '["lone \\ud800 surrogate"]',
    }  # JSON: the escape
    path = tmp_path / "hostile.safetensors"
    write_safetensors({HOSTILE: torch.ones(2, 3, 4, 4), "plain": torch.zeros(2, 5)}, metadata, path)
    text = hookcli.report(path, output=tmp_path / "r").read_text(encoding="utf-8")
    assert "<script" not in text and "<svg" not in text and '<img src="x"' not in text and "\x1b" not in text
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    escaped_name = "&lt;svg onload=alert(&#x27;x&#x27;)&gt;"
    assert f"<h2>Image 0: {escaped_name}.jpg</h2>" in text
    assert f'<p class="path">/photos/{escaped}/{escaped_name}.jpg</p>' in text
    assert f"<h3>{escaped}</h3>" in text and f'<a href="#image-0-tensor-0">{escaped}</a>' in text
    assert f"<tr><th>model</th><td>{escaped}</td></tr>" in text
    assert f"<tr><th>{escaped}</th><td>&lt;img src=&quot;x&quot; onerror=&quot;alert(1)&quot;&gt;</td></tr>" in text
    assert "<h2>Image 1: \\x1b[31mred\\n.jpg</h2>" in text
    assert '<tr><th>note</th><td><ol class="inner" start="0"><li value="0">lone \\ud800 surrogate</li></ol>' in text


# -- the command line ------------------------------------------------------------------------------


def test_the_command_prints_index_html_and_notes(runner, folder, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    (partial / "features-00002.safetensors").unlink()
    result = runner.invoke(
        main, ["report", str(partial), "-o", str(tmp_path / "r"), "--page-size", "3", "-k", "layer1", "--top", "4"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'r' / 'index.html'}\n"
    assert result.stderr == (
        f"Note: '{partial}' holds 6 of its 7 inputs; run the same extract command again to complete it\n"
    )
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["index.html", "page-00002.html"]
    assert len(_pictures((tmp_path / "r" / "page-00002.html").read_text())) == 6  # a thumbnail and layer1, 3 times

    odd = tmp_path / "odd.safetensors"
    write_safetensors({"odd": torch.ones(1, 2, 2, 2, 2, 2), "ok": torch.ones(1, 3)}, {}, odd)
    result = runner.invoke(main, ["report", str(odd), "-o", str(tmp_path / "o")])
    assert (result.exit_code, result.stdout) == (0, f"{tmp_path / 'o' / 'index.html'}\n")
    assert result.stderr == "Note: skipped 'odd' (shape [1, 2, 2, 2, 2, 2]): 5 dimensions per image\n"
    assert (
        "<li>skipped &#x27;odd&#x27; (shape [1, 2, 2, 2, 2, 2]): 5 dimensions per image</li>"
        in (tmp_path / "o" / "index.html").read_text()
    )


def test_the_command_reads_stdin_into_report_and_refuses_to_overwrite(runner, folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = (folder / "features-00001.safetensors").read_bytes()
    result = runner.invoke(main, ["report", "-", "-i", "1"], input=data)
    assert (result.exit_code, result.stdout) == (0, "report/index.html\n"), result.output
    assert list(_sections(Path("report/index.html"), "section", "image")) == ["image-1"]
    result = runner.invoke(main, ["report", "-"], input=data)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "Error: 'report/index.html' already exists. Hint: add --force to overwrite, or choose another folder with -o\n"
    )
    result = runner.invoke(main, ["report", str(folder), "-k", "nope"])
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: no tensor 'nope' in '{folder}' (closest: logits, layer1). Hint: 'hookcli info' lists the keys\n"
    )
    result = runner.invoke(main, ["report", str(folder)])
    assert (result.exit_code, result.stdout) == (0, "feats_report/index.html\n")


def test_the_help_names_the_default_page_size(runner):
    result = runner.invoke(main, ["report", "--help"])
    assert f"Images (rows) per page. [{DEFAULT_PAGE_SIZE}]" in " ".join(result.stdout.split())
    assert "-i, --image INDEX|NAME|A:B" in result.stdout


# -- in a browser ----------------------------------------------------------------------------------


def test_the_pages_render_in_a_browser(folder, tmp_path, browser):
    from selenium.webdriver.common.by import By

    index = hookcli.report(folder, output=tmp_path / "r", page_size=3)
    browser.get(index.as_uri())
    assert browser.title == f"{folder} · hookcli report · page 1 of 3"
    assert browser.find_element(By.TAG_NAME, "h1").text == f"hookcli report: {folder}"
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "section.image > h2")]
    assert headings == ["Image 0: grace_hopper.jpg", "Image 1: noise0.png", "Image 2: noise1.png"]
    pictures = browser.execute_script(
        "return [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight]);"
    )
    assert len(pictures) == 9 and all(complete and width > 0 and height > 0 for complete, width, height in pictures)
    pixels = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB"))
    assert (pixels != 255).any(axis=2).mean() > 0.05  # text and tables, not a blank page
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50

    browser.find_element(By.CSS_SELECTOR, "header a[rel=next]").click()
    assert browser.current_url == (index.parent / "page-00002.html").as_uri()
    assert browser.title == f"{folder} · hookcli report · page 2 of 3"
    assert len(browser.find_elements(By.CSS_SELECTOR, "section.image")) == 3
    complete = browser.execute_script("return [...document.images].every(i => i.complete && i.naturalWidth > 0);")
    assert complete and len(browser.find_elements(By.TAG_NAME, "img")) == 9
    browser.find_element(By.CSS_SELECTOR, "#contents a[href='#image-4-tensor-1']").click()
    assert browser.current_url.endswith("page-00002.html#image-4-tensor-1")
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == []


def test_the_link_to_the_files_tensors_and_metadata_opens_their_collapsed_section(folder, tmp_path, browser):
    from selenium.webdriver.common.by import By

    index = hookcli.report(folder, output=tmp_path / "r", page_size=3)
    for arrive in ("the link", "the address", "the link again"):
        if arrive == "the address":
            browser.get(index.as_uri() + "#file")
        else:
            if arrive == "the link":
                browser.get(index.as_uri())
            else:  # closed again by hand, then the same link: the address does not change
                browser.execute_script("document.querySelector('details.about').open = false; scrollTo(0, 0)")
            browser.find_element(By.CSS_SELECTOR, "#summary a[href='#file']").click()
        details = browser.find_element(By.CSS_SELECTOR, "details.about")
        assert details.get_attribute("open") is not None, arrive
        assert browser.find_element(By.CSS_SELECTOR, "table.tensors").is_displayed(), arrive
        top = browser.execute_script("return document.getElementById('file').getBoundingClientRect().top")
        assert 0 < top < 100, arrive  # scrolled to it, under its summary line


def test_a_report_that_fails_part_way_leaves_no_pages_and_no_folder(folder, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    shard = sorted(damaged.glob("features-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(hookcli.HookcliError) as caught:
        hookcli.report(damaged, output=tmp_path / "r", page_size=2)
    assert str(caught.value) == (
        f"'{shard}' is not a safetensors file. Hint: its first 8 bytes do not give a header length that fits the file"
    )
    assert not (tmp_path / "r").exists()


def test_a_section_opens_with_the_photo_as_the_model_saw_it_its_predictions_and_targets(tmp_path, photo_path):
    names = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead"]
    logits = np.array([[0.1, 3.0, -1.0, 2.0, np.nan]], dtype=np.float32)
    preprocess = {"resize": 64, "crop": 48, "kind": "classification"}
    targets = [[{"class": 1, "name": "goldfish", "logit": 3.0, "probability": 0.6}]]
    metadata = {
        "categories": json.dumps(names),
        "inputs": json.dumps([str(photo_path)]),
        "preprocess": json.dumps(preprocess),
        "target": "top1",
        "targets": json.dumps(targets),
    }
    tensors = {"layer": np.ones((1, 4, 3, 3), np.float32), "fc": logits, "fc@grad": np.ones((1, 5), np.float32)}
    reads = []
    write_report(_Recording(Features(tensors, metadata), reads), tmp_path / "r", GridOptions())
    assert sorted(reads) == [("fc", 0, None), ("fc@grad", 0, None), ("layer", 0, None)]  # the logits once
    section = _sections(tmp_path / "r" / "index.html", "section", "image")["image-0"]
    order = re.findall(r'<(figure class="thumbnail"|table class="\w+[^"]*"|article class="tensor" id="[^"]+")', section)
    assert order == [
        'figure class="thumbnail"',
        'table class="predictions"',
        'table class="targets classification"',
        'article class="tensor" id="image-0-tensor-0"',  # fc
        'table class="stats"',  # its highest outputs are the predictions above, not listed again
        'article class="tensor" id="image-0-tensor-1"',  # fc@grad
        'table class="stats"',
        'table class="channels"',
        'article class="tensor" id="image-0-tensor-2"',  # layer
        'table class="stats"',
        'table class="channels"',
    ]
    gradient = re.search(r'id="image-0-tensor-1">.*?</article>', section, flags=re.S).group(0)
    assert "<tr><th>channel</th><th>class</th><th>mean</th></tr><tr><td>0</td><td>tench</td>" in gradient
    overview = re.search(r'<div class="overview">(.*?)</div>', section, flags=re.S).group(1)
    [thumbnail, *_] = _pictures(overview)
    assert np.array_equal(thumbnail, model_thumbnail(photo_path, Preprocess(**preprocess)))
    assert thumbnail.shape == (192, 192, 3) and "<figcaption>as the model saw it</figcaption>" in overview
    finite = np.exp(logits[0, :4].astype(np.float64) - 3.0)
    shown = re.findall(
        r'<tr><td>(\d)</td><td>([a-z ]+)</td><td data-value="([^"]+)">[^<]*</td><td data-value="([^"]+)">', overview
    )
    assert [(int(c), name, float(logit), float(p)) for c, name, logit, p in shown] == [
        (c, names[c], float(logits[0, c]), finite[c] / finite.sum()) for c in (1, 3, 0, 2)
    ]  # the NaN output is left out
    assert "<caption>Predictions: the highest outputs of fc</caption>" in overview
    assert "<tr><td>1</td><td>1</td><td>goldfish</td><td>3.00</td><td>60.0%</td></tr>" in overview


# -- detections ------------------------------------------------------------------------------------


def _overlaps(rects) -> list[tuple[int, int]]:
    """The pairs of ``(x, y, x2, y2)`` rectangles that share a pixel."""
    return [
        (i, j)
        for i, (a, b, c, d) in enumerate(rects)
        for j, (e, f, g, h) in enumerate(rects[:i])
        if a < g and e < c and b < h and f < d
    ]


def test_tabs_cover_no_other_tab_and_are_left_out_only_where_every_corner_would():
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 560, (100, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(20, 200, (100, 2))], axis=1)
    places = place_tabs(boxes, [(60, 20)] * 100, 640, 480)
    placed = [(x, y, x + 60, y + 20) for x, y in filter(None, places)]
    assert _overlaps(placed) == [] and all(
        0 <= x and x + 60 <= 640 and 0 <= y and y + 20 <= 480 for x, y, _, _ in placed
    )
    x1, y1 = (round(v) for v in boxes[-1, :2])
    assert places[-1] == (x1, y1 - 20)  # the last (the best) takes its first choice: above its top-left corner
    left_out = [i for i, place in enumerate(places) if place is None]
    assert 10 < len(left_out) < 90
    for i in left_out:  # each corner it could take covers a placed tab
        x1, y1, x2, y2 = (round(v) for v in boxes[i])
        for x, y in [(x1, y1), (x2 - 60, y1), (x1, y2 - 20)]:
            x, y = min(max(x, 0), 580), min(max(y, 0), 460)
            assert _overlaps([*placed, (x, y, x + 60, y + 20)])  # the placed tabs alone cover none of each other


def test_a_report_of_a_hundred_boxes_labels_the_best_and_says_how_many_are_not(tmp_path, photo_path, monkeypatch):
    import hookcli.pictures.boxes
    import hookcli.pictures.drawing

    rng = np.random.default_rng(1)
    corners = rng.uniform(0, 450, (100, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(30, 250, (100, 2))], axis=1).astype(np.float32)
    boxes[0] = [100.0, 150.0, 300.0, 400.0]
    labels = rng.integers(1, 91, 100)
    tensors = {
        "detections#boxes": boxes[None],
        "detections#labels": labels[None],
        "detections#scores": np.linspace(0.99, 0.05, 100, dtype=np.float32)[None],  # best first, as torchvision's
    }
    metadata = {
        "family": "detection",
        "preprocess": json.dumps({"resize": None, "crop": None, "kind": "detection"}),
        "inputs": json.dumps([str(photo_path)]),
    }
    placed, captions = [], []

    def place_tabs_kept(boxes, sizes, width, height):
        places = place_tabs(boxes, sizes, width, height)
        placed.extend((x, y, x + w, y + h) for place, (w, h) in zip(places, sizes) if place for x, y in [place])
        return places

    monkeypatch.setattr(hookcli.pictures.boxes, "place_tabs", place_tabs_kept)
    monkeypatch.setattr(hookcli.pictures.drawing, "add_title", lambda pixels, parts: captions.append(parts) or pixels)
    text = hookcli.report(Features(tensors, metadata), output=tmp_path / "r").read_text()
    labelled = len(placed)
    assert _overlaps(placed) == [] and 20 < labelled < 100
    assert captions == [
        [
            "detections",
            "grace_hopper.jpg",
            "100 detections",
            f"label (class index) and score on {labelled} boxes",
            f"{100 - labelled} unlabelled, where their labels would cover those of higher-scoring ones",
        ]
    ]
    [detections] = re.findall(r'<article class="detections".*?</article>', text, flags=re.S)
    [pixels] = _pictures(detections)
    assert pixels.shape == (1200, 1024, 3)  # the photo (512 x 600) enlarged twice, under no caption (patched out)
    x1, y1 = 200, 300
    colour = list(BOX_COLOURS[int(labels[0]) % 10])
    assert pixels[y1 - 1, x1 + 1].tolist() == colour  # the best box's tab, above its corner
    assert pixels[y1 + 1, x1 + 1].tolist() == colour  # and its line


def test_a_detection_cam_is_drawn_with_the_box_of_the_detection_it_explains(tmp_path, photo_path):
    heat = np.zeros((1, 12, 10), dtype=np.float32)
    heat[0, 3:6, 2:5] = 1.0
    box = [100.0, 150.0, 300.0, 400.0]  # in pixels of the photo as given (512 x 600)
    targets = [[{"detection": 4, "class": 3, "name": "car", "score": 0.75, "box": box}]]
    metadata = {
        "family": "detection",
        "cam_layer": "backbone.body.16",
        "method": "gradcam",
        "target": "top1",
        "targets": json.dumps(targets),
        "preprocess": json.dumps({"resize": None, "crop": None, "kind": "detection"}),
        "inputs": json.dumps([str(photo_path)]),
    }
    text = write_report(Features({"cam": heat}, metadata), tmp_path / "r", GridOptions()).read_text()
    [pixels] = _pictures(_sections(tmp_path / "r" / "index.html", "article", "tensor")["image-0-tensor-0"])
    cyan = np.argwhere((pixels == (0, 255, 255)).all(axis=2))
    top, left = cyan.min(axis=0)
    bottom, right = cyan.max(axis=0)
    assert (left, right - left, bottom - top) == (200, 400, 500)  # the box, on the photo enlarged twice (1024 wide)
    assert pixels.shape[1] == 1024
    assert (
        "class-activation map (gradcam at &#x27;backbone.body.16&#x27;), for target 1: detection #4, car (class 3)"
        in text
    )
