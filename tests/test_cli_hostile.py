"""The command line against hostile input and signals: control characters in files and errors, warnings,
HOOKCLI_DEBUG, SIGTERM, values beyond float32's range."""

import json
import signal
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import hookcli.api
from hookcli.cli import main
from hookcli.errors import UnknownLayerError

_SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64"}


def _write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> Path:
    """Write a safetensors file by hand, so keys and metadata may hold anything JSON can."""
    header, data = {}, b""
    for key, array in tensors.items():
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[key] = {
            "dtype": _SAFETENSORS_DTYPES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def _hostile_file(folder: Path) -> Path:
    return _write_safetensors(
        folder / "evil\x1b[31m\n.safetensors",
        {"red\x1b[31mkey\nrow": np.array([[1.0, 2.0]], dtype="float32")},
        {
            "note\tkey": "line1\nline2\x1b[0m\x9b\x7f",
            "inputs": '["a\\nb.png"]',
            "scores": '{"a": NaN, "b": [Infinity, -Infinity]}',
        },
    )


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def test_info_text_escapes_control_characters_in_names_keys_and_metadata(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _hostile_file(tmp_path)
    result = runner.invoke(main, ["info", path.name])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"evil\\x1b[31m\\n.safetensors  {path.stat().st_size} B  1 tensor",
        "key                  dtype  shape  size  min  mean  max  zeros  nan/inf",
        "red\\x1b[31mkey\\nrow  F32    [1,2]   8 B    1   1.5    2   0.0%        0",
        "metadata:",
        "  inputs: (1)",
        "    a\\nb.png",
        "  note\\tkey: line1\\nline2\\x1b[0m\\x9b\\x7f",
        "  scores:",
        "    a: NaN",
        "    b: [Infinity, -Infinity]",
    ]


def test_info_json_is_strict_with_non_finite_numbers_as_strings(runner, tmp_path):
    path = _hostile_file(tmp_path)
    result = runner.invoke(main, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout, parse_constant=_refuse_constant)
    assert described["file"] == str(path)
    assert described["metadata"] == {
        "note\tkey": "line1\nline2\x1b[0m\x9b\x7f",
        "inputs": ["a\nb.png"],
        "scores": {"a": "NaN", "b": ["Infinity", "-Infinity"]},
    }
    assert [t["key"] for t in described["tensors"]] == ["red\x1b[31mkey\nrow"]


def test_info_statistics_of_f64_beyond_float32_range_stay_finite_without_warnings(runner, tmp_path):
    path = _write_safetensors(
        tmp_path / "wide.safetensors",
        {
            "wide": np.array([[-1e300, 1e300]], dtype="float64"),
            "near_limit": np.array([1e308, 1e308], dtype="float64"),  # their sum overflows float64; the mean must not
        },
    )
    result = runner.invoke(main, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no overflow RuntimeWarning (it would be a Note: line)
    stats = {t["key"]: t["stats"] for t in json.loads(result.stdout, parse_constant=_refuse_constant)["tensors"]}
    assert stats == {
        "wide": {"min": -1e300, "mean": 0.0, "max": 1e300, "zeros": 0.0, "nonfinite": 0},
        "near_limit": {"min": 1e308, "mean": 1e308, "max": 1e308, "zeros": 0.0, "nonfinite": 0},
    }


def _failing(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


def test_usage_error_quoting_a_newline_stays_one_line(runner):
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer1", "--device", "cu\nda", "img.png"])
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: Invalid value for '--device' / '-d': 'cu\\nda' is not a device; use auto, cpu, cuda, cuda:N or mps. "
        "Hint: see 'hookcli extract --help'\n"
    )


def test_a_list_of_paths_split_by_nul_bytes_is_refused_in_one_line(runner, no_model):
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer1", "-o", "-", "-"], input="a.png\0b.png\n")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: input 'a.png\\x00b.png' holds a NUL byte, which no path can. Hint: paths on standard input come one "
        "a line (find … -print, not -print0)\n"
    )


def test_library_error_with_control_characters_stays_one_line(runner, monkeypatch):
    error = UnknownLayerError("no layer matches 'a\nb\x1b[2J'", hint="run 'hookcli layers'")
    monkeypatch.setattr(hookcli.api, "layers", _failing(error))
    result = runner.invoke(main, ["layers", "-m", "resnet18"])
    assert result.exit_code == 2
    assert result.stderr == "Error: no layer matches 'a\\nb\\x1b[2J'. Hint: run 'hookcli layers'\n"


def test_unexpected_error_keeps_its_first_line_escaped(runner, monkeypatch):
    monkeypatch.setattr(hookcli.api, "layers", _failing(RuntimeError("bad \x1b[2Jkey\there\nsecond line")))
    result = runner.invoke(main, ["layers", "-m", "resnet18"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: RuntimeError: bad \\x1b[2Jkey\\there. Hint: rerun with --debug for the traceback\n"
    )


def _warning_layers(*args, **kwargs):
    warnings.warn("overflow \x1b[31min cast\nsecond line", RuntimeWarning)
    warnings.warn("overflow \x1b[31min cast\nsecond line", RuntimeWarning)  # another line: Python shows it again
    warnings.warn("decompression bomb", UserWarning)
    return []


def test_warnings_become_one_note_line_each_once_unless_debug(runner, monkeypatch):
    monkeypatch.setattr(hookcli.api, "layers", _warning_layers)
    before = warnings.showwarning, signal.getsignal(signal.SIGTERM)
    result = runner.invoke(main, ["layers", "-m", "resnet18"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "path  type  output  params  calls\n"
    assert result.stderr == "Note: overflow \\x1b[31min cast\nNote: decompression bomb\n"
    assert (warnings.showwarning, signal.getsignal(signal.SIGTERM)) == before  # put back afterwards

    with warnings.catch_warnings(record=True) as shown:  # --debug: as Python shows them (here: recorded)
        warnings.simplefilter("always")
        result = runner.invoke(main, ["--debug", "layers", "-m", "resnet18"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert [(w.category, str(w.message)) for w in shown] == [
        *[(RuntimeWarning, "overflow \x1b[31min cast\nsecond line")] * 2,
        (UserWarning, "decompression bomb"),
    ]


def _numpy_arithmetic(*args, **kwargs):
    import numpy as np

    with np.errstate(all="warn"):
        np.var(np.ones(1), ddof=1)  # "Degrees of freedom <= 0 for slice"
        np.add.reduce(np.full(4, 60000, dtype=np.float16))  # "overflow encountered in reduce"
    warnings.warn("a warning of hookcli's own", RuntimeWarning)
    return []


def test_numpys_arithmetic_warnings_are_no_notes_unless_debug(runner, monkeypatch):
    monkeypatch.setattr(hookcli.api, "layers", _numpy_arithmetic)
    result = runner.invoke(main, ["layers", "-m", "resnet18"])
    assert result.exit_code == 0, result.output
    assert result.stderr == "Note: a warning of hookcli's own\n"
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert runner.invoke(main, ["--debug", "layers", "-m", "resnet18"]).exit_code == 0
    assert any("Degrees of freedom" in str(w.message) for w in shown), [str(w.message) for w in shown]
    assert any("overflow" in str(w.message) for w in shown)


def test_hookcli_debug_takes_on_and_off_words(runner, monkeypatch):
    monkeypatch.setattr(hookcli.api, "layers", _failing(RuntimeError("boom")))
    for value in ("0", "false", "No", "OFF", " off ", ""):
        result = runner.invoke(main, ["layers", "-m", "resnet18"], env={"HOOKCLI_DEBUG": value})
        assert result.exit_code == 1, value
        assert result.stderr == "Error: RuntimeError: boom. Hint: rerun with --debug for the traceback\n", value
    for value in ("1", "true", "YES", "On"):
        result = runner.invoke(main, ["layers", "-m", "resnet18"], env={"HOOKCLI_DEBUG": value})
        assert result.exit_code == 1 and isinstance(result.exception, RuntimeError), value
        assert result.stderr == "", value


_SLOW_COMMAND = """
import sys, time
import click
from hookcli.cli import main
from hookcli.files import atomic_path

@main.command()
@click.argument("target")
def slow(target):
    with atomic_path(target) as temporary:
        temporary.write_bytes(b"half written")
        print(temporary.name, flush=True)
        time.sleep(120)

main(["slow", sys.argv[1]], prog_name="hookcli")
"""


def test_sigterm_unwinds_like_ctrl_c_removes_temporary_files_and_exits_143(tmp_path):
    output = tmp_path / "out" / "features.safetensors"
    output.parent.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_COMMAND, str(output)],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        temporary = child.stdout.readline().strip()
        assert temporary.endswith(".part") and (output.parent / temporary).exists(), child.stderr.read()
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert (child.returncode, stdout, stderr) == (143, "", "Terminated.\n")
    assert list(output.parent.iterdir()) == []


@pytest.mark.parametrize("command", ["grid", "info"])
def test_a_photo_given_where_features_belong_is_named_an_image(runner, tmp_path, make_image, command):
    photo = make_image(tmp_path / "photo.png")
    result = runner.invoke(main, [command, str(photo)])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: '{photo}' is an image, not a safetensors file. Hint: hookcli extract makes features of it; grid, "
        "report and info read what extract writes\n",
    )
