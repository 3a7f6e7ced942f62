"""Comparison files (hookcli compare) read back: the checks a crafted file meets before anything is drawn or
printed, the heatmap grid draws, the page report writes and what info says."""

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import hookcli
from hookcli.cli import main
from hookcli.errors import FeatureFileError
from hookcli.pictures.compare_grids import DIVERGING, UNDEFINED_COLOR
from hookcli.pictures.html import CONTENT_SECURITY_POLICY
from hookcli.pictures.render import colorize
from hookcli.pictures.text import text_bitmap
from hookcli.storage.compare_file import read_comparison
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features

SMALL = {"weights": "none", "resize": 64, "crop": 64}
#: The heatmap's cells are this many pixels a side for up to five representations (480 // 5 = 96).
CELL = 96
#: The labels' type size in the heatmap.
LABEL_SIZE = 13


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> list[Path]:
    """Eight random crops of the photo of Grace Hopper."""
    import matplotlib.cbook

    where = tmp_path_factory.mktemp("crops")
    photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    rng = np.random.default_rng(0)
    paths = []
    for number in range(8):
        side = int(rng.integers(120, 400))
        x, y = int(rng.integers(0, photo.width - side)), int(rng.integers(0, photo.height - side))
        paths.append(where / f"crop{number}.png")
        photo.crop((x, y, x + side, y + side)).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory, crops) -> Path:
    """Linear CKA of resnet18's four stages with themselves over the crops."""
    path = tmp_path_factory.mktemp("resnet") / "cka.safetensors"
    layers = ["layer1", "layer2", "layer3", "layer4"]
    return hookcli.compare("resnet18", layers, crops, output=path, **SMALL)


