"""hookcli extract through CliRunner: the file it writes, its inputs and outputs, its errors."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load as load_bytes
from torchvision.models.feature_extraction import create_feature_extractor

from hookcli.cli import main
from hookcli.inputs.images import load_rgb
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_transform
from hookcli.models.loading import load_model

SMALL = ["--resize", "64", "--crop", "64"]


def _read(path):
    with safe_open(str(path), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


def _fx_reference(model_name, node, paths, preprocess):
    model = load_model(model_name, "none", seed=0).module
    batch = torch.stack([to_transform(preprocess)(load_rgb(p)) for p in paths])
    with torch.inference_mode():
        return create_feature_extractor(model, return_nodes=[node])(batch)[node]


def test_vgg16_bn_features_18_matches_the_fx_extractor(runner, photo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        main,
        [
            "extract",
            "--model",
            "vgg16_bn",
            "--layer",
            "features.18",
            "--weights",
            "none",
            "--memory-format",
            "contiguous",
            "--no-fuse",
            "-d",
            "cpu",  # the reference is the CPU's, to the bit
            *SMALL,
            str(photo),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "vgg16_bn-features.18.safetensors\n"
    tensors, metadata = _read(tmp_path / "vgg16_bn-features.18.safetensors")
    expected = _fx_reference("vgg16_bn", "features.18", [photo], Preprocess(resize=64, crop=64))
    assert list(tensors) == ["features.18"]
    assert tensors["features.18"].shape == (1, 256, 16, 16)
    assert torch.equal(tensors["features.18"], expected)
    assert (tensors["features.18"] < 0).any()  # BatchNorm output, before the in-place ReLU
    assert (metadata["precision"], metadata["memory_format"], metadata["fused"]) == ("fp32", "contiguous", "0")

    # The default runs convolutional models channels-last; --fuse fuses convolution chains outside the hooked layer
    # even for one image (by default only runs of 16 images or more are fused): other kernels, the same values to
    # fp32 rounding.
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "vgg16_bn",
            "-l",
            "features.18",
            "-w",
            "none",
            "--fuse",
            "-d",
            "cpu",  # fusion is the CPU's
            *SMALL,
            "-o",
            "cl.safetensors",
            str(photo),
        ],
    )
    assert result.exit_code == 0, result.output
    channels_last, metadata = _read(tmp_path / "cl.safetensors")
    assert (metadata["memory_format"], metadata["fused"]) == ("channels_last", "5")  # convolutions before 17
    assert channels_last["features.18"].is_contiguous()
    torch.testing.assert_close(channels_last["features.18"], expected, rtol=1e-5, atol=1e-5)

    assert metadata["format"] == "1" and metadata["producer"] == "hookcli"
    assert metadata["model"] == "vgg16_bn" and metadata["capture"] == "output" and metadata["device"] == "cpu"
    assert json.loads(metadata["inputs"]) == [str(photo)]
    assert json.loads(metadata["weights"]) == {"source": "none", "seed": 0}
    assert json.loads(metadata["layers"]) == {
        "features.18": {"key": "features.18", "type": "BatchNorm2d", "calls": 1, "keys": ["features.18"], "units": 256}
    }
    assert json.loads(metadata["preprocess"]) == {
        "resize": 64,
        "crop": 64,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "interpolation": "bilinear",
        "antialias": True,
        "fast_decode": False,
        "kind": "classification",
    }
    assert metadata["family"] == "classification"
    assert set(json.loads(metadata["versions"])) == {"hookcli", "torch", "torchvision", "safetensors", "pillow"}


@pytest.mark.parametrize("via", ["arguments", "stdin"])
def test_rows_follow_input_order(runner, resnet18_args, images, tmp_path, via):
    order = [images[2], images[0], images[1]]
    out = tmp_path / "out.safetensors"
    args = resnet18_args(
        "extract", "-l", "layer2", "-l", "fc=logits", "-b", "2", *SMALL, "--device", "cpu", "-o", str(out)
    )
    if via == "stdin":
        result = runner.invoke(main, [*args, "-"], input="".join(f"{p}\n" for p in order))
    else:
        result = runner.invoke(main, [*args, *map(str, order)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out}\n"
    tensors, metadata = _read(out)
    assert sorted(tensors) == ["layer2", "logits"]
    assert json.loads(metadata["inputs"]) == [str(p) for p in order]
    expected = _fx_reference("resnet18", "layer2", order, Preprocess(resize=64, crop=64))
    # Batches of 2 + 1 here versus one batch of 3 in the reference: CPU kernels round differently per batch shape.
    torch.testing.assert_close(tensors["layer2"], expected, rtol=1e-5, atol=1e-5)
    assert (tensors["layer2"][0] - tensors["layer2"][1]).abs().max() > 0.1  # rows really differ, so order matters
    assert tensors["logits"].shape == (3, 1000)


def test_capture_both_and_repeated_modules_get_documented_keys(runner, resnet18_args, images, tmp_path):
    out = tmp_path / "o.safetensors"
    result = runner.invoke(
        main,
        resnet18_args("extract", "-l", "layer1.0.relu", "--capture", "both", *SMALL, "-o", str(out), str(images[0])),
    )
    assert result.exit_code == 0, result.output
    tensors, metadata = _read(out)
    keys = ["layer1.0.relu:0", "layer1.0.relu:0@input", "layer1.0.relu:1", "layer1.0.relu:1@input"]
    assert sorted(tensors) == keys
    assert json.loads(metadata["layers"])["layer1.0.relu"]["calls"] == 2
    assert sorted(json.loads(metadata["layers"])["layer1.0.relu"]["keys"]) == keys


def test_stdout_output_is_the_safetensors_bytes(runner, resnet18_args, images):
    result = runner.invoke(main, resnet18_args("extract", "-l", "avgpool", *SMALL, "-o", "-", *map(str, images)))
    assert result.exit_code == 0, result.stderr
    tensors = load_bytes(result.stdout_bytes)
    assert tensors["avgpool"].shape == (3, 512, 1, 1)


def test_existing_output_needs_force_and_is_left_untouched(runner, resnet18_args, images, tmp_path):
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"precious")
    args = resnet18_args("extract", "-l", "avgpool", *SMALL, "-o", str(out), str(images[0]))
    result = runner.invoke(main, args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: output '{out}' already exists. Hint: add --force to overwrite it\n"
    assert out.read_bytes() == b"precious"
    result = runner.invoke(main, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert _read(out)[0]["avgpool"].shape == (1, 512, 1, 1)


def test_a_failure_mid_run_leaves_no_file(runner, resnet18_args, images, tmp_path, make_image):
    broken = tmp_path / "imgs" / "broken.jpg"
    make_image(tmp_path / "whole.jpg", size=(64, 64))
    data = (tmp_path / "whole.jpg").read_bytes()
    broken.write_bytes(data[: len(data) // 3])
    out = tmp_path / "out" / "o.safetensors"
    out.parent.mkdir()
    result = runner.invoke(
        main,
        resnet18_args(
            "extract", "-l", "layer1", "-b", "1", *SMALL, "-o", str(out), str(images[0]), str(broken), str(images[1])
        ),
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: cannot decode image '{broken}': image file is truncated")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert list(out.parent.iterdir()) == []


def test_default_name_for_several_layers_and_a_folder_input(runner, resnet18_args, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, resnet18_args("extract", "-l", "layer3.*.conv2", *SMALL, str(images[0].parent)))
    assert result.exit_code == 0, result.output
    assert result.stdout == "resnet18-2layers.safetensors\n"
    tensors, metadata = _read(tmp_path / "resnet18-2layers.safetensors")
    assert sorted(tensors) == ["layer3.0.conv2", "layer3.1.conv2"]
    assert [Path(p).name for p in json.loads(metadata["inputs"])] == ["a.png", "b.png", "c.png"]


CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))


def test_the_shipped_presets_exist_and_load():
    from hookcli.cli.presets import read_config

    names = {p.name for p in CONFIGS}
    assert {"vgg16_bn-features18.toml", "resnet50-stages.toml", "vit_b_16-block.toml"} <= names
    allowed = {p.name: p.name for p in main.commands["extract"].params}
    presets = {p.name: read_config(p, allowed=allowed) for p in CONFIGS}
    assert presets["vgg16_bn-features18.toml"]["model"] == "vgg16_bn"
    assert presets["vgg16_bn-features18.toml"]["layer"] == ["features.18"]
    assert presets["resnet50-stages.toml"]["layer"] == ["layer1", "layer2", "layer3", "layer4"]


@pytest.mark.parametrize("preset", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_preset_runs_with_flags_winning(runner, images, tmp_path, preset):
    out = tmp_path / "o.safetensors"
    result = runner.invoke(
        main, ["extract", "--config", str(preset), "--weights", "none", "-b", "1", "-q", "-o", str(out), str(images[0])]
    )
    assert result.exit_code == 0, result.output
    tensors, metadata = _read(out)
    layers = json.loads(metadata["layers"])
    assert json.loads(metadata["weights"]) == {"source": "none", "seed": 0}  # the flag beat the preset's DEFAULT
    assert tensors and all(v.shape[0] == 1 for v in tensors.values())
    assert sorted(k for layer in layers.values() for k in layer["keys"]) == sorted(tensors)


def test_config_values_apply_and_flags_override_them(runner, images, tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text(
        'model = "resnet18"\nweights = "none"\nlayers = ["layer1", "layer2"]\nresize = 40\n'
        "crop = 32\nmean = [0.5, 0.5, 0.5]\nbatch-size = 2\n"
    )
    out = tmp_path / "o.safetensors"
    result = runner.invoke(
        main, ["extract", "-c", str(preset), "--crop", "48", "-l", "layer3", "-o", str(out), str(images[0])]
    )
    assert result.exit_code == 0, result.output
    tensors, metadata = _read(out)
    assert list(tensors) == ["layer3"] and tensors["layer3"].shape == (1, 256, 3, 3)
    preprocess = json.loads(metadata["preprocess"])
    assert (preprocess["resize"], preprocess["crop"], preprocess["mean"]) == (40, 48, [0.5, 0.5, 0.5])


def _error(result):
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_errors_are_one_line_with_a_hint(runner, resnet18_args, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    (tmp_path / "empty").mkdir()
    bad_preset = tmp_path / "bad.toml"
    bad_preset.write_text('model = "resnet18"\nlayer_s = ["x"]\n')
    base = resnet18_args("extract", *SMALL)
    cases = [
        (
            [*base, "-l", "layer1", "missing.png"],
            2,
            "Error: no such file or folder: 'missing.png'. Hint: check the path",
        ),
        (
            [*base, "-l", "layer1", str(text)],
            1,
            f"Error: '{text}' is not an image Pillow can read. Hint: check the file type; text or corrupt files "
            "cannot be used; or add --on-error skip to leave unreadable images out",
        ),
        (
            ["extract", "-m", "resnet5", "-l", "layer1", str(images[0])],
            2,
            "Error: unknown model 'resnet5' (closest: resnet50, resnet152, resnet34). "
            "Hint: 'hookcli models' lists every model",
        ),
        (
            [*base, "-l", "layer5", str(images[0])],
            2,
            "Error: no layer 'layer5' in resnet18 (closest: layer4, layer3, layer2). "
            "Hint: run 'hookcli layers --model resnet18' to list them",
        ),
        (
            [*base, "-l", "layer1", str(tmp_path / "empty")],
            2,
            f"Error: no images found in folder '{tmp_path / 'empty'}'. Hint: image files end in one of .bmp, .gif, "
            ".jfif, .jpeg, .jpg, .pbm, .pgm, .png, .ppm, .tif, .tiff, .webp",
        ),
        (
            [*base, "-l", "layer1"],
            2,
            "Error: no input images were given. Hint: pass image files or folders, or '-' to read paths from stdin",
        ),
        (
            ["extract", "-m", "resnet18", "--seed", "3", "-l", "layer1", str(images[0])],
            2,
            "Error: --seed only applies to --weights none and to resample's pairing (pretrained and file weights are "
            "fixed). Hint: see 'hookcli extract --help'",
        ),
        (
            ["extract", "-c", str(bad_preset), str(images[0])],
            2,
            f"Error: config '{bad_preset}' has an unknown option 'layer_s'. Hint: did you mean 'layer'? valid options: "
            "attention, batch_size, capture, capture_edited, clip_length, clips_per_video, compile, crop, decode, "
            "detections, "
            "device, dtype, fast_decode, flow, force, frame_stride, fuse, grid, interpolation, intervene, layer, mean, "
            "memory_format, model, on_error, output, pair_with, pool, precision, quiet, recursive, resize, seed, "
            "shard_size, std, weights, workers",
        ),
        (
            [*base, "-l", "layer1", "--mean", "1,2", str(images[0])],
            2,
            "Error: Invalid value for '--mean': '1,2' has 2 values; give one or three (R,G,B). "
            "Hint: see 'hookcli extract --help'",
        ),
        (
            [*base, "-l", "layer1", "--device", "tpu", str(images[0])],
            2,
            "Error: Invalid value for '--device' / '-d': 'tpu' is not a device; use auto, cpu, cuda, cuda:N or mps. "
            "Hint: see 'hookcli extract --help'",
        ),
        (
            [*base, "-l", "layer1", "--device", "cuda:1", str(images[0])],
            2,
            "Error: CUDA is not available on this machine. Hint: use --device cpu (or auto)",
        )
        if not torch.cuda.is_available()
        else (
            [*base, "-l", "layer1", "--device", f"cuda:{torch.cuda.device_count()}", str(images[0])],
            2,
            f"Error: there is no GPU cuda:{torch.cuda.device_count()} (this machine has {torch.cuda.device_count()}). "
            f"Hint: use cuda:0 … cuda:{torch.cuda.device_count() - 1}",
        ),
        (
            ["extract", "-m", "googlenet", "-w", "none", "-l", "aux1", "-l", "inception3a", *SMALL, str(images[0])],
            1,
            "Error: layer aux1 never ran during the forward pass. Hint: the model defines it but does not call it "
            "(in eval mode); pick another with 'hookcli layers'",
        ),
        (
            ["extract", "-m", "resnet18", "-l", "layer1", str(images[0])],
            1,
            "Error: pretrained weights ResNet18_Weights.IMAGENET1K_V1 are not cached and downloads are off "
            f"(HOOKCLI_OFFLINE); place https://download.pytorch.org/models/resnet18-f37072fd.pth at "
            f"{Path(os.environ['TORCH_HOME'])}/hub/checkpoints/resnet18-f37072fd.pth. "
            "Hint: or use --weights none for random weights",
        ),
    ]
    for args, code, message in cases:
        result = runner.invoke(main, args)
        assert (result.exit_code, _error(result)) == (code, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "empty", "imgs", "notes.jpg"]


def test_an_unexpected_failure_is_one_line_and_debug_shows_the_traceback(runner, images, tmp_path, monkeypatch):
    import hookcli.run.pipeline

    args = ["extract", "-m", "squeezenet1_0", "-w", "none", "-l", "features.12", "--resize", "8", "--crop", "8",
            "-o", str(tmp_path / "o.safetensors"), str(images[0])]  # fmt: skip
    result = runner.invoke(main, args)  # its stride-2 7x7 convolution makes 8x8 one pixel, too few to pool
    assert result.exit_code == 1
    assert _error(result) == (
        "Error: squeezenet1_0 cannot run on this run's inputs ([1, 3, 8, 8]: Given input size: (96x1x1). Calculated "
        "output size: (96x0x0). Output size is too small). Hint: give it inputs of a size it takes (--resize, "
        "--crop); hookcli layers -m squeezenet1_0 runs it on its natural input"
    )

    def unexpected(*args, **kwargs):
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(hookcli.run.pipeline, "stored", unexpected)
    args = [arg if arg != "8" else "32" for arg in args]  # a size squeezenet1_0 takes
    result = runner.invoke(main, args)
    assert result.exit_code == 1
    assert (
        _error(result) == "Error: RuntimeError: something nobody expected. Hint: rerun with --debug for the traceback"
    )
    result = runner.invoke(main, ["--debug", *args])
    assert isinstance(result.exception, RuntimeError)
    assert not (tmp_path / "o.safetensors").exists()
    again = runner.invoke(main, [*args, "--debug"])  # where the hint's reader adds it: at the end
    assert isinstance(again.exception, RuntimeError)


def test_refuses_to_write_binary_to_a_terminal(resnet18_args, images):
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "hookcli", *resnet18_args("extract", "-l", "layer1", "-o", "-", images[0])],
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 2
    assert result.stderr == (
        "Error: refusing to write binary safetensors data to a terminal; pipe or redirect -o -. "
        "Hint: see 'hookcli extract --help'\n"
    )


def test_shipped_presets_work_from_any_folder(runner, images, tmp_path, monkeypatch):
    from hookcli.cli.presets import PRESETS, locate_config

    monkeypatch.chdir(tmp_path)
    assert locate_config("resnet50-stages") == PRESETS / "resnet50-stages.toml"
    assert locate_config("configs/vit_b_16-block.toml") == PRESETS / "vit_b_16-block.toml"
    out = tmp_path / "o.safetensors"
    result = runner.invoke(
        main,
        [
            "extract",
            "-c",
            "resnet50-stages",
            "-w",
            "none",
            "--resize",
            "64",
            "--crop",
            "64",
            "-o",
            str(out),
            str(images[0]),
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(_read(out)[0]) == ["layer1", "layer2", "layer3", "layer4"]
    result = runner.invoke(main, ["extract", "-c", "resnet-stages", str(images[0])])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: config file not found: 'resnet-stages'. Hint: shipped "
        "presets: resnet50-stages, vgg16_bn-features18, vit_b_16-block "
        "(a name is enough)\n",
    )


def test_fast_decode_reads_large_jpegs_at_a_scale_and_says_so(runner, resnet18_args, photo, tmp_path):
    from PIL import Image

    big = tmp_path / "big.jpg"
    Image.open(photo).convert("RGB").resize((2000, 2344)).save(big, quality=92)
    base = resnet18_args("extract", "-l", "layer1", *SMALL, "-q")
    whole = runner.invoke(main, [*base, "-o", str(tmp_path / "whole.safetensors"), str(big)])
    fast = runner.invoke(main, [*base, "--fast-decode", "-o", str(tmp_path / "fast.safetensors"), str(big)])
    assert (whole.exit_code, fast.exit_code) == (0, 0), whole.output + fast.output
    reference, whole_meta = _read(tmp_path / "whole.safetensors")
    tensors, metadata = _read(tmp_path / "fast.safetensors")
    assert json.loads(metadata["preprocess"])["fast_decode"] is True
    assert json.loads(whole_meta["preprocess"])["fast_decode"] is False
    difference = ((tensors["layer1"] - reference["layer1"]).norm() / reference["layer1"].norm()).item()
    assert 0 < difference < 0.05  # decoded at 1/8 (250x293, still twice the resize of 64): the same picture


def test_a_crop_larger_than_the_resized_image_says_that_it_pads_with_zeros(runner, resnet18_args, images, tmp_path):
    out = str(tmp_path / "o.safetensors")
    result = runner.invoke(main, resnet18_args("extract", "-l", "layer1", "--resize", 40, images[0], "-o", out))
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: the centre crop (224) is larger than the resized image (40 a side), so the crop pads it with zeros: "
        "give --crop 40 or less to keep the image alone\n"
    )
    kept = runner.invoke(main, resnet18_args("extract", "-l", "layer1", "--resize", 40, "--crop", 40, images[0],
                                             "-o", out, "--force"))  # fmt: skip
    assert kept.exit_code == 0 and kept.stderr == ""
