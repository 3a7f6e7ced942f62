"""While hookcli writes a file's bytes to stdout (-o -), nothing else reaches stdout: a model's own prints go to
stderr, whether Python prints them or C code writes to file descriptor 1."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load

from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.files import hold_output

PRINTING = textwrap.dedent("""
    import os

    import torch


    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            print("forward called")  # Python's stdout
            os.write(1, b"raw bytes on fd 1\\n")  # as C code would
            return self.conv(x)


    def make():
        print("building the model")
        return Noisy()
""")


def test_a_printing_model_cannot_corrupt_the_bytes_on_stdout(tmp_path, images):
    factory = tmp_path / "noisy.py"
    factory.write_text(PRINTING)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hookcli",
            "extract",
            "-m",
            f"{factory}:make",
            "-l",
            "conv",
            "--resize",
            "16",
            "--crop",
            "16",
            "-o",
            "-",
            str(images[0]),
        ],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    features = load(done.stdout)  # the whole of stdout is one safetensors file
    assert features["conv"].shape == torch.Size([1, 4, 14, 14])
    said = done.stderr.decode().splitlines()
    assert [line for line in said if not line.startswith("Note:")] == [
        "building the model",
        "forward called",
        "raw bytes on fd 1",
    ]
    drawn = subprocess.run(
        [sys.executable, "-m", "hookcli", "grid", "-", "-o", str(tmp_path / "g")],
        input=done.stdout,
        capture_output=True,
        timeout=300,
    )
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.decode().splitlines() == [str(tmp_path / "g" / "conv__00000_a.png")]


def test_python_prints_go_to_stderr_under_a_test_runner(tmp_path, images, runner):
    factory = tmp_path / "noisy.py"
    factory.write_text(PRINTING.replace('os.write(1, b"raw bytes on fd 1\\n")', "pass"))
    result = runner.invoke(
        main,
        ["extract", "-m", f"{factory}:make", "-l", "conv", "--resize", "16", "--crop", "16", "-o", "-", str(images[0])],
    )
    assert result.exit_code == 0, result.output
    assert load(result.stdout_bytes)["conv"].shape == torch.Size([1, 4, 14, 14])
    assert [line for line in result.stderr.splitlines() if not line.startswith("Note:")] == [
        "building the model",
        "forward called",
    ]


def test_the_api_writes_the_file_to_a_binary_stream(images):
    import io

    import hookcli

    stream = io.BytesIO()
    assert (
        hookcli.extract("resnet18", "layer1", [str(images[0])], output=stream, weights="none", resize=32, crop=32)
        is None
    )
    assert load(stream.getvalue())["layer1"].shape == torch.Size([1, 64, 8, 8])


def test_a_folder_that_takes_no_new_file_is_named_as_such():
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc, which takes no new file even from root")
    with pytest.raises(UsageProblem) as refused:
        hold_output("/proc/e.safetensors")
    assert str(refused.value) == (
        "cannot write to folder '/proc' (No such file or directory). Hint: choose another place with -o"
    )
