"""Crafted and damaged files: every header claim is checked, metadata is bounded, pictures cost a bounded amount.

Files here are written byte by byte, as an attacker (or a full disk) would leave them.
"""

import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save_file

from hookcli.cli import main
from hookcli.errors import FeatureFileError
from hookcli.storage.features import FeatureFile


def _crafted(path, header: dict, data: bytes = b"", metadata=None):
    """A safetensors file with exactly this header (no checks) and these data bytes."""
    if metadata is not None:
        header = {"__metadata__": metadata, **header}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


BOMB = _entry("F32", [10**15, 1, 1, 1], 0, 12)

DAMAGED = "it was not written whole by a safetensors writer; write it again"


@pytest.mark.parametrize(
    "entries, message",
    [
        (
            {"x": BOMB},
            "tensor 'x' of shape [1000000000000000, 1, 1, 1] F32 needs 4000000000000000 bytes but its "
            f"data_offsets span 12. Hint: {DAMAGED}",
        ),
        (
            {"x": _entry("F32", [-1, 3], 0, 12)},
            "tensor 'x' has an impossible shape [-1, 3]. Hint: dimensions are whole "
            "numbers from 0 to 2^62, at most 32 of them, whose non-zero product is under 2^62 bytes",
        ),
        (
            {"x": _entry("F32", [True, 3], 0, 12)},
            "tensor 'x' has an impossible shape [true, 3]. Hint: dimensions are "
            "whole numbers from 0 to 2^62, at most 32 of them, whose non-zero product is under 2^62 bytes",
        ),
        ({"x": _entry("F32", [3], 12, 0)}, f"tensor 'x' has impossible data_offsets [12, 0]. Hint: {DAMAGED}"),
        (
            {"x": _entry("F32", [0, 2**62, 2**62], 0, 0)},
            "tensor 'x' has an impossible shape [0, 4611686018427387904, "
            "4611686018427387904]. Hint: dimensions are whole numbers from 0 "
            "to 2^62, at most 32 of them, whose non-zero product is under "
            "2^62 bytes",
        ),
        (
            {"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)},
            f"the data of tensors 'a' and 'b' overlap. Hint: {DAMAGED}",
        ),
    ],
)
def test_header_claims_that_disagree_are_refused_naming_the_key(runner, one_error, tmp_path, entries, message):
    path = _crafted(tmp_path / "f.safetensors", entries, bytes(12))
    for command in (["info", str(path)], ["grid", str(path), "-i", "0", "-o", str(tmp_path / "g")]):
        assert one_error(runner.invoke(main, command)) == f"Error: '{path}' is damaged: {message}"
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    "header, hint",
    [
        ({"x": {"dtype": "F32", "shape": [3]}}, "the header entry for 'x' lacks a dtype, shape or data_offsets"),
        ({"x": [1, 2]}, "the header entry for 'x' is malformed"),
        ({"__metadata__": {"format": 1}}, "its __metadata__ is not a map of strings"),
        (json.loads("[" * 50 + "]" * 50), "its header is not a JSON object"),
    ],
)
def test_malformed_headers_are_one_usage_error(runner, one_error, tmp_path, header, hint):
    path = _crafted(tmp_path / "f.safetensors", header)
    assert one_error(runner.invoke(main, ["info", str(path)])) == (
        f"Error: '{path}' is not a safetensors file. Hint: {hint}"
    )


def test_a_header_nested_past_pythons_recursion_limit_is_not_json_to_us(runner, one_error, tmp_path):
    path = tmp_path / "deep.safetensors"
    text = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    assert one_error(runner.invoke(main, ["info", str(path)])) == (
        f"Error: '{path}' is not a safetensors file. Hint: its header is not JSON"
    )


def test_a_key_given_twice_in_a_header_is_refused(runner, one_error, tmp_path):
    path = tmp_path / "twice.safetensors"
    text = (
        b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    )
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    assert one_error(runner.invoke(main, ["info", str(path)])) == (
        f"Error: '{path}' is not a safetensors file. Hint: its header names 'x' twice"
    )


