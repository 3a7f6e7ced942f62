"""Files whose headers declare more than they hold, and names that grow work faster than their length: refused or
drawn in bounded time and memory, whatever the header says."""

import json
import struct
import time

import numpy as np
import pytest
import torch
from PIL import Image

import hookcli
from hookcli.cli import main
from hookcli.errors import CaptureError
from hookcli.pictures.text import caption_font, fitted
from hookcli.storage.compare_format import MOST_LABELS, check_comparison
from hookcli.storage.features import Features
from hookcli.storage.stats_format import MOST_CHANNELS

_SIZES = {"F64": 8, "F32": 4, "I64": 8}


def _sparse_safetensors(path, tensors, metadata):
    """A safetensors file of ``tensors`` (name: (dtype, shape)) whose data are holes: large as declared, nothing
    on disk."""
    header, offset = {"__metadata__": metadata}, 0
    for name, (dtype, shape) in tensors.items():
        size = _SIZES[dtype] * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        handle.truncate(8 + len(text) + offset)
    return path


def _flat_stats(path, channels):
    units = {"fc": {"channels": channels, "spatial": [], "layout": "flat", "skip": 0, "row_shape": [channels]}}
    metadata = {
        "format": "4",
        "kind": "stats",
        "inputs": '["a.jpg"]',
        "units": json.dumps(units),
        "stats": '{"top": 0, "top_by": "max", "quantiles": [], "pca": false}',
    }
    tensors = {"fc@count": ("I64", [])}
    tensors.update({f"fc@{field}": ("F64", [channels]) for field in ("mean", "std", "min", "max", "zeros")})
    empty = (("quantiles", "F64"), ("top_values", "F32"), ("top_rows", "I64"), ("top_maps", "F32"))
    tensors.update({f"fc@{field}": (dtype, [channels, 0]) for field, dtype in empty})
    return _sparse_safetensors(path, tensors, metadata)


@pytest.mark.parametrize("command", [["info"], ["grid", "-o", "pictures"], ["report", "-o", "pages"]])
def test_a_statistics_file_declaring_100m_channels_is_refused_before_anything_is_read(
    runner, one_error, tmp_path, command
):
    wide = _flat_stats(tmp_path / "wide.safetensors", 100_000_000)
    assert wide.stat().st_size > 4e9
    command = [str(tmp_path / part) if part in ("pictures", "pages") else part for part in command]
    error = one_error(runner.invoke(main, [command[0], str(wide), *command[1:]]))
    assert error == (
        f"Error: '{wide}' is a damaged statistics file: its 'units' entry of 'fc' gives 100,000,000 channels, more "
        "than a layer has (1,048,576 at most). Hint: write it again with hookcli stats"
    )


def test_a_layer_wider_than_a_statistics_file_holds_is_refused_when_gathered():
    rows = torch.zeros(2, MOST_CHANNELS + 1)
    features = Features({"wide": rows}, {"inputs": json.dumps(["a.jpg", "b.jpg"])})
    with pytest.raises(CaptureError, match=r"^'wide' has rows of shape \[1048577\]: 1,048,577 channels over 1 "):
        hookcli.stats(features=features)


def _comparison_metadata(labels):
    return {
        "format": "5",
        "kind": "compare",
        "method": "rsa",
        "rows": json.dumps(labels),
        "columns": json.dumps(labels),
        "same": "true",
        "settings": "{}",
        "inputs": '["a.jpg"]',
    }


def test_a_comparison_of_20000_labels_is_refused_from_its_header(runner, one_error, tmp_path):
    labels = [f"layer{n}" for n in range(20_000)]
    crafted = _sparse_safetensors(
        tmp_path / "wide.safetensors", {"rsa": ("F64", [20_000, 20_000])}, _comparison_metadata(labels)
    )
    for command in (["info", "--no-stats"], ["grid", "-o", str(tmp_path / "pictures")]):
        error = one_error(runner.invoke(main, [command[0], str(crafted), *command[1:]]))
        assert error == (
            f"Error: '{crafted}' is a damaged comparison file: its 'rows' metadata lists 20,000 labels, more than a "
            "side has (2,048). Hint: write it again with hookcli compare"
        )


def test_the_labels_of_a_comparison_are_checked_in_linear_time():
    labels = [f"a long label of layer {n}" for n in range(MOST_LABELS)]
    shapes = {"rsa": ("F64", [MOST_LABELS, MOST_LABELS])}
    shapes.update({f"rdm@{label}": ("F32", [1, 1]) for label in labels})
    start = time.perf_counter()
    assert check_comparison(_comparison_metadata(labels), shapes, read=None).rows == labels
    twice = _comparison_metadata([*labels[:-1], labels[0]])
    with pytest.raises(ValueError, match="^its 'rows' metadata names \"a long label of layer 0\" twice$"):
        check_comparison(twice, shapes, read=None)
    too_many = _comparison_metadata([f"{n}" for n in range(120_000)])
    with pytest.raises(ValueError, match="lists 120,000 labels, more than a side has"):
        check_comparison(too_many, shapes, read=None)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("length", [20_000, 200_000])
def test_a_long_caption_is_cut_to_fit_by_halving(length):
    font = caption_font(300)
    start = time.perf_counter()
    line = fitted("x" * length, font, 292)
    assert time.perf_counter() - start < 1.0
    assert line.endswith("…") and font.getlength(line) <= 292 < font.getlength(line + "x")


def test_a_statistics_file_with_a_200000_character_top_by_draws_pictures_of_the_usual_size(tmp_path):
    rng = np.random.default_rng(0)
    features = Features(
        {"maps": torch.from_numpy(rng.normal(size=(4, 2, 3, 3)).astype(np.float32))},
        {"inputs": json.dumps([f"/photos/{n}.jpg" for n in range(4)])},
    )
    written = hookcli.stats(features=features, top=2, output=str(tmp_path / "s.safetensors"))
    with hookcli.open_features(written) as opened:
        tensors = {key: torch.from_numpy(opened.read(key)) for key in opened.keys()}
        metadata = dict(opened.metadata)
    metadata["stats"] = json.dumps({**json.loads(metadata["stats"]), "top_by": "x" * 200_000})
    crafted = tmp_path / "crafted.safetensors"
    from safetensors.torch import save_file

    save_file(tensors, str(crafted), metadata=metadata)
    start = time.perf_counter()
    pictures = hookcli.grid(str(crafted), output=str(tmp_path / "pictures"))
    assert time.perf_counter() - start < 30
    sizes = [Image.open(path).size for path in pictures]
    assert len(sizes) == 2 and max(width for width, _ in sizes) < 2000 and max(h for _, h in sizes) < 2000
