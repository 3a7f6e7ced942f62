"""Hostile model sources: Hugging Face configs that ask for absurd sizes, files that are FIFOs or link loops,
unusable preprocessor settings, weights of dtypes that do not cast faithfully, and a report page size that cannot
be."""

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hookcli.cli import main
from hookcli.errors import WeightsError
from hookcli.models.loading import load_model

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

FACTORY = """
import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
"""
IMAGENET = "mean 0.485,0.456,0.406, std 0.229,0.224,0.225"


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory) -> Path:
    """A tiny transformers ViT written by save_pretrained, with its image processor (squash to 64x64)."""
    folder = tmp_path_factory.mktemp("hf") / "tiny-vit"
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=64, patch_size=16
    )
    torch.manual_seed(0)
    transformers.ViTModel(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(folder)
    return folder


def _copy_with(vit_folder: Path, tmp_path: Path, name: str, **changes) -> Path:
    """A copy of ``vit_folder`` whose file ``name`` has ``changes`` (JSON fields) made."""
    folder = tmp_path / "changed"
    shutil.copytree(vit_folder, folder)
    settings = json.loads((folder / name).read_text())
    (folder / name).write_text(json.dumps({**settings, **changes}))
    return folder


@pytest.fixture
def image_file(tmp_path, make_image):
    return make_image(tmp_path / "a.png", size=(40, 40))


@pytest.fixture
def factory_file(tmp_path) -> Path:
    path = tmp_path / "nets.py"
    path.write_text(FACTORY)
    return path


# -- Hugging Face configs that ask for more than any machine holds ---------------------------------------------


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"num_hidden_layers": 1000000}, "num_hidden_layers 1000000, more than hookcli builds (at most 1,024)"),
        ({"hidden_size": 1e9}, "hidden_size 1000000000.0, more than hookcli builds (at most 16,384)"),
        ({"image_size": 10000000}, "image_size 10000000, more than hookcli builds (at most 8,192)"),
        ({"image_size": [64, 10000000]}, "image_size [64, 10000000], more than hookcli builds (at most 8,192)"),
        ({"num_labels": 10**9}, "num_labels 1000000000, more than hookcli builds (at most 1,000,000)"),
        ({"intermediate_size": math.inf}, "intermediate_size Infinity, more than hookcli builds (at most 131,072)"),
        (
            {"vision_config": {"hidden_size": 32, "patch_size": 10**12}},
            "vision_config.patch_size 1000000000000, more than hookcli builds (at most 8,192)",
        ),
        ({"depths": [1] * 100}, "depths with 100 entries, more than hookcli builds (at most 64)"),
    ],
)
def test_a_config_asking_for_absurd_sizes_is_refused_naming_the_field(runner, vit_folder, tmp_path, changes, said):
    folder = _copy_with(vit_folder, tmp_path, "config.json", **changes)
    for weights in ("none", "DEFAULT"):
        result = runner.invoke(main, ["layers", "-m", f"hf:{folder}", "-w", weights])
        assert (result.exit_code, result.output) == (
            2,
            f"Error: hf:{folder}: its config.json says {said}. Hint: check the model's config.json\n",
        )


def test_a_config_at_generous_sizes_still_builds(vit_folder, tmp_path):
    folder = _copy_with(vit_folder, tmp_path, "config.json", num_labels=1000, image_size=128)
    loaded = load_model(f"hf:{folder}", "none")
    assert loaded.module.config.image_size == 128


# -- files that are not regular files ---------------------------------------------------------------------------


def test_a_factory_file_that_is_a_link_loop_or_a_fifo_says_so(runner, tmp_path, no_model, image_file):
    loop, fifo = tmp_path / "loop.py", tmp_path / "fifo.py"
    os.symlink(tmp_path / "other.py", loop)
    os.symlink(loop, tmp_path / "other.py")
    os.mkfifo(fifo)
    hint = "Hint: check the path of --model FILE.py:FUNC"
    for path, what in [
        (loop, "is a symbolic link loop"),
        (fifo, "is a FIFO (named pipe), not a regular file"),
        (tmp_path / "gone.py", "not found"),
    ]:
        result = runner.invoke(main, ["extract", "-m", f"{path}:make", "-l", "0", str(image_file)])
        assert (result.exit_code, result.output) == (2, f"Error: factory file '{path}' {what}. {hint}\n")