def test_unknown_dtypes_are_named(tmp_path):
    path = _crafted(tmp_path / "f.safetensors", {"x": _entry("F8_E4M3", [4], 0, 4)}, bytes(4))
    with pytest.raises(FeatureFileError) as caught:
        FeatureFile(path)
    assert str(caught.value) == (
        f"tensor 'x' in '{path}' has unsupported dtype F8_E4M3. Hint: hookcli reads F64, "
        "F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL"
    )
    assert caught.value.exit_code == 2


def test_f64_values_beyond_float32_are_read_as_they_are(tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"x": np.array([[1e300, -1e300, 2.0]])}, str(path))
    with FeatureFile(path) as features:
        row = features.read("x", 0)
    assert row.dtype == np.float64 and row.tolist() == [1e300, -1e300, 2.0]


def test_untrusted_preprocess_metadata_is_refused_before_any_picture(runner, one_error, tmp_path, photo):
    data = np.ones((1, 2, 4, 4), dtype=np.float32)
    for preprocess, problem in [
        ({"resize": 60000, "crop": 60000}, "resize must be a whole number from 1 to 8192, not 60000"),
        ({"resize": 64, "crop": 64, "std": [0, 1, 1]}, "std must be finite numbers above 0, not 0.0, 1.0, 1.0"),
        ({"resize": "64", "crop": 64}, "resize must be a whole number from 1 to 8192, not '64'"),
        ({"resize": 64}, "it lacks resize or crop"),
        (
            {"resize": 64, "crop": 64, "interpolation": "lanczos"},
            "interpolation must be one of bilinear, bicubic, nearest, not 'lanczos'",
        ),
    ]:
        path = tmp_path / "f.safetensors"
        save_file(
            {"x": data}, str(path), metadata={"inputs": json.dumps([str(photo)]), "preprocess": json.dumps(preprocess)}
        )
        result = runner.invoke(main, ["grid", str(path), "--overlay", "-o", str(tmp_path / "g")])
        assert one_error(result) == (
            f"Error: '{path}' has unusable preprocess metadata: {problem}. Hint: draw without --overlay, or write the "
            "file again with hookcli extract"
        )
        assert not any((tmp_path / "g").glob("*.png"))


