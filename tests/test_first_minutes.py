"""What a new user meets in their first minutes: bare `hookcli`, --debug, help texts, folders with sub-folders,
output names, unreadable images in a folder, options given to the wrong command, the install instructions."""

import json
import platform
import re
from importlib import metadata
from pathlib import Path

import click
import pytest
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.events import Note
from hookcli.inputs.discovery import find_inputs

EXTRACT = ["extract", "-m", "resnet18", "-w", "none", "--resize", "32", "--crop", "32", "-l", "layer1"]
SMALL = {"weights": "none", "resize": 32, "crop": 32}
LEFT_OUT = "Note: 3 images in 2 sub-folders were left out; -r (--recursive) includes them\n"


@pytest.fixture
def nested(images, make_image):
    """tmp_path/imgs holds a, b, c and, below it, three more images in two sub-folders and one without images."""
    folder = images[0].parent
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "notes").mkdir()
    (folder / "notes" / "readme.txt").write_text("no images here")
    for index, path in enumerate(["sub/d.png", "sub/e.png", "sub/deeper/f.png"]):
        make_image(folder / path, seed=10 + index)
    return folder


def _words(text: str) -> str:
    return " ".join(text.split())


# -- bare hookcli, --debug -------------------------------------------------------------------------


def test_bare_hookcli_prints_the_help_and_exits_0(runner):
    result = runner.invoke(main, [])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == runner.invoke(main, ["--help"]).stdout
    assert result.stdout.startswith("Usage: hookcli [OPTIONS] COMMAND [ARGS]...\n")


@pytest.mark.parametrize("debug", [["--debug"], "env"])
def test_debug_shows_the_traceback_and_keeps_the_exit_code_of_the_error(runner, tmp_path, monkeypatch, debug):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.jpg").write_text("not an image")
    flag, env = (debug, {}) if debug != "env" else ([], {"HOOKCLI_DEBUG": "1"})
    usage = runner.invoke(main, [*flag, *EXTRACT, "-o", "out.safetensors", "missing.png"], env=env)
    failure = runner.invoke(main, [*flag, *EXTRACT, "-o", "out.safetensors", "text.jpg"], env=env)
    assert usage.exit_code == 2
    assert usage.stderr.startswith("Traceback (most recent call last):\n")
    assert usage.stderr.endswith(
        "hookcli.errors.InputError: no such file or folder: 'missing.png'. Hint: check the path\n"
    )
    assert failure.exit_code == 1
    assert failure.stderr.startswith("Traceback (most recent call last):\n")
    assert failure.stderr.endswith(
        "hookcli.errors.ImageError: 'text.jpg' is not an image Pillow can read. Hint: "
        "check the file type; text or corrupt files cannot be used; or add --on-error "
        "skip to leave unreadable images out\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.jpg"]


# -- help texts ------------------------------------------------------------------------------------


def test_cam_help_says_what_precision_means_for_cam(runner):
    cam = _words(runner.invoke(main, ["cam", "--help"]).stdout)
    assert (
        "--precision [fp32|tf32|bf16|fp16] Compute precision: fp32 is exact float32 on every device (on CUDA: "
        "no TF32, deterministic algorithms); tf32 (NVIDIA GPUs from Ampere on), bf16 (CPU or GPU) and fp16 (GPU) "
        "trade accuracy for speed; the maps are stored as float32."
    ) in cam
    assert "--dtype" not in cam
    for command in ("extract", "grad"):
        text = _words(runner.invoke(main, [command, "--help"]).stdout)
        assert "fp16 (GPU) trade accuracy for speed; what is stored is --dtype." in text


def test_output_help_states_the_naming_rule(runner):
    for command in ("extract", "grad"):
        text = _words(runner.invoke(main, [command, "--help"]).stdout)
        assert (
            "-o, --output PATH Output safetensors file: any name but one ending in another format's suffix "
            "(.pt, .npy, .json…), which is refused;"
        ) in text


# -- folders with sub-folders ----------------------------------------------------------------------