def test_a_hugging_face_config_that_is_a_fifo_says_so(runner, vit_folder, tmp_path, no_model, image_file):
    folder = tmp_path / "piped"
    shutil.copytree(vit_folder, folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    result = runner.invoke(main, ["extract", "-m", f"hf:{folder}", "-l", "pooler", str(image_file)])
    assert (result.exit_code, result.output) == (
        2,
        (
            f"Error: '{folder}' (from hf:{folder}) is a folder whose config.json is a FIFO (named pipe), not a regular "
            "file. Hint: give a folder written by save_pretrained, or hf:ORG/NAME from the cache\n"
        ),
    )


def test_a_preprocessor_config_that_is_a_fifo_is_named_in_the_note(vit_folder, tmp_path):
    folder = tmp_path / "piped"
    shutil.copytree(vit_folder, folder)
    (folder / "preprocessor_config.json").unlink()
    os.mkfifo(folder / "preprocessor_config.json")
    assert load_model(f"hf:{folder}", "none").notes == (
        f"hf:{folder}: its preprocessor_config.json cannot be used (it is a FIFO (named pipe), not a regular file), "
        f"so what --resize, --crop, --mean and --std do not set is ImageNet's preprocessing (resize 73, crop 64, "
        f"{IMAGENET})",
    )


# -- notes that say what a run uses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"image_mean": [math.nan, 0.5, 0.5]}, "its image_mean [nan, 0.5, 0.5] is not finite numbers"),
        ({"image_std": [0, 0.5, 0.5]}, "its image_std [0, 0.5, 0.5] is not finite numbers above 0"),
        ({"image_std": 0.5, "image_mean": "dark"}, "its image_mean 'dark' is not one or three numbers"),
        ({"size": {"height": -64, "width": 64}}, "its size.height -64 is not a whole number of pixels from 1 to 8192"),
        (
            {"size": {"shortest_edge": 64}, "do_center_crop": True, "crop_size": {"height": -3, "width": -3}},
            "its crop_size.height -3 is not a whole number of pixels from 1 to 8192",
        ),
        ({"size": {"shortest_edge": 64}, "crop_pct": 0}, "its crop_pct 0 is not a fraction above 0 and at most 1"),
        ({"rescale_factor": math.nan}, "its rescale_factor nan is not 1/255"),
        ({"resample": 9}, "its resample 9 is none of nearest (0), bilinear (2) and bicubic (3)"),
    ],
)
def test_an_unusable_preprocessor_field_is_named_in_the_note(runner, vit_folder, tmp_path, image_file, changes, reason):
    folder = _copy_with(vit_folder, tmp_path, "preprocessor_config.json", **changes)
    note = (
        f"hf:{folder}: its preprocessor_config.json cannot be used ({reason}), so what --resize, --crop, --mean "
        f"and --std do not set is ImageNet's preprocessing (resize 73, crop 64, {IMAGENET})"
    )
    assert load_model(f"hf:{folder}", "none").notes == (note,)
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            f"hf:{folder}",
            "-w",
            "none",
            "-l",
            "pooler",
            "-o",
            str(tmp_path / "f.safetensors"),
            str(image_file),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"Note: {note}\n" in result.stderr


def test_the_assumed_preprocessing_note_lists_only_what_the_run_takes_from_imagenet(factory_file):
    loaded = load_model(f"{factory_file}:make", "none")
    start = (
        f"{factory_file}:make: the factory gives no preprocessing, so what --resize, --crop, --mean and --std do "
        "not set is ImageNet's preprocessing"
    )
    assert loaded.notes_for({}) == loaded.notes == (f"{start} (resize 256, crop 224, {IMAGENET})",)
    assert loaded.notes_for({"resize": 8, "crop": 8, "mean": None}) == (f"{start} ({IMAGENET})",)
    assert loaded.notes_for({"mean": (0.5,) * 3, "crop": 8}) == (f"{start} (resize 256, std 0.229,0.224,0.225)",)
    assert loaded.notes_for({"resize": 8, "crop": 8, "mean": (0.5,) * 3, "std": (0.5,) * 3}) == ()


# -- weights that do not cast faithfully into the model -------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
)
def test_weights_of_a_dtype_that_does_not_cast_into_floats_are_refused(runner, factory_file, tmp_path, dtype):
    state = load_model(f"{factory_file}:make", "none").module.state_dict()
    state["0.weight"] = state["0.weight"].to(dtype)
    path = tmp_path / "w.pth"
    torch.save(state, path)
    name = str(dtype).removeprefix("torch.")
    message = (
        f"weights file '{path}' holds 0.weight as {name} and the model takes float32: hookcli does not cast "
        f"{name} into float32. Hint: save the model's float weights (dequantized ones, for a quantized model)"
    )
    with pytest.raises(WeightsError) as caught:
        load_model(f"{factory_file}:make", str(path))
    assert str(caught.value) == message
    result = runner.invoke(main, ["layers", "-m", f"{factory_file}:make", "-w", str(path)])
    assert (result.exit_code, result.output) == (1, f"Error: {message}\n")


def test_half_precision_weights_and_integer_counters_of_another_width_load(factory_file, tmp_path):
    model = load_model(f"{factory_file}:make", "none").module
    state = {
        key: value.half() if value.is_floating_point() else value.int() for key, value in model.state_dict().items()
    }
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    loaded = load_model(f"{factory_file}:make", str(path)).module.state_dict()
    assert torch.equal(loaded["0.weight"], state["0.weight"].float())
    assert loaded["1.num_batches_tracked"].dtype == torch.int64


def test_a_float_into_an_integer_counter_is_refused(factory_file, tmp_path):
    state = load_model(f"{factory_file}:make", "none").module.state_dict()
    state["1.num_batches_tracked"] = state["1.num_batches_tracked"].float()
    path = tmp_path / "w.pth"
    torch.save(state, path)
    with pytest.raises(WeightsError) as caught:
        load_model(f"{factory_file}:make", str(path))
    assert caught.value.message == (
        f"weights file '{path}' holds 1.num_batches_tracked as float32 and the model "
        "takes int64: hookcli does not cast float32 into int64"
    )


# -- a report page size that cannot be ------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["99999999999999999999", "10001"])
def test_a_report_page_size_above_the_maximum_is_a_usage_error(runner, factory_file, tmp_path, image_file, size):
    features = tmp_path / "f.safetensors"
    made = runner.invoke(
        main,
        [
            "extract",
            "-m",
            f"{factory_file}:make",
            "-l",
            "0",
            "--resize",
            "32",
            "--crop",
            "32",
            "-q",
            "-o",
            str(features),
            str(image_file),
        ],
    )
    assert made.exit_code == 0, made.output
    result = runner.invoke(main, ["report", str(features), "--page-size", size, "-o", str(tmp_path / "r")])
    assert (result.exit_code, result.output) == (
        2,
        f"Error: page_size must be at most 10000, not {size}. Hint: see --help for the values each option takes\n",
    )
    assert not (tmp_path / "r").exists()