def test_an_overlay_without_preprocess_metadata_is_drawn_at_most_2048_pixels(runner, tmp_path):
    big = tmp_path / "big.png"
    Image.new("RGB", (3000, 1000), (40, 80, 120)).save(big)
    path = tmp_path / "f.safetensors"
    save_file({"x": np.ones((1, 1, 4, 4), dtype=np.float32)}, str(path), metadata={"inputs": json.dumps([str(big)])})
    result = runner.invoke(main, ["grid", str(path), "--overlay", "--plain", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert Image.open(result.stdout.strip()).size == (2048, 683)


def test_a_wide_tensor_draws_what_fits_and_says_how_to_get_the_rest(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file(
        {
            "x": np.arange(20_000, dtype=np.float32).reshape(1, 5000, 2, 2),
            "pooled": np.arange(300_000, dtype=np.float32).reshape(1, 300_000, 1, 1),
        },
        str(path),
    )
    result = runner.invoke(
        main, ["grid", str(path), "--plain", "--padding", "0", "--channels", ":", "-o", str(tmp_path / "g")]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: 'pooled': drew values 0-262143 of 300000: a picture holds at most 262144 values; "
        "--channels 262144:524288 draws the next\n"
        "Note: 'x': drew channels 0-4095 of 5000: a picture holds at most 4096 tiles of 2x2; "
        "--channels 4096:8192 draws the next\n"
    )
    values, tiles = result.stdout.split()
    assert Image.open(tiles).size == (64 * 32, 64 * 32)  # 4096 tiles, 64 x 64, 2 px → 32 px each
    assert Image.open(values).size == (1024 + 2, 256 * (14 + 2) + 2)  # 256 lines of 1,024 one-pixel cells


def test_the_enlargement_stops_at_the_pixel_limit(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file(
        {"small": np.zeros((1, 100, 8, 8), dtype=np.uint8), "many": np.zeros((1, 2000, 60, 60), dtype=np.uint8)},
        str(path),
    )
    result = runner.invoke(
        main,
        [
            "grid",
            str(path),
            "--plain",
            "--padding",
            "0",
            "--min-tile",
            "1024",
            "--channels",
            ":",
            "-o",
            str(tmp_path / "g"),
        ],
    )
    assert result.exit_code == 0, result.output
    sizes = {os.path.basename(p): Image.open(p).size for p in result.stdout.split()}
    assert sizes == {
        "small__00000_row00000.png": (10 * 8 * 62, 10 * 8 * 62),  # enlarged 62 times, not 128: 63 would pass 25 Mpx
        "many__00000_row00000.png": (50 * 60, 40 * 60),  # 2,000 tiles of 60 px, 50 x 40: not enlarged at all
    }


def test_empty_selections_are_usage_errors_that_say_what_exists(runner, one_error, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"feat": np.ones((2, 256, 2, 2), dtype=np.float32)}, str(path))
    out = ["-o", str(tmp_path / "g")]
    for channels in ("5:2", "9999", "0:0"):
        assert one_error(runner.invoke(main, ["grid", str(path), "--channels", channels, *out])) == (
            f"Error: nothing to draw in '{path}': 'feat' (shape [2, 256, 2, 2]): --channels "
            f"{channels} selects none of its 256 channels "
            "(0-255). Hint: 'hookcli info' shows the shapes; choose other tensors (-k) or channels"
        )
    scalar, empty = tmp_path / "scalar.safetensors", tmp_path / "empty.safetensors"
    save_file({"s": np.array(1.0, dtype=np.float32)}, str(scalar))
    save_file({"e": np.ones((0, 4), dtype=np.float32)}, str(empty))
    assert one_error(runner.invoke(main, ["grid", str(scalar), *out])) == (
        f"Error: nothing to draw in '{scalar}': 's' (shape []): a 0-dimensional tensor has no rows. Hint: 'hookcli "
        "info' shows the shapes; choose other tensors (-k) or channels"
    )
    assert one_error(runner.invoke(main, ["grid", str(empty), *out])) == (
        f"Error: nothing to draw in '{empty}': 'e' (shape [0, 4]): it has no rows. Hint: 'hookcli info' shows the "
        "shapes; choose other tensors (-k) or channels"
    )
    assert not (tmp_path / "g").exists()


def test_a_channel_range_that_misses_one_tensor_is_a_note_and_the_others_are_drawn(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file(
        {"small": np.ones((1, 4, 2, 2), dtype=np.float32), "big": np.ones((1, 16, 2, 2), dtype=np.float32)}, str(path)
    )
    result = runner.invoke(main, ["grid", str(path), "--channels", "8:12", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: skipped 'small' (shape [1, 4, 2, 2]): --channels 8:12 selects none of its 4 channels (0-3)\n"
    )
    assert [os.path.basename(p) for p in result.stdout.split()] == ["big__00000_row00000.png"]


def test_a_channel_range_past_a_tensors_end_says_what_it_drew(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"feat": np.ones((1, 64, 2, 2), dtype=np.float32)}, str(path))
    for channels, drew, count in (("0:999", "0-63", 64), ("62:999", "62-63", 2), ("-100:", "0-63", 64)):
        drawn = ["--plain", "--padding", "0", "-o", str(tmp_path / f"g{channels}")]
        result = runner.invoke(main, ["grid", str(path), "--channels", channels, *drawn])
        assert result.exit_code == 0, result.output
        assert result.stderr == (
            f"Note: 'feat': --channels {channels} reaches past its 64 channels (0-63): it selects {drew}\n"
        )
        width, height = Image.open(result.stdout.strip()).size
        assert width * height == count * 32 * 32  # the channels it names, each enlarged to 32 px
    result = runner.invoke(main, ["grid", str(path), "--channels", "0:64", "-o", str(tmp_path / "all")])
    assert result.exit_code == 0 and result.stderr == ""
    result = runner.invoke(main, ["grid", str(path), "--channels", "60:999", "--top", "2", "-o", str(tmp_path / "t")])
    assert result.exit_code == 0 and result.stderr == (
        "Note: 'feat': --channels 60:999 reaches past its 64 channels (0-63): it selects 60-63\n"
    )  # of which --top draws 2


def test_keys_that_would_share_a_png_name_get_names_of_their_own(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    keys = ["a/b", "a:b", "a b", "A_B", "c" * 300]
    save_file({key: np.full((1, 2), float(n), dtype=np.float32) for n, key in enumerate(keys)}, str(path))
    result = runner.invoke(main, ["grid", str(path), "--plain", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    names = [os.path.basename(p) for p in result.stdout.split()]
    assert len(set(n.casefold() for n in names)) == 5 and all(len(n) < 200 for n in names)
    assert all(n.startswith(("a_b~", "A_B~")) for n in names[:4]) and names[4].startswith("c" * 91 + "~")


def test_bad_globs_and_a_file_as_the_output_folder_are_usage_errors(runner, one_error, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"x": np.ones((1, 2), dtype=np.float32)}, str(path))
    assert one_error(runner.invoke(main, ["grid", str(path), "-k", "[4-1]", "-o", str(tmp_path / "g")])) == (
        "Error: invalid key pattern '[4-1]': bad character range 4-1 at position 1. Hint: patterns take * ? and "
        "[abc] or [a-z] ranges written low to high"
    )
    (tmp_path / "taken").write_text("mine")
    assert one_error(runner.invoke(main, ["grid", str(path), "-o", str(tmp_path / "taken")])) == (
        f"Error: output '{tmp_path / 'taken'}' is a file, not a folder. Hint: give a folder name, or remove the file"
    )
    assert (tmp_path / "taken").read_text() == "mine"


def test_a_fifo_is_refused_by_info_and_grid_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    for command in (["info", str(fifo)], ["grid", str(fifo), "-o", str(tmp_path / "g")]):
        done = subprocess.run([sys.executable, "-m", "hookcli", *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr == (
            f"Error: '{fifo}' is a FIFO (named pipe), not a regular file. Hint: give a .safetensors file\n"
        )


def _png_of_zeros(path, width: int, height: int):
    """A 16-bit grayscale PNG of zeros, compressed row by row: tiny on disk, large once decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    packer, row = zlib.compressobj(9), bytes(1 + 2 * width)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def test_crafted_files_under_a_megabyte_cost_grid_and_info_under_a_gigabyte(tmp_path, photo, peak_of):
    huge = _png_of_zeros(tmp_path / "huge16.png", 9000, 9000)  # 157 KB on disk, 162 MB decoded
    files = {
        "huge_png": tmp_path / "huge.safetensors",
        "bomb": _crafted(tmp_path / "bomb.safetensors", {"x": BOMB}, bytes(12)),
        "zero_rows": _crafted(tmp_path / "zero.safetensors", {"x": _entry("F32", [10**15, 0], 0, 0)}),
        "wide": tmp_path / "wide.safetensors",
        "resize": tmp_path / "resize.safetensors",
    }
    save_file({"x": np.ones((1, 250_000, 1, 1), dtype=np.float32)}, str(files["wide"]))
    save_file(
        {"x": np.ones((1, 1, 2, 2), dtype=np.float32)},
        str(files["resize"]),
        metadata={"inputs": json.dumps([str(photo)]), "preprocess": json.dumps({"resize": 8192, "crop": 8192})},
    )
    save_file(
        {"x": np.ones((1, 1, 2, 2), dtype=np.float32)},
        str(files["huge_png"]),
        metadata={"inputs": json.dumps([str(huge)])},
    )
    assert all(path.stat().st_size < 1 << 20 for path in [huge, *files.values()])
    results = {}
    for name, path in files.items():
        for command in ("info", "grid"):
            extra = ["-o", str(tmp_path / f"g-{name}")] + (["--overlay"] if name in ("resize", "huge_png") else [])
            results[name, command] = peak_of(command, path, *(extra if command == "grid" else []))
    for (name, command), (_, peak, stderr) in results.items():
        assert peak < 1 << 30, (name, command, peak, stderr)
    assert {key: code for key, (code, _, _) in results.items()} == {
        ("bomb", "info"): 2,
        ("bomb", "grid"): 2,
        ("zero_rows", "info"): 0,
        ("zero_rows", "grid"): 2,
        ("wide", "info"): 0,
        ("wide", "grid"): 0,
        ("resize", "info"): 0,
        ("resize", "grid"): 0,
        ("huge_png", "info"): 0,
        ("huge_png", "grid"): 0,
    }
    assert Image.open(tmp_path / "g-huge_png" / "x__00000_huge16.overlay.png").size[0] == 2048
    assert Image.open(tmp_path / "g-resize" / "x__00000_grace_hopper.overlay.png").size[0] == 2048


def test_an_overlay_input_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "photo.jpg"
    os.mkfifo(fifo)
    path = tmp_path / "f.safetensors"
    save_file({"x": np.ones((1, 1, 4, 4), dtype=np.float32)}, str(path), metadata={"inputs": json.dumps([str(fifo)])})
    done = subprocess.run(
        [sys.executable, "-m", "hookcli", "grid", str(path), "--overlay", "-o", str(tmp_path / "g")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        1,
        f"Error: '{fifo}' is a FIFO (named pipe), not a regular file. Hint: inputs must be image files\n",
    )


def test_deeply_nested_metadata_is_shown_as_the_text_it_is(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    deep = "[" * 900 + "]" * 900
    save_file(
        {"x": np.ones((1, 2), dtype=np.float32)},
        str(path),
        metadata={"deep": deep, "layers": '{"a": ' * 900 + "1" + "}" * 900, "shallow": "[[1]]"},
    )
    result = runner.invoke(main, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["metadata"]["deep"] == deep
    assert json.loads(result.stdout)["metadata"]["shallow"] == [[1]]
    assert runner.invoke(main, ["grid", str(path), "-o", str(tmp_path / "g")]).exit_code == 0


def test_lone_surrogates_in_names_are_escaped_in_text_and_json(runner, tmp_path):
    header = b'{"bad\\ud800key": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}}'
    path = tmp_path / "f.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    result = runner.invoke(main, ["info", str(path), "--no-stats"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2] == "bad\\ud800key  F32    [1,2]   8 B"
    result = runner.invoke(main, ["info", str(path), "--json", "--no-stats"])
    assert json.loads(result.stdout)["tensors"][0]["key"] == "bad\\ud800key"
    result.stdout.encode("utf-8")  # no lone surrogate left to fail a strict reader


def test_the_nothing_to_draw_error_stays_short_however_many_tensors(runner, one_error, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({f"k{i:04d}": np.ones((0, 2), dtype=np.float32) for i in range(1000)}, str(path))
    message = one_error(runner.invoke(main, ["grid", str(path), "-o", str(tmp_path / "g")]))
    assert message == (
        f"Error: nothing to draw in '{path}': 'k0000' (shape [0, 2]): it has no rows; 'k0001' (shape "
        "[0, 2]): it has no rows; 'k0002' (shape [0, 2]): it has no rows; and 997 more tensors. Hint: "
        "'hookcli info' shows the shapes; choose other tensors (-k) or channels"
    )