def test_a_folder_without_recursive_notes_the_images_its_sub_folders_hold(runner, nested, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out.safetensors\n", LEFT_OUT)
    with safe_open("out.safetensors", "pt") as written:
        assert written.get_slice("layer1").get_shape()[0] == 3
    result = runner.invoke(main, [*EXTRACT, "-o", "all.safetensors", "-r", "imgs"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "all.safetensors\n", "")
    with safe_open("all.safetensors", "pt") as written:
        assert written.get_slice("layer1").get_shape()[0] == 6


def test_the_python_api_reports_the_left_out_images_as_a_note_event(nested):
    events = []
    features = hookcli.extract("resnet18", "layer1", nested, progress=events.append, **SMALL)
    assert [e for e in events if isinstance(e, Note)] == [Note(LEFT_OUT[len("Note: ") : -1])]
    assert features.notes == (LEFT_OUT[len("Note: ") : -1],)
    assert features["layer1"].shape[0] == 3


def test_no_note_without_images_in_sub_folders(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs" / "empty").mkdir()
    (tmp_path / "imgs" / "texts").mkdir()
    (tmp_path / "imgs" / "texts" / "a.txt").write_text("text")
    (tmp_path / "imgs" / "texts" / ".hidden.png").write_bytes(b"")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out.safetensors\n", "")


def test_counting_left_out_images_stops_at_a_bound_and_says_at_least(nested, monkeypatch):
    found = find_inputs([str(nested)])
    assert (len(found.paths), found.left_out, found.left_out_folders, found.counted_all) == (3, 3, 2, True)
    assert find_inputs([str(nested)], recursive=True).note is None
    monkeypatch.setattr("hookcli.inputs.discovery.LEFT_OUT_BOUND", 2)
    assert find_inputs([str(nested)]).note == (
        "at least 2 images in at least 1 sub-folder were left out; -r (--recursive) includes them"
    )
    (nested / "sub" / "e.png").unlink()
    (nested / "sub" / "deeper" / "f.png").unlink()
    monkeypatch.setattr("hookcli.inputs.discovery.LEFT_OUT_BOUND", 1000)
    assert find_inputs([str(nested)]).note == "1 image in 1 sub-folder was left out; -r (--recursive) includes them"


# -- output names ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["out.pt", "OUT.NPY", "feats.json", "sub/grid.png", "x.h5"])
def test_an_output_named_like_another_format_is_refused_before_the_model_loads(
    runner, images, tmp_path, monkeypatch, no_model, name
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    stem, suffix = name.rsplit(".", 1)
    for command in (EXTRACT, ["grad", *EXTRACT[1:]]):
        result = runner.invoke(main, [*command, "-o", name, "imgs/a.png"])
        assert (result.exit_code, result.stdout, result.stderr) == (
            2,
            "",
            f"Error: output '{name}' ends in .{suffix}, the suffix of another format. Hint: hookcli writes "
            f"safetensors: name it '{stem}.safetensors', or end the path with / for a shard folder\n",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "sub"]


def test_the_python_api_refuses_an_output_named_like_another_format(images, tmp_path, no_model):
    for function in (hookcli.extract, hookcli.grad):
        with pytest.raises(UsageProblem) as refused:
            function("resnet18", "layer1", images[0], output=tmp_path / "feats.pth", **SMALL)
        assert str(refused.value) == (
            f"output '{tmp_path / 'feats.pth'}' ends in .pth, the suffix of another format. "
            f"Hint: hookcli writes safetensors: name it '{tmp_path / 'feats.safetensors'}', "
            "or end the path with / for a shard folder"
        )
        assert refused.value.exit_code == 2
    with pytest.raises(UsageProblem) as refused:  # stats writes one file: no shard folder is offered
        hookcli.stats("resnet18", "layer1", images[0], output=tmp_path / "s.pt", **SMALL)
    assert refused.value.hint == f"hookcli writes safetensors: name it '{tmp_path / 's.safetensors'}'"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]


def test_an_output_without_a_suffix_or_with_an_unknown_one_is_written_as_safetensors(
    runner, images, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for name in ("feats", "resnet18.layer1"):
        result = runner.invoke(main, [*EXTRACT, "-o", name, "imgs/a.png"])
        assert (result.exit_code, result.stdout, result.stderr) == (0, f"{name}\n", "")
        with safe_open(name, "pt") as written:
            assert written.keys() == ["layer1"]


# -- an unreadable image in a folder ---------------------------------------------------------------


def test_an_unreadable_image_in_a_folder_names_on_error_skip(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs" / "b2.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs"])
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        "",
        "Error: 'imgs/b2.jpg' is not an image Pillow can read. Hint: check the file type; text or corrupt "
        "files cannot be used; or add --on-error skip to leave unreadable images out\n",
    )
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "--on-error", "skip", "imgs"])
    assert (result.exit_code, result.stdout) == (0, "out.safetensors\n")


# -- options given to the wrong command ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["cam", "--dtype", "float16", "img.png"],
            "No such option: --dtype (it belongs to 'hookcli extract' and 'hookcli grad'). "
            "Hint: see 'hookcli cam --help'",
        ),
        (
            ["grid", "f.safetensors", "--layer", "layer1"],
            "No such option: --layer (it belongs to 'hookcli ablate', 'hookcli extract', 'hookcli grad', "
            "'hookcli cam', 'hookcli stats', 'hookcli compare' and 'hookcli patch'). Hint: see 'hookcli grid --help'",
        ),
        (
            ["grad", "--no-fuse", "img.png"],
            "No such option: --no-fuse (it belongs to 'hookcli extract', 'hookcli stats' and 'hookcli compare'). "
            "Hint: see 'hookcli grad --help'",
        ),
        (
            ["info", "--input-size=64", "f.safetensors"],
            "No such option: --input-size (it belongs to 'hookcli layers'). Hint: see 'hookcli info --help'",
        ),
        (
            ["--pool", "avg"],
            "No such option: --pool (it belongs to 'hookcli extract' and 'hookcli compare'). "
            "Hint: see 'hookcli --help'",
        ),
    ],
)
def test_an_option_of_another_command_says_whose_it_is(runner, args, message):
    result = runner.invoke(main, args)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"Error: {message}\n")