def _saved() -> Features:
    """Twenty rows of three representations: ``a``, ``b`` (much like ``a``) and ``flat`` (every row alike)."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(20, 8, 3, 3)).astype("float32")
    tensors = {"a": a, "b": a + 0.5 * rng.normal(size=a.shape).astype("float32"), "flat": np.ones((20, 5), "float32")}
    return Features(tensors, {"inputs": json.dumps([f"/photos/{n:03d}.jpg" for n in range(20)])})


@pytest.fixture(scope="module")
def cka_file(tmp_path_factory) -> Path:
    """Linear CKA of the saved representations with themselves: ``flat`` is undefined."""
    return hookcli.compare(features=_saved(), output=tmp_path_factory.mktemp("cka") / "cka.safetensors")


@pytest.fixture(scope="module")
def rsa_file(tmp_path_factory) -> Path:
    """RSA of ``a`` and ``b`` with themselves, their RDMs kept."""
    path = tmp_path_factory.mktemp("rsa") / "rsa.safetensors"
    return hookcli.compare(features=_saved(), keys=["a", "b"], method="rsa", save_rdms=True, output=path)


DAMAGED = "'crafted.safetensors' is a damaged comparison file"
REWRITE = "Hint: write it again with hookcli compare"
OTHER_FORMAT = "Hint: read it with the hookcli that wrote it, or compare again with hookcli compare"
STATE = "linear-cka@count, @widths, @mean and @comoment"

CRAFTED = {
    "format 4": (
        "cka",
        lambda tensors, metadata: metadata.update(format="4"),
        f"'crafted.safetensors' is a comparison file that is of format \"4\", and this hookcli reads format 5. "
        f"{OTHER_FORMAT}",
    ),
    "no format": (
        "cka",
        lambda tensors, metadata: metadata.pop("format"),
        f"'crafted.safetensors' is a comparison file that gives no format, and this hookcli reads format 5. "
        f"{OTHER_FORMAT}",
    ),
    "an unknown method": (
        "cka",
        lambda tensors, metadata: metadata.update(method="cca"),
        f'{DAMAGED}: its method "cca" is not one of linear-cka, minibatch-cka, rsa. {REWRITE}',
    ),
    "rows not JSON": (
        "cka",
        lambda tensors, metadata: metadata.update(rows='["a", "b"'),
        f"{DAMAGED}: its 'rows' metadata is not a list of labels. {REWRITE}",
    ),
    "rows of numbers": (
        "cka",
        lambda tensors, metadata: metadata.update(rows="[1, 2, 3]"),
        f"{DAMAGED}: its 'rows' metadata is not a list of labels. {REWRITE}",
    ),
    "no columns": (
        "cka",
        lambda tensors, metadata: metadata.pop("columns"),
        f"{DAMAGED}: it has no 'columns' metadata. {REWRITE}",
    ),
    "a label twice": (
        "cka",
        lambda tensors, metadata: metadata.update(columns='["a", "b", "a"]'),
        f"{DAMAGED}: its 'columns' metadata names \"a\" twice. {REWRITE}",
    ),
    "labels that do not fit the matrix": (
        "cka",
        lambda tensors, metadata: metadata.update(rows='["a", "flat"]', columns='["a", "flat"]'),
        f"{DAMAGED}: 'linear-cka' is F64 [3, 3], not F64 [2, 2] (2 rows, 2 columns). {REWRITE}",
    ),
    "one side with itself and other columns": (
        "cka",
        lambda tensors, metadata: metadata.update(columns='["a", "b", "c"]'),
        f"{DAMAGED}: it compares one side with itself ('same'), and its rows and columns differ. {REWRITE}",
    ),
    "same that is not a bool": (
        "cka",
        lambda tensors, metadata: metadata.update(same='"yes"'),
        f"{DAMAGED}: its 'same' metadata is not true or false. {REWRITE}",
    ),
    "settings that are a list": (
        "cka",
        lambda tensors, metadata: metadata.update(settings='["avg"]'),
        f"{DAMAGED}: its 'settings' metadata is not an object of the method's settings. {REWRITE}",
    ),
    "no inputs": (
        "cka",
        lambda tensors, metadata: metadata.pop("inputs"),
        f"{DAMAGED}: it has no 'inputs' metadata. {REWRITE}",
    ),
    "an undefined label that is not there": (
        "cka",
        lambda tensors, metadata: metadata.update(undefined='["flat", "gone"]'),
        f"{DAMAGED}: its 'undefined' metadata names \"gone\", which is neither a row nor a column. {REWRITE}",
    ),
    "the matrix in float32": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka": tensors["linear-cka"].astype(np.float32)}),
        f"{DAMAGED}: 'linear-cka' is F32 [3, 3], not F64 [3, 3] (3 rows, 3 columns). {REWRITE}",
    ),
    "no matrix": (
        "cka",
        lambda tensors, metadata: tensors.pop("linear-cka"),
        f"{DAMAGED}: 'linear-cka' is missing. {REWRITE}",
    ),
    "a tensor of its own": (
        "cka",
        lambda tensors, metadata: tensors.update(extra=np.zeros(2)),
        f"{DAMAGED}: 'extra' is not a tensor that linear-cka keeps (the matrix 'linear-cka' and its sums, {STATE}). "
        f"{REWRITE}",
    ),
    "a sum missing": (
        "cka",
        lambda tensors, metadata: tensors.pop("linear-cka@mean"),
        f"{DAMAGED}: 'linear-cka@mean' is missing. {REWRITE}",
    ),
    "a negative count": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@count": np.array(-3, dtype=np.int64)}),
        f"{DAMAGED}: 'linear-cka@count' is -3, and a count is never negative. {REWRITE}",
    ),
    "a count that is not whole": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@count": tensors["linear-cka@count"].astype(np.float64)}),
        f"{DAMAGED}: 'linear-cka@count' is F64 [], not I64 [] (the rows seen). {REWRITE}",
    ),
    "widths that do not add up": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@widths": np.array([8, 8, 4], dtype=np.int64)}),
        f"{DAMAGED}: 'linear-cka@widths' gives widths [8, 8, 4], which do not add up to the 21 means of "
        f"'linear-cka@mean'. {REWRITE}",
    ),
    "a width too few": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@widths": tensors["linear-cka@widths"][:2]}),
        f"{DAMAGED}: 'linear-cka@widths' is I64 [2], not I64 [3] (the width of each of 3 representations). {REWRITE}",
    ),
    "means of two axes": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@mean": tensors["linear-cka@mean"][:, None]}),
        f"{DAMAGED}: 'linear-cka@mean' is F64 [21, 1], not F64 [D] (every column's mean, one after the other). "
        f"{REWRITE}",
    ),
    "co-moments of a column too few": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@comoment": tensors["linear-cka@comoment"][:, :20]}),
        f"{DAMAGED}: 'linear-cka@comoment' is F64 [21, 20], not F64 [21, 21] (the co-moments of the 21 columns of "
        f"'linear-cka@mean'). {REWRITE}",
    ),
    "sums of more columns than linear CKA keeps": (
        "cka",
        lambda tensors, metadata: tensors.update({"linear-cka@mean": np.zeros(16_385)}),
        f"{DAMAGED}: 'linear-cka@mean' has 16,385 columns, more than linear CKA keeps sums of (16,384). {REWRITE}",
    ),
    "sums in a minibatch file": (
        "cka",
        lambda tensors, metadata: (
            metadata.update(method="minibatch-cka"),
            tensors.update({"minibatch-cka": tensors.pop("linear-cka")}),
        ),
        f"{DAMAGED}: 'linear-cka@comoment' is not a tensor that minibatch-cka keeps (the matrix 'minibatch-cka'). "
        f"{REWRITE}",
    ),
    "an RDM that is not square": (
        "rsa",
        lambda tensors, metadata: tensors.update({"rdm@a": tensors["rdm@a"][:, :19]}),
        f"{DAMAGED}: 'rdm@a' is F32 [20, 19], not a square F32 matrix (an RDM: an input a row and a column). {REWRITE}",
    ),
    "an RDM in float64": (
        "rsa",
        lambda tensors, metadata: tensors.update({"rdm@b": tensors["rdm@b"].astype(np.float64)}),
        f"{DAMAGED}: 'rdm@b' is F64 [20, 20], not a square F32 matrix (an RDM: an input a row and a column). {REWRITE}",
    ),
    "an RDM of no representation": (
        "rsa",
        lambda tensors, metadata: tensors.update({"rdm@gone": tensors["rdm@a"]}),
        f"{DAMAGED}: 'rdm@gone' is not a tensor that rsa keeps (the matrix 'rsa' and the RDMs of its labels, "
        f"rdm@<label>). {REWRITE}",
    ),
}


@pytest.mark.parametrize("command", ["info", "grid", "report"])
@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_comparison_file_is_refused_with_one_line_naming_what_is_wrong(
    runner, cka_file, rsa_file, tmp_path, monkeypatch, crafted_copy, command, case
):
    source, change, message = CRAFTED[case]
    monkeypatch.chdir(tmp_path)
    crafted_copy({"cka": cka_file, "rsa": rsa_file}[source], tmp_path / "crafted.safetensors", change)
    result = runner.invoke(main, [command, "crafted.safetensors", "-o", "out"][: 2 if command == "info" else 4])
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
    assert result.stdout == "" and not (tmp_path / "out").exists()


def test_genuine_comparison_files_pass_their_checks(resnet_file, cka_file, rsa_file, crops):
    with open_features(resnet_file) as features:
        found = read_comparison(features)
        assert (found.method, found.rows, found.same, found.undefined) == (
            "linear-cka",
            ["layer1", "layer2", "layer3", "layer4"],
            True,
            [],
        )
        assert found.inputs == [str(path) for path in crops] and found.sources() == ("resnet18", "resnet18")
        np.testing.assert_allclose(found.matrix().diagonal(), 1.0, rtol=1e-12)
    with open_features(cka_file) as features:
        assert read_comparison(features).undefined == ["flat"]
    with open_features(rsa_file) as features:
        found = read_comparison(features)
        assert (found.method, found.columns, found.settings["ranking"]) == ("rsa", ["a", "b"], "spearman")
    in_memory = read_comparison(hookcli.compare(features=_saved(), keys=["a"], keys2=["b"], method="minibatch-cka"))
    assert (in_memory.rows, in_memory.columns, in_memory.same) == (["a"], ["b"], False)


def test_a_file_that_does_not_say_it_compares_is_not_read_as_a_comparison(cka_file, tmp_path, crafted_copy):
    path = crafted_copy(cka_file, tmp_path / "x.safetensors", lambda tensors, metadata: metadata.pop("kind"))
    with open_features(path) as features, pytest.raises(FeatureFileError) as caught:
        read_comparison(features)
    assert str(caught.value) == f"'{path}' is not a comparison file. Hint: hookcli compare writes them"


# -- grid ------------------------------------------------------------------------------------------


def _find(pixels: np.ndarray, mark: np.ndarray) -> list[tuple[int, int]]:
    """Where text of coverage ``mark`` is inked in black on white in ``pixels`` (top-left corners)."""
    gray = pixels.min(axis=2)
    expected = 255 - mark
    darkest = np.unravel_index(np.argmin(expected), expected.shape)
    found = []
    for y, x in np.argwhere(gray == expected[darkest]):
        top, left = y - darkest[0], x - darkest[1]
        if top < 0 or left < 0:
            continue
        window = gray[top : top + mark.shape[0], left : left + mark.shape[1]]
        if window.shape == mark.shape and np.array_equal(window, expected):
            found.append((int(top), int(left)))
    return found


def test_grid_draws_resnet18_against_itself_as_a_bright_diagonal(runner, resnet_file, tmp_path):
    result = runner.invoke(main, ["grid", str(resnet_file), "-o", str(tmp_path / "g")])
    assert result.exit_code == 0 and result.stdout == f"{tmp_path / 'g' / 'cka.png'}\n", result.output
    pixels = np.asarray(Image.open(tmp_path / "g" / "cka.png").convert("RGB"))
    top = colorize(np.array([1.0]), "viridis")[0]
    ys, xs = np.nonzero((pixels == top).all(axis=2))
    ys, xs = ys[ys < ys.min() + 4 * CELL], xs[ys < ys.min() + 4 * CELL]  # the colour bar's end is below
    assert {((y - ys.min()) // CELL, (x - xs.min()) // CELL) for y, x in zip(ys, xs)} == {(k, k) for k in range(4)}
    with open_features(resnet_file) as features:
        matrix = read_comparison(features).matrix()
    assert (np.diff(matrix[0]) < 0).all() and (np.diff(matrix[3]) > 0).all()  # fading away from the diagonal
    for label in ("layer1", "layer2", "layer3", "layer4"):
        marks = _find(pixels, text_bitmap(label, LABEL_SIZE))
        assert len(marks) == 2, label  # a row's label and a column's
    plain = hookcli.grid(resnet_file, plain=True)["cka.png"]
    assert plain.shape == (4 * CELL, 4 * CELL, 3)
    for k in range(4):
        centre = pixels[
            ys.min() + k * CELL + 30 : ys.min() + k * CELL + 60, xs.min() + k * CELL + 20 : xs.min() + k * CELL + 70
        ]
        assert not (centre == top).all(), "the value is printed in the cell"
        assert (plain[k * CELL + 30 : k * CELL + 60, k * CELL + 20 : k * CELL + 70] == top).all()
        expected = colorize(np.clip(matrix[k], 0, 1), "viridis")
        assert [plain[k * CELL + 2, j * CELL + 2].tolist() for j in range(4)] == expected.tolist()


def test_an_undefined_cell_is_grey_and_hatched_and_the_legend_says_so(cka_file):
    pixels = hookcli.grid(cka_file)["cka.png"]
    plain = hookcli.grid(cka_file, plain=True)["cka.png"]
    for i, j in ((0, 2), (2, 0), (2, 2)):
        cell = plain[i * CELL : (i + 1) * CELL - 1, j * CELL : (j + 1) * CELL - 1].reshape(-1, 3)
        colours, counts = np.unique(cell, axis=0, return_counts=True)
        assert colours.tolist() == [[128, 128, 128], list(UNDEFINED_COLOR)] and counts[1] > 4 * counts[0]
    assert (plain[CELL // 2, CELL // 2] != UNDEFINED_COLOR).any()
    legend = pixels[-30:]
    assert (legend == UNDEFINED_COLOR).all(axis=2).any() and (legend == (128, 128, 128)).all(axis=2).any()


def test_rsa_is_drawn_on_a_diverging_colormap_unless_cmap_says_otherwise(rsa_file):
    with open_features(rsa_file) as features:
        matrix = read_comparison(features).matrix()
    plain = hookcli.grid(rsa_file, plain=True)["rsa.png"]
    cells = [[plain[i * CELL + 2, j * CELL + 2].tolist() for j in range(2)] for i in range(2)]
    assert cells == colorize((matrix + 1) / 2, DIVERGING).tolist()
    gray = hookcli.grid(rsa_file, plain=True, cmap="gray")["rsa.png"]
    assert gray[2, 2].tolist() == [255, 255, 255]
    viridis = hookcli.grid(rsa_file, plain=True, cmap="viridis")["rsa.png"]  # feature maps' default, named
    cells = [[viridis[i * CELL + 2, j * CELL + 2].tolist() for j in range(2)] for i in range(2)]
    assert cells == colorize((matrix + 1) / 2, "viridis").tolist()


def test_two_comparisons_drawn_into_one_folder_are_named_after_their_files(runner, cka_file, rsa_file, tmp_path):
    out = tmp_path / "pictures"
    for source in (cka_file, rsa_file):
        done = runner.invoke(main, ["grid", str(source), "-o", str(out)])
        assert done.exit_code == 0 and done.stdout == f"{out / (source.stem + '.png')}\n", done.output
    assert sorted(p.name for p in out.iterdir()) == ["cka.png", "rsa.png"]
    with open(cka_file, "rb") as stream:
        piped = runner.invoke(main, ["grid", "-", "-o", str(out)], input=stream.read())
    assert piped.exit_code == 0 and piped.stdout == f"{out / 'linear-cka.png'}\n", piped.output


def test_a_heatmaps_name_takes_the_safe_characters_of_its_files(tmp_path, cka_file):
    odd = tmp_path / "a:b?.safetensors"
    odd.write_bytes(cka_file.read_bytes())
    assert [p.name for p in hookcli.grid(odd, output=tmp_path / "g")] == ["a_b_.png"]


def test_long_column_labels_are_upright_and_many_rows_are_labelled_in_steps(tmp_path):
    rng = np.random.default_rng(2)
    names = [f"features.denseblock{n // 10}.denselayer{n}.conv2" for n in range(30)]
    saved = Features({name: rng.normal(size=(12, 4)).astype("float32") for name in names}, {})
    pixels = hookcli.grid(hookcli.compare(features=saved))["linear-cka.png"]
    upright = [name for name in names if _find(pixels, np.rot90(text_bitmap(name, LABEL_SIZE)))]
    across = [name for name in names if _find(pixels, text_bitmap(name, LABEL_SIZE))]
    assert upright == across == names[::2]  # cells of 16 pixels: every second label


def test_grid_chooses_representations_with_k_and_refuses_what_a_comparison_has_not(runner, cka_file, tmp_path):
    pixels = hookcli.grid(cka_file, keys=["a", "b"], plain=True)["cka.png"]
    assert pixels.shape == (2 * CELL, 2 * CELL, 3)  # 480 // 2 is more than the largest cell
    for args, message in (
        (
            ["-i", "0"],
            f"--image does not apply to a comparison file ('{cka_file}' holds one matrix of similarities). Hint: "
            "choose representations with -k, or leave it out",
        ),
        (
            ["--frame", "0"],
            f"--frame does not apply to a comparison file ('{cka_file}' holds one matrix of similarities). Hint: "
            "choose representations with -k, or leave it out",
        ),
        (
            ["--top", "2"],
            f"--top does not apply to a comparison file ('{cka_file}' holds one matrix of similarities). Hint: "
            "choose representations with -k, or leave it out",
        ),
        (
            ["--scale", "grid"],
            f"--scale does not apply to a comparison file ('{cka_file}' holds one matrix of similarities): its "
            "picture has one colour scale. Hint: leave --scale out",
        ),
        (
            ["-k", "layer9"],
            f"no representation 'layer9' in '{cka_file}' (closest: flat, a, b). Hint: 'hookcli info' lists the keys",
        ),
        (["--cmap", "virdis"], "unknown colormap 'virdis'"),
    ):
        result = runner.invoke(main, ["grid", str(cka_file), "-o", str(tmp_path / "g"), *args])
        assert result.exit_code == 2 and result.stderr.startswith(f"Error: {message}"), result.stderr
        assert not (tmp_path / "g").exists()


# -- report ----------------------------------------------------------------------------------------


def test_report_is_one_page_of_the_heatmap_the_matrix_and_the_settings(runner, cka_file, tmp_path):
    result = runner.invoke(main, ["report", str(cka_file), "-o", str(tmp_path / "r")])
    assert result.exit_code == 0 and result.stdout == f"{tmp_path / 'r' / 'index.html'}\n", result.output
    assert sorted(path.name for path in (tmp_path / "r").iterdir()) == ["index.html"]
    page = (tmp_path / "r" / "index.html").read_text()
    assert f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">' in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    sources = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(sources) == 1
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(sources[0]))).convert("RGB"))
    np.testing.assert_array_equal(shown, hookcli.grid(cka_file)["cka.png"])
    table = re.search(r'<table class="matrix">(.*?)</table>', page, re.S)[1]
    assert re.findall(r'<th scope="col">([^<]*)</th>', table) == ["a", "b", "flat"]
    assert re.findall(r'<th scope="row">([^<]*)</th>', table) == ["a", "b", "flat"]
    with open_features(cka_file) as features:
        matrix = features.read("linear-cka")
    values = [float(v) for v in re.findall(r'data-value="([^"]+)"', table)]
    np.testing.assert_array_equal(np.array(values).reshape(3, 3), matrix)
    assert table.count('<td class="undefined" data-value="NaN">undefined</td>') == 5
    settings = re.search(r'<section id="settings">(.*?)</section>', page, re.S)[1]
    assert "<th>pool</th><td>avg</td>" in settings
    assert '<details class="about">' in page and "<th>method</th><td>linear-cka</td>" in page
    assert "undefined (no spread)</th><td>flat</td>" in page


def test_a_matrix_of_more_cells_than_a_table_shows_is_left_to_the_heatmap(cka_file, tmp_path, monkeypatch):
    from hookcli.pictures import compare_reports

    monkeypatch.setattr(compare_reports, "MOST_TABLE_CELLS", 8)  # the file's 3 x 3
    page = hookcli.report(cka_file, output=tmp_path / "r").read_text()
    assert '<table class="matrix' not in page and 'id="heatmap"' in page
    assert "<p>Its 9 pairs are more than a table here shows (8): the heatmap shows them" in page
    shown = hookcli.report(cka_file, output=tmp_path / "two", keys=["a", "b"]).read_text()
    assert '<table class="matrix">' in shown  # 4 cells, as -k chose


def test_report_takes_k_and_refuses_a_page_size(runner, cka_file, tmp_path):
    index = hookcli.report(cka_file, output=tmp_path / "two", keys=["a", "b"])
    table = re.search(r'<table class="matrix">(.*?)</table>', index.read_text(), re.S)[1]
    assert re.findall(r'<th scope="row">([^<]*)</th>', table) == ["a", "b"] and "undefined" not in table
    result = runner.invoke(main, ["report", str(cka_file), "-o", str(tmp_path / "r"), "--page-size", "5"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: --page-size pages images or channels, and the report of the comparison file '{cka_file}' is one "
        "page. Hint: leave --page-size out\n",
    )
    assert not (tmp_path / "r").exists()


# -- info ------------------------------------------------------------------------------------------


def test_info_describes_a_comparison_by_what_it_compares_and_its_matrix(runner, cka_file):
    with open_features(cka_file) as features:
        matrix = features.read("linear-cka")
    result = runner.invoke(main, ["info", str(cka_file)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{cka_file}  ") and lines[0].endswith(
        "linear-cka comparison of 3 rows with 3 columns over 20 inputs"
    )
    assert lines[1:5] == [
        "rows and columns: the same representations of memory",
        "settings: pool avg",
        "undefined (no spread): flat",
        f"matrix: min {matrix[0, 1]:.4g}, mean {(2 + 2 * matrix[0, 1]) / 4:.4g}, max 1, 5 cells undefined",
    ]
    assert [line.split() for line in lines[5:9]] == [
        ["a", "b", "flat"],
        ["a", "1.000", f"{matrix[0, 1]:.3f}", "undefined"],
        ["b", f"{matrix[1, 0]:.3f}", "1.000", "undefined"],
        ["flat", "undefined", "undefined", "undefined"],
    ]
    assert lines[9] == "tensors:" and "metadata:" in lines
    described = json.loads(runner.invoke(main, ["info", str(cka_file), "--json"]).stdout)
    assert (described["kind"], described["method"], described["rows"], described["undefined"]) == (
        "compare",
        "linear-cka",
        ["a", "b", "flat"],
        ["flat"],
    )
    assert described["matrix"]["values"][2] == ["NaN"] * 3 and described["matrix"]["undefined"] == 5
    assert described["matrix"]["closest"] == [
        {"row": "a", "column": "b", "value": matrix[0, 1]},
        {"row": "b", "column": "a", "value": matrix[1, 0]},
    ]
    bare = runner.invoke(main, ["info", str(cka_file), "--no-stats", "--json"]).stdout
    assert "matrix" not in json.loads(bare)


def test_info_on_two_models_names_both_and_a_wide_matrix_by_each_rows_closest(runner, tmp_path, crops):
    path = hookcli.compare(
        "resnet18",
        ["layer3", "layer4"],
        crops[:4],
        model2="resnet34",
        layers2=["layer4"],
        output=tmp_path / "two.safetensors",
        **SMALL,
    )
    lines = runner.invoke(main, ["info", str(path)]).stdout.splitlines()
    assert lines[1] == "rows: resnet18; columns: resnet34"
    rng = np.random.default_rng(3)
    saved = Features({f"k{n:02d}": rng.normal(size=(12, 4)).astype("float32") for n in range(14)}, {})
    described = hookcli.info(hookcli.compare(features=saved))
    from hookcli.cli.printing import info_lines

    lines = info_lines(described)
    start = lines.index("closest column of each row:")
    assert len([line for line in lines[start + 1 :] if re.match(r"  k\d\d ", line)]) == 14