def test_grids_channels_given_to_extract_names_grid(runner):
    result = runner.invoke(main, ["extract", "--channels", "0:4", "img.png"])
    assert (result.exit_code, result.stdout) == (2, "")
    # Other commands that draw pictures may take it too; they are listed after grid.
    assert result.stderr.startswith("Error: No such option: --channels (it belongs to 'hookcli grid'")
    assert result.stderr.endswith("). Hint: see 'hookcli extract --help'\n") and result.stderr.count("\n") == 1


def test_an_option_no_command_has_keeps_clicks_message(runner):
    result = runner.invoke(main, ["extract", "--chanels", "0:4"])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: No such option") and "belongs" not in result.stderr


def test_options_of_a_newly_registered_command_are_found_too(runner, monkeypatch):
    monkeypatch.setitem(main.commands, "stats", click.Command("stats", params=[click.Option(["--bins"])]))
    result = runner.invoke(main, ["extract", "--bins", "8"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: No such option: --bins (it belongs to 'hookcli stats'). Hint: see 'hookcli extract --help'\n",
    )


# -- Install instructions -------------------------------------------------------------------------

ROOT = Path(__file__).parent.parent
CPU_ONLY = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu\n"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start:end]


@pytest.mark.parametrize(
    ("page", "heading", "install"),
    [
        ("README.md", "## Install", "pip install .\n"),
        ("docs/installation.md", "## On a machine without a GPU", "pip install .\n"),
        ("CONTRIBUTING.md", "## Set up", 'pip install -e ".[test]"\n'),
    ],
)
def test_install_instructions_put_cpu_only_torch_first_and_say_what_the_cuda_build_weighs(page, heading, install):
    text = (ROOT / page).read_text()
    section = _section(text, heading)
    assert CPU_ONLY in section
    assert section.index(CPU_ONLY) < section.rindex(install)
    assert "5.5 GB" in text


def test_contributing_says_how_long_the_tests_take_and_what_the_browser_test_needs():
    tests = _section((ROOT / "CONTRIBUTING.md").read_text(), "## Run the tests")
    assert "`pytest -n auto` needs no network and takes 7 to 9 minutes on a 2-core machine" in tests
    assert "`chromium` and `chromium-driver`" in tests


def test_the_commands_page_and_the_readme_name_every_command_the_cli_has():
    commands = set(main.commands)
    page = (ROOT / "docs" / "commands.md").read_text()
    numbers = {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14}
    count = re.search(r"hookcli has (\w+) commands", page)
    assert count is not None and numbers.get(count[1]) == len(commands)
    assert set(re.findall(r"^## `hookcli (\w+)`", page, flags=re.MULTILINE)) == commands
    intro = page.split("\n## ")[0]
    assert set(re.findall(r"`(\w+)`", intro)) == commands
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| [Commands]"))
    assert set(re.findall(r"`(\w+)`", row)) == commands


# -- hookcli doctor ---------------------------------------------------------------------------------


def test_doctor_says_the_pair_loads_and_what_each_extra_is(runner):
    done = runner.invoke(main, ["doctor"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    versions = f"torch {metadata.version('torch')}, torchvision {metadata.version('torchvision')}"
    slower = ". Hint: --compile runs slower on Python 3.13.0; 3.13.1 or later mends it"  # that Python alone
    said = re.escape(platform.python_version() + (slower if platform.python_version() == "3.13.0" else ""))
    assert re.fullmatch(rf"ok +python +{said}", lines[0])
    assert re.fullmatch(rf"ok +torch and torchvision +{re.escape(versions)}: they load together", lines[1])
    assert lines[2].startswith("ok  devices") and re.search(r"\d+ cores? for this process", lines[2])
    import torch

    gpu = ["GPU JPEG decoding"] if torch.cuda.is_available() else []  # on a CUDA machine, --decode device's check
    assert [line.split("  ")[1].strip() for line in lines[3:]] == [
        *gpu,
        "video files (av)",
        "timm: models (timm)",
        "hf: models (transformers)",
        "open_clip: models (open_clip)",
        "weights cache",
        "Hugging Face cache",  # the extras installed here bring the hub
    ]
    checks = json.loads(runner.invoke(main, ["doctor", "--json"]).stdout)
    assert [check["ok"] for check in checks[:2]] == [True, True] and sorted(checks[0]) == [
        "detail",
        "hint",
        "name",
        "ok",
    ]


def test_doctor_says_why_cuda_did_not_start_which_a_run_keeps_quiet(runner, monkeypatch, photo):
    import warnings

    import torch

    def failing() -> bool:  # as torch does under a memory limit
        warnings.warn("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 2: out of memory")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", failing)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    devices = next(line for line in runner.invoke(main, ["doctor"]).stdout.splitlines() if "devices" in line)
    assert devices.endswith(
        "no GPU: runs on the CPU (CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 2: out of "
        "memory)"
    )
    done = runner.invoke(main, ["extract", "-m", "resnet18", "-w", "none", "-l", "fc", "--resize", "32", "--crop", "32",
                                "-q", "-o", "-", str(photo)])  # fmt: skip
    assert done.exit_code == 0 and done.stderr == ""


def test_doctor_names_a_mismatched_pair_and_how_to_mend_it(runner, monkeypatch):
    import torchvision

    def mismatched(*args):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(torchvision.ops, "nms", mismatched)
    done = runner.invoke(main, ["doctor"])
    assert done.exit_code == 1
    pair = done.stdout.splitlines()[1]
    assert re.fullmatch(
        r"FAILED +torch and torchvision +torch \S+, torchvision \S+: operator torchvision::nms does not exist\. Hint: "
        r"torch and torchvision are builds that do not match: install them as a pair, from one index \(pip install "
        r'--force-reinstall "torch" "torchvision"\)',
        pair,
    ), pair
    assert "devices" not in done.stdout  # nothing that needs the pair is tried
    assert done.stderr == ("Error: 1 check failed: torch and torchvision. Hint: its line above says what to do\n")


def test_doctor_gives_the_install_line_of_an_absent_extra(monkeypatch):
    from hookcli.run import environment

    real = environment.version

    def without_av(name):
        if name == "av":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(environment, "version", without_av)
    _doctor_says("video files (av)", None, "not installed", 'pip install "hookcli[video]"')


def test_doctor_says_that_python_3_13_0_slows_compiled_runs(monkeypatch):
    from hookcli.run import environment

    monkeypatch.setattr(environment.platform, "python_version_tuple", lambda: ("3", "13", "0"))
    monkeypatch.setattr(environment.platform, "python_version", lambda: "3.13.0")
    _doctor_says("python", True, "3.13.0", "--compile runs slower on Python 3.13.0; 3.13.1 or later mends it")


def test_doctor_counts_the_models_in_the_hugging_face_cache_it_reads_offline(monkeypatch, tmp_path):
    from huggingface_hub import constants

    for kept in ("models--org--one", "models--org--two", "datasets--org--three", "version.txt"):
        (tmp_path / kept).mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    said = f"{tmp_path}: 2 models; read offline, never downloaded"
    _doctor_says("Hugging Face cache", True, said, None)
    (tmp_path / "models--org--two").rmdir()
    _doctor_says("Hugging Face cache", True, said.replace("2 models", "1 model"), None)


def _doctor_says(name: str, ok: bool | None, detail: str, hint: str | None) -> None:
    """``hookcli.doctor()``'s check ``name`` is exactly this."""
    found = next(check for check in hookcli.doctor() if check["name"] == name)
    assert found == {"name": name, "ok": ok, "detail": detail, "hint": hint}


def _code_lines(text: str, language: str) -> list[str]:
    """The lines of a page's ``language`` code blocks, comments and trailing spaces left out."""
    blocks = re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)
    lines = [re.sub(r"\s+#.*$", "", line).rstrip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def test_the_tour_page_runs_every_line_of_the_readmes_tour():
    readme = _section((ROOT / "README.md").read_text(), "## A five-minute tour")
    tour = (ROOT / "docs" / "tour.md").read_text()
    for language in ("bash", "python"):
        missing = [line for line in _code_lines(readme, language) if line not in _code_lines(tour, language)]
        assert missing == [], language
