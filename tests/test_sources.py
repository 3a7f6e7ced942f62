"""Models from timm, Hugging Face transformers, OpenCLIP and the user's own factories (hookcli.models.sources): built
offline, preprocessed as their own libraries do, and captured exactly as hooks written by hand on the same modules."""

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

import hookcli
from hookcli.cli import main
from hookcli.errors import HookcliError, UnknownWeightsError, UsageProblem
from hookcli.inputs.transforms import to_transform
from hookcli.models.loaded import prefix_tokens
from hookcli.models.loading import load_model
from hookcli.models.specs import parse_model

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

EXACT = {"memory_format": "contiguous", "fuse": False, "device": "cpu"}  # to the bit, as by hand here on the CPU
FACTORY = """
import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 4))


def with_preprocessing():
    return make(), {"resize": 40, "crop": 32, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}


def broken():
    raise ValueError("no such checkpoint")


def not_a_module():
    return "resnet"


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3))

    def forward(self, x):
        y = self.body(x)
        return y if y.sum() > 0 else -y  # a branch on a value: torch.fx cannot trace it


def branchy():
    return Branchy()
"""


def _hand(module, path: str, batch, *, kwargs=None):
    """What ``module.get_submodule(path)`` returns for ``batch``, caught by a hook written here."""
    caught = []
    handle = module.get_submodule(path).register_forward_hook(lambda m, i, o: caught.append(o.detach().clone()))
    try:
        with torch.inference_mode():
            output = module(batch, **(kwargs or {}))
    finally:
        handle.remove()
    return caught[0], output


def _metadata(path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return handle.metadata()


def _tiny_vit(folder: Path, model_class, seed: int, **config) -> Path:
    """A tiny transformers ViT written by save_pretrained, with its image processor (squash to 64x64)."""
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=16,
        **config,
    )
    torch.manual_seed(seed)
    model_class(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory) -> Path:
    return _tiny_vit(tmp_path_factory.mktemp("hf") / "tiny-vit", transformers.ViTModel, 1)


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory) -> Path:
    labels = dict(enumerate(["cat", "dog", "fox"]))
    return _tiny_vit(
        tmp_path_factory.mktemp("hf") / "tiny-vit-classifier",
        transformers.ViTForImageClassification,
        2,
        num_labels=3,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )


@pytest.fixture(scope="module")
def clip_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "TinyClip.json"
    path.write_text(
        json.dumps(
            {
                "embed_dim": 32,
                "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
                "text_cfg": {"context_length": 16, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
            }
        )
    )
    return path


@pytest.fixture
def factory_file(tmp_path) -> Path:
    path = tmp_path / "nets.py"
    path.write_text(FACTORY)
    return path


# -- naming ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, source, name, label",
    [
        ("timm:vit_small_patch16_224", "timm", "vit_small_patch16_224", "timm-vit_small_patch16_224"),
        ("hf:facebook/dinov2-small", "hf", "facebook/dinov2-small", "hf-dinov2-small"),
        ("hf:./exports/tiny/", "hf", "./exports/tiny/", "hf-tiny"),
        ("open_clip:ViT-B-32", "open_clip", "ViT-B-32", "open_clip-ViT-B-32"),
        ("open_clip:/configs/Tiny.json", "open_clip", "/configs/Tiny.json", "open_clip-Tiny"),
        ("models/nets.py:make", "factory", "models/nets.py:make", "nets-make"),
        ("my_lab.models:resnet_like", "factory", "my_lab.models:resnet_like", "models-resnet_like"),
        ("resnet18", "torchvision", "resnet18", "resnet18"),
    ],
)
def test_a_model_value_names_its_source(text, source, name, label):
    spec = parse_model(text)
    assert (spec.source, spec.name, spec.label) == (source, name, label)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # the archive is made here
def test_a_torchscript_archive_is_refused_with_what_to_give_instead(runner, tmp_path, photo):
    scripted = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))).save(str(scripted))
    result = runner.invoke(main, ["extract", "-m", str(scripted), "-l", "0", str(photo)])
    assert result.exit_code == 2
    assert result.output == (
        f"Error: '{scripted}' is a TorchScript archive: its modules are compiled code that forward hooks cannot "
        "reach. Hint: give the Python model it was scripted from (timm:NAME, a torchvision name, or file.py:factory) "
        "and its weights with --weights state_dict.pth\n"
    )


def test_a_torch_export_archive_is_refused(runner, tmp_path, photo):
    exported = tmp_path / "model.pt2"
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    torch.export.save(torch.export.export(module, (torch.zeros(1, 3, 8, 8),)), str(exported))
    result = runner.invoke(main, ["layers", "-m", str(exported)])
    assert result.exit_code == 2
    assert result.output.startswith(
        f"Error: '{exported}' is a torch.export archive: its graph has no modules for "
        "hooks to reach. Hint: give the Python model it was exported from"
    )


def test_a_weights_file_or_a_bare_python_file_as_model_says_what_to_write(runner, tmp_path):
    weights = tmp_path / "w.pth"
    torch.save({"a": torch.zeros(1)}, weights)
    result = runner.invoke(main, ["layers", "-m", str(weights)])
    assert result.output == (
        f"Error: '{weights}' is a weights file, not a model. Hint: name the architecture with "
        f"--model and pass the file as --weights {weights}\n"
    )
    result = runner.invoke(main, ["layers", "-m", "nets.py"])
    assert result.output == (
        "Error: 'nets.py' is a Python file but names no function to call. Hint: write "
        "nets.py:FUNCTION, where FUNCTION() returns the nn.Module\n"
    )
    assert result.exit_code == 2


def test_a_missing_package_names_the_extra_to_install(runner, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    result = runner.invoke(main, ["layers", "-m", "timm:resnet18"])
    assert result.exit_code == 1
    assert result.output == (
        'Error: timm: models need the timm package, which is not installed. Hint: pip install "hookcli[timm]"\n'
    )


# -- timm -----------------------------------------------------------------------------------------------------


def test_timm_preprocessing_is_timms_own_eval_transform(photo):
    loaded = load_model("timm:test_vit", "none")
    theirs = timm.data.create_transform(**timm.data.resolve_model_data_config(loaded.module))
    image = Image.open(photo).convert("RGB")
    assert (loaded.preprocess.resize, loaded.preprocess.crop, loaded.preprocess.interpolation) == (168, 160, "bicubic")
    assert torch.equal(to_transform(loaded.preprocess)(image), theirs(image))


def test_timm_captures_equal_hooks_written_by_hand(photo):
    loaded = load_model("timm:test_vit", "none", seed=3)
    batch = to_transform(loaded.preprocess)(Image.open(photo).convert("RGB"))[None]
    expected, logits = _hand(loaded.module, "blocks.1", batch)
    features = hookcli.extract(loaded, ["blocks.1", "."], photo, **EXACT)
    assert torch.equal(features["blocks.1"], expected)
    assert torch.equal(features["output"], logits)
    assert features.metadata["model"] == "timm:test_vit"
    assert json.loads(features.metadata["weights"]) == {"source": "none", "seed": 3}
    assert features.metadata["prefix_tokens"] == "1"
    assert json.loads(features.metadata["versions"])["timm"] == timm.__version__


def test_timm_pretrained_weights_come_from_the_local_hugging_face_cache(photo):
    from huggingface_hub import constants

    random = timm.create_model("test_vit", pretrained=False)
    repo = Path(constants.HF_HUB_CACHE) / "models--timm--test_vit.r160_in1k"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    try:
        save_file(
            {k: v.contiguous() for k, v in random.state_dict().items()},
            repo / "snapshots" / revision / "model.safetensors",
        )
        loaded = load_model("timm:test_vit", "DEFAULT")
        assert loaded.weights == {"source": "timm", "name": "test_vit.r160_in1k"}
        assert all(
            torch.equal(a, b)
            for a, b in zip(loaded.module.state_dict().values(), random.state_dict().values(), strict=True)
        )
        assert loaded.categories[:2] == ["tench", "goldfish"]
        assert load_model("timm:test_vit", "r160_in1k").weights == loaded.weights
    finally:
        shutil.rmtree(repo)


def test_timm_weights_that_are_not_cached_name_the_file_and_the_folder(runner):
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / "models--timm--test_vit2.r160_in1k"
    result = runner.invoke(main, ["layers", "-m", "timm:test_vit2", "-w", "DEFAULT"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: timm:test_vit2 is not in the local Hugging Face cache, and hookcli does not download: "
        f"model.safetensors of timm/test_vit2.r160_in1k belongs under {folder}/snapshots/<revision>/. Hint: run "
        f"'hf download timm/test_vit2.r160_in1k' where there is network and copy {folder} here (or set "
        "HF_HUB_CACHE), or use --weights none\n"
    )
    with pytest.raises(
        UnknownWeightsError,
        match=r"timm:test_vit has no pretrained tag 'in22k' \(timm has: "
        r"r160_in1k\)",
    ):
        load_model("timm:test_vit", "in22k")


def test_timm_state_dict_files_load_and_misfits_are_named(tmp_path):
    source = timm.create_model("test_resnet", pretrained=False)
    good = tmp_path / "tuned.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, good)
    loaded = load_model("timm:test_resnet", str(good))
    assert loaded.weights["source"] == "file" and loaded.weights["path"] == str(good)
    assert torch.equal(loaded.module.conv1[0].weight, source.conv1[0].weight)
    bad = tmp_path / "other.pth"
    torch.save(timm.create_model("test_vit", pretrained=False).state_dict(), bad)
    with pytest.raises(HookcliError, match=r"weights file '.*other.pth' does not fit model 'timm:test_resnet': "):
        load_model("timm:test_resnet", str(bad))


def test_unknown_timm_models_are_refused_with_the_closest(runner):
    result = runner.invoke(main, ["layers", "-m", "timm:test_vitt"])
    assert result.exit_code == 2
    assert result.output.startswith("Error: unknown timm model 'test_vitt' (closest: test_vit")
    assert result.output.endswith("Hint: 'hookcli models --source timm' lists them\n")


def test_models_lists_timm_with_a_pattern_and_its_tags(runner):
    result = runner.invoke(main, ["models", "--source", "timm", "test_vit*", "--json"])
    rows = {row["model"]: row for row in json.loads(result.output)}
    assert rows["timm:test_vit"] == {
        "model": "timm:test_vit",
        "family": "classification",
        "default": "r160_in1k",
        "weights": ["r160_in1k"],
    }
    assert rows["timm:test_vit4"]["weights"] == []
    table = runner.invoke(main, ["models", "--source", "timm", "test_vit4"]).output.splitlines()
    assert table[1].split() == ["timm:test_vit4", "classification", "none", "(random", "only)"]


def test_timm_runs_into_a_shard_folder_and_resumes(runner, images, tmp_path):
    arguments = [
        "extract",
        "-m",
        "timm:test_resnet",
        "-w",
        "none",
        "-l",
        "layer2",
        "--shard-size",
        "2",
        "-o",
        str(tmp_path / "out") + "/",
        *map(str, images),
    ]
    assert runner.invoke(main, arguments).exit_code == 0
    index = tmp_path / "out" / "index.jsonl"
    lines = index.read_text().splitlines()
    (tmp_path / "out" / "features-00001.safetensors").unlink()
    index.write_text("\n".join(lines[:2]) + "\n")
    result = runner.invoke(main, arguments)
    assert result.exit_code == 0, result.output
    with hookcli.open_features(tmp_path / "out") as features:
        assert features.shape("layer2")[0] == 3
        header = json.loads(index.read_text().splitlines()[0])
        assert header["identity"]["model"] == "timm:test_resnet"


def test_timm_bf16_and_channels_last_run_and_stay_close(photo):
    loaded = load_model("timm:test_resnet", "none")
    exact = hookcli.extract(loaded, "layer2", photo, **EXACT)
    fast = hookcli.extract(
        loaded, "layer2", [photo] * 2, precision="bf16", memory_format="channels_last", fuse=True, device="cpu"
    )
    bf16_kernels = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # oneDNN's bf16 convolutions: else no fusion
    assert fast.metadata["memory_format"] == "channels_last" and (int(fast.metadata["fused"]) > 0) == bf16_kernels
    torch.testing.assert_close(fast["layer2"][0].float(), exact["layer2"][0], atol=0.1, rtol=0.05)


def test_an_untraceable_model_says_it_runs_unfused(photo, factory_file):
    features = hookcli.extract(
        f"{factory_file}:branchy", "body.1", [photo] * 2, fuse=True, resize=40, crop=32, mean=0.5, std=0.5, device="cpu"
    )
    assert features.notes == (
        "--fuse: Branchy cannot be traced by torch.fx, so it runs unfused (the values are the same)",
    )
    assert features.metadata["fused"] == "0"
    plain = hookcli.extract("timm:test_vit", "blocks.0", [photo] * 2, weights="none", fuse=True)
    assert plain.notes == () and plain.metadata["fused"] == "0"  # one patch convolution: nothing worth a trace


def test_a_models_own_hooks_run_and_it_runs_unfused_saying_why(photo):
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3)]
    net = torch.nn.Sequential(*layers, torch.nn.BatchNorm2d(4)).eval()
    hooked = torch.nn.Sequential(net)
    hooked.register_forward_hook(lambda module, args, output: output * 3 - 1)
    asked = {"resize": 20, "crop": 16, "mean": 0.5, "std": 0.5, "device": "cpu"}
    fused = hookcli.extract(hooked, ".", [photo] * 2, fuse=True, **asked)
    expected = hookcli.extract(net, "4", [photo] * 2, **asked)["4"] * 3 - 1
    assert torch.equal(torch.as_tensor(fused["output"]), torch.as_tensor(expected))
    assert fused.notes == (
        "--fuse: Sequential has hooks of its own, which a torch.fx trace would skip, so it runs unfused (the values "
        "are the same)",
    )


# -- Hugging Face ---------------------------------------------------------------------------------------------


def test_hf_preprocessing_follows_the_image_processor(vit_folder, photo):
    loaded = load_model(f"hf:{vit_folder}", "DEFAULT")
    assert (loaded.preprocess.resize, loaded.preprocess.crop, loaded.preprocess.mean) == (
        (64, 64),
        None,
        (0.5, 0.5, 0.5),
    )
    image = Image.open(photo).convert("RGB")
    theirs = transformers.AutoImageProcessor.from_pretrained(vit_folder)(images=image, return_tensors="pt")
    torch.testing.assert_close(to_transform(loaded.preprocess)(image), theirs.pixel_values[0], atol=1e-6, rtol=0)


def test_hf_captures_blocks_and_model_output_fields(vit_folder, photo):
    loaded = load_model(f"hf:{vit_folder}", "DEFAULT")
    batch = to_transform(loaded.preprocess)(Image.open(photo).convert("RGB"))[None]
    expected, output = _hand(loaded.module, "layers.1", batch)
    features = hookcli.extract(loaded, ["layers.1", "."], photo, **EXACT)
    assert sorted(features.keys()) == ["layers.1", "output#last_hidden_state", "output#pooler_output"]
    assert torch.equal(features["layers.1"], expected)
    assert torch.equal(features["output#last_hidden_state"], output.last_hidden_state)
    assert torch.equal(features["output#pooler_output"], output.pooler_output)
    weights = json.loads(features.metadata["weights"])
    assert weights["source"] == "folder" and weights["path"] == str(vit_folder)
    assert features.metadata["model"] == f"hf:{vit_folder}"
    assert features.metadata["prefix_tokens"] == "1"


def test_hf_weights_none_builds_the_config_with_random_weights(vit_folder):
    pretrained = load_model(f"hf:{vit_folder}", "DEFAULT").module
    random = load_model(f"hf:{vit_folder}", "none", seed=5)
    assert random.weights == {"source": "none", "seed": 5}
    assert not torch.equal(random.module.layers[0].mlp.fc1.weight, pretrained.layers[0].mlp.fc1.weight)


def test_hf_models_load_from_the_local_cache_by_id(vit_folder):
    from huggingface_hub import constants

    repo = Path(constants.HF_HUB_CACHE) / "models--lab--tiny-vit"
    revision = "89abcdef0123456789abcdef0123456789abcdef"
    shutil.copytree(vit_folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    try:
        loaded = load_model("hf:lab/tiny-vit", "DEFAULT")
        assert loaded.weights == {"source": "hf", "repo": "lab/tiny-vit", "revision": revision}
        assert loaded.preprocess.resize == (64, 64)
        listed = hookcli.models.sources.list_source_models("hf", "lab/*")
        assert listed == [
            {"model": "hf:lab/tiny-vit", "family": "classification", "default": "DEFAULT", "weights": ["DEFAULT"]}
        ]
    finally:
        shutil.rmtree(repo)


def test_hf_models_not_cached_name_the_cache_folder(runner):
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / "models--facebook--dinov2-small"
    result = runner.invoke(main, ["layers", "-m", "hf:facebook/dinov2-small"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: hf:facebook/dinov2-small is not in the local Hugging Face cache, and hookcli does not download: "
        f"config.json of facebook/dinov2-small belongs under {folder}/snapshots/<revision>/. Hint: run 'hf download "
        f"facebook/dinov2-small' where there is network and copy {folder} here (or set HF_HUB_CACHE), or give "
        "hf:/path/to/a/folder written by save_pretrained\n"
    )
    result = runner.invoke(main, ["layers", "-m", "hf:./no-such-folder"])
    assert result.output == (
        "Error: './no-such-folder' (from hf:./no-such-folder) is not a folder. Hint: give a "
        "folder written by save_pretrained, or hf:ORG/NAME from the cache\n"
    )


def test_hf_classifier_grad_and_cam_use_its_logits_and_labels(classifier_folder, photo, tmp_path):
    name = f"hf:{classifier_folder}"
    loaded = load_model(name, "DEFAULT")
    assert (loaded.scores, loaded.classes, loaded.categories) == ("logits", 3, ["cat", "dog", "fox"])
    batch = to_transform(loaded.preprocess)(Image.open(photo).convert("RGB"))[None]
    with torch.inference_mode():
        logits = loaded.module(batch).logits
    features = hookcli.grad(loaded, "vit.layers.1", photo, target="dog")
    (row,) = json.loads(features.metadata["targets"])
    assert row[0]["class"] == 1 and row[0]["name"] == "dog"
    assert row[0]["logit"] == pytest.approx(float(logits[0, 1]), abs=1e-5)
    assert features["vit.layers.1@grad"].shape == (1, 17, 32)
    cams = hookcli.cam(loaded, photo, output=tmp_path / "cams")
    metadata = _metadata(tmp_path / "cams" / "cams.safetensors")
    assert metadata["cam_layer"] == "vit.layers.1.layernorm_before"
    with safe_open(str(tmp_path / "cams" / "cams.safetensors"), "pt") as handle:
        assert handle.get_tensor("cam").shape == (1, 4, 4)
    assert cams == tmp_path / "cams" / "cams.safetensors"


def test_hf_backbone_grad_says_its_targets_are_pooler_units(vit_folder, photo):
    features = hookcli.grad(f"hf:{vit_folder}", "layers.0", photo, target="5")
    assert features.notes == (f"hf:{vit_folder} has no classifier: targets are units of its pooler_output",)
    (row,) = json.loads(features.metadata["targets"])
    assert row[0]["class"] == 5


def test_register_tokens_are_left_out_of_token_pictures(tmp_path, photo):
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=16,
        num_register_tokens=4,
    )
    folder = tmp_path / "dinov2-reg"
    transformers.Dinov2WithRegistersModel(config).save_pretrained(folder)
    loaded = load_model(f"hf:{folder}", "DEFAULT")
    assert loaded.prefix_tokens == 5
    assert any("no preprocessor_config.json" in note for note in loaded.notes)
    written = hookcli.extract(loaded, "encoder.layer.1", photo, output=tmp_path / "f.safetensors", crop=64, resize=64)
    assert _metadata(written)["prefix_tokens"] == "5"
    with hookcli.open_features(written) as features:
        assert features.shape("encoder.layer.1") == [1, 21, 32]
        pictures = hookcli.api.grid(features, output=None, channels="0:4")
    (pixels,) = pictures.values()
    assert pixels.ndim == 3
    from hookcli.pictures.render import as_maps

    maps, layout = as_maps(np.arange(21 * 2, dtype=np.float32).reshape(21, 2), prefix_tokens=5)
    assert layout == "tokens+prefix" and maps.shape == (2, 4, 4) and maps[0, 0, 0] == 10.0


def test_keyword_inputs_are_captured_by_name():
    class Block(torch.nn.Module):
        def forward(self, hidden, *, scale):
            return hidden * scale

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x, scale=torch.full_like(x, 2.0))

    from hookcli.run.capture import FeatureCapture

    with FeatureCapture(Model(), ["block"], capture="input") as capture:
        found = capture.run(torch.ones(2, 3))
    assert sorted(found) == ["block@input", "block@input#scale"]
    assert torch.equal(found["block@input#scale"], torch.full((2, 3), 2.0))


# -- OpenCLIP -------------------------------------------------------------------------------------------------


def test_open_clip_image_tower_preprocessing_and_captures(clip_config, photo):
    name = f"open_clip:{clip_config}"
    loaded = load_model(name, "none", seed=4)
    open_clip.add_model_config(clip_config)
    _, _, theirs = open_clip.create_model_and_transforms(clip_config.stem)
    image = Image.open(photo).convert("RGB")
    assert torch.equal(to_transform(loaded.preprocess)(image), theirs(image))
    batch = theirs(image)[None]
    expected, embedding = _hand(loaded.module, "transformer.resblocks.1", batch)
    features = hookcli.extract(loaded, ["transformer.resblocks.1", "."], photo, **EXACT)
    assert torch.equal(features["transformer.resblocks.1"], expected)
    assert torch.equal(features["output"], embedding)
    assert features["output"].shape == (1, 32)
    assert (loaded.prefix_tokens, loaded.scores, loaded.classes) == (1, "embedding", 32)


def test_open_clip_pretrained_tags_are_checked_and_not_downloaded(runner):
    from huggingface_hub import constants

    with pytest.raises(UnknownWeightsError, match="open_clip:ViT-B-32 has no pretrained tag 'laion9b'"):
        load_model("open_clip:ViT-B-32", "laion9b")
    result = runner.invoke(main, ["layers", "-m", "open_clip:ViT-B-32", "-w", "openai"])
    folder = Path(constants.HF_HUB_CACHE) / "models--timm--vit_base_patch32_clip_224.openai"
    assert result.exit_code == 1
    assert result.output.startswith(
        "Error: open_clip:ViT-B-32 is not in the local Hugging Face cache, and hookcli "
        "does not download: open_clip_model.safetensors of "
        f"timm/vit_base_patch32_clip_224.openai belongs under {folder}/snapshots/"
    )


def test_open_clip_cam_defaults_to_the_last_blocks_first_norm(clip_config, photo):
    cams = hookcli.cam(f"open_clip:{clip_config}", photo, weights="none")
    assert cams.metadata["cam_layer"] == "transformer.resblocks.1.ln_1"
    assert cams["cam"].shape == (1, 4, 4)
    assert cams.notes[-1] == f"open_clip:{clip_config} has no classifier: targets are units of its image embedding"


# -- factories ------------------------------------------------------------------------------------------------


def test_a_factory_file_runs_with_imagenet_defaults_and_says_so(runner, factory_file, photo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["extract", "-m", "nets.py:make", "-l", "1", str(photo)])
    assert result.exit_code == 0, result.output
    assert (
        "Note: nets.py:make: the factory gives no preprocessing, so what --resize, --crop, --mean and --std do "
        "not set is ImageNet's preprocessing (resize 256, crop 224, mean 0.485,0.456,0.406, std "
        "0.229,0.224,0.225)\n" in result.output
    )
    written = tmp_path / "nets-make-1.safetensors"
    metadata = _metadata(written)
    assert metadata["model"] == f"{factory_file}:make"
    assert json.loads(metadata["weights"])["source"] == "factory"
    quiet = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "nets.py:make",
            "-l",
            "1",
            "--resize",
            "64",
            "--crop",
            "56",
            "--mean",
            "0.5",
            "--std",
            "0.5",
            "-o",
            "given.safetensors",
            str(photo),
        ],
    )
    assert quiet.exit_code == 0 and "Note" not in quiet.output


def test_a_factory_module_with_its_preprocessing_equals_hooks_by_hand(factory_file, photo, monkeypatch):
    monkeypatch.chdir(factory_file.parent)
    monkeypatch.delitem(sys.modules, "nets", raising=False)
    loaded = load_model("nets:with_preprocessing", "none", seed=7)
    assert (loaded.preprocess.resize, loaded.preprocess.crop, loaded.preprocess.std) == (40, 32, (0.25, 0.25, 0.25))
    assert loaded.notes == () and loaded.name == "nets:with_preprocessing"
    batch = to_transform(loaded.preprocess)(Image.open(photo).convert("RGB"))[None]
    expected, _ = _hand(loaded.module, "1", batch)
    features = hookcli.extract(loaded, "1", photo, **EXACT)
    assert torch.equal(features["1"], expected)  # the BatchNorm's output, before the in-place ReLU


def test_factory_weights_come_from_a_state_dict(factory_file, tmp_path):
    module = load_model(f"{factory_file}:make", "none", seed=9).module
    path = tmp_path / "trained.pth"
    torch.save(module.state_dict(), path)
    loaded = load_model(f"{factory_file}:make", str(path))
    assert loaded.weights["source"] == "file"
    assert torch.equal(loaded.module[0].weight, module[0].weight)


@pytest.mark.parametrize(
    "function, message, code",
    [
        (
            "broken",
            "Error: the factory {file}:broken failed: ValueError: no such checkpoint. Hint: run it in Python to "
            "see where\n",
            1,
        ),
        (
            "not_a_module",
            "Error: the factory {file}:not_a_module returned str, not an nn.Module. Hint: return the model, "
            "or (model, preprocessing)\n",
            1,
        ),
        ("missing", "Error: {file} has no function 'missing'. Hint: define missing() returning the nn.Module\n", 2),
    ],
)
def test_factory_failures_are_one_line(runner, factory_file, function, message, code):
    result = runner.invoke(main, ["layers", "-m", f"{factory_file}:{function}"])
    assert result.exit_code == code
    assert result.output == message.format(file=factory_file)


def test_a_missing_factory_file_is_refused_before_torch(runner, tmp_path, no_model):
    result = runner.invoke(main, ["extract", "-m", str(tmp_path / "gone.py") + ":make", "-l", "0", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: factory file '{tmp_path / 'gone.py'}' not found")


def test_default_output_names_are_file_safe(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["extract", "-m", "timm:test_resnet", "-w", "none", "-l", "layer1", str(images[0])])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "timm-test_resnet-layer1.safetensors"


def test_prefix_tokens_are_read_from_each_kind_of_model():
    assert prefix_tokens(timm.create_model("test_vit", pretrained=False)) == 1
    assert prefix_tokens(timm.create_model("test_resnet", pretrained=False)) is None
    import torchvision

    assert prefix_tokens(torchvision.models.vit_b_32()) == 1


@pytest.mark.parametrize(
    ("source", "args", "note"),
    [
        ("timm", [], "timm lists no models"),
        ("timm", ["zz*", "--family", "video"], "no timm model matches 'zz*' and family video"),
        ("open_clip", [], "open_clip lists no models"),
        ("open_clip", ["zz*"], "no open_clip model matches 'zz*'"),
        ("torchvision", ["zz*"], "no torchvision model matches 'zz*'"),
        (
            "torchvision",
            ["mobilenet"],
            "no torchvision model matches 'mobilenet' (a pattern matches whole names: '*mobilenet*' finds it within "
            "them)",
        ),
        (
            "torchvision",
            ["timm:vit*"],
            "no torchvision model matches 'timm:vit*' (a source's models are listed with --source: hookcli models "
            "--source timm 'vit*')",
        ),
    ],
)
def test_an_empty_listing_says_what_matched_nothing_in_the_same_words_for_every_source(
    runner, monkeypatch, source, args, note
):
    monkeypatch.setattr(timm, "list_models", lambda pattern="": [])
    monkeypatch.setattr(open_clip, "list_models", lambda: [])
    result = runner.invoke(main, ["models", "--source", source, *args])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "model  family  weights\n", f"Note: {note}\n")


@pytest.mark.parametrize("source", ["hf", "torchvision"])
def test_a_run_checks_its_model_and_weights_names_once(calls_to, vit_folder, photo, source):
    from hookcli.models import catalog, specs

    calls = calls_to(specs.check_model, specs.check_weights, catalog.registry_entry)
    model, layer = (f"hf:{vit_folder}", "layers.0") if source == "hf" else ("resnet18", "layer1")
    assert list(hookcli.extract(model, layer, photo, weights="none", resize=64, crop=64)) == [layer]
    assert calls == (["check_model", "check_weights"] if source == "hf" else ["registry_entry"])


def test_an_unknown_source_prefix_is_refused():
    with pytest.raises(UsageProblem, match="unknown model source 'huggingface:'"):
        parse_model("huggingface:facebook/dinov2-small")


def test_a_relative_folder_is_recorded_absolute_and_the_model_itself_as_dot(
    vit_folder, photo, tmp_path, monkeypatch, runner
):
    monkeypatch.chdir(vit_folder.parent)
    written = tmp_path / "f.safetensors"
    result = runner.invoke(
        main, ["extract", "-m", f"hf:./{vit_folder.name}", "-l", ".", "-l", "layers.0", "-o", str(written), str(photo)]
    )
    assert result.exit_code == 0, result.output
    metadata = _metadata(written)
    assert metadata["model"] == f"hf:{vit_folder}"
    layers = json.loads(metadata["layers"])
    assert layers["."] == {
        "key": "output",
        "type": "ViTModel",
        "calls": 1,
        "keys": ["output#last_hidden_state", "output#pooler_output"],
    }
    report = runner.invoke(main, ["report", str(written), "-o", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"hf:{vit_folder}" in page and page.count("output#pooler_output") >= 2


def test_channels_last_outputs_pool_and_draw_by_their_channels(photo, tmp_path):
    loaded = load_model("timm:test_vit", "none")
    loaded.module.patch_embed.flatten = False  # timm's dynamic-size layout: [N, H, W, C]
    loaded.module.patch_embed.output_fmt = timm.layers.Format.NHWC
    loaded.module.dynamic_img_size = True
    written = hookcli.extract(loaded, "patch_embed", photo, output=tmp_path / "f.safetensors", **EXACT)
    pooled = hookcli.extract(loaded, "patch_embed", photo, pool="avg", **EXACT)
    with hookcli.open_features(written) as features:
        rows = torch.from_numpy(features.read("patch_embed", 0))
        assert list(rows.shape) == [10, 10, 64]
        torch.testing.assert_close(pooled["patch_embed"][0], rows.mean(dim=(0, 1)))
        from hookcli.pictures.reading import channels_first

        assert channels_first(features, features.shape("patch_embed")) == [1, 64, 10, 10]
        (pixels,) = hookcli.api.grid(features, output=None, channels="0:64", plain=True, min_tile=10).values()
    assert pixels.shape == (10 * 8 + 2 * 9, 10 * 8 + 2 * 9, 3)  # 64 tiles of 10x10 in 8 columns, padded by 2


def test_dinov2_backbone_takes_gradients_of_its_pooled_output(tmp_path, photo):
    config = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=64, patch_size=16
    )
    folder = tmp_path / "dinov2"
    transformers.Dinov2Model(config).save_pretrained(folder)
    loaded = load_model(f"hf:{folder}", "DEFAULT")
    assert (loaded.preprocess.resize, loaded.preprocess.crop) == (73, 64)  # ImageNet's proportions at its 64 px
    cams = hookcli.cam(loaded, photo)
    assert cams["cam"].shape == (1, 4, 4) and cams.metadata["cam_layer"] == "encoder.layer.1.norm1"
    assert cams.notes[0].startswith(f"hf:{folder}: it has no preprocessor_config.json, so what --resize")
    given = hookcli.extract(loaded, "encoder.layer.0", photo, resize=72, crop=64, mean=0.5, std=0.5)
    assert given.notes == ()  # every part given: nothing was assumed


def test_timm_norms_with_their_activation_inside_fuse(photo):
    loaded = load_model("timm:test_efficientnet", "none")
    layers = ["blocks.1.0.bn1.act", "blocks.2"]
    exact = hookcli.extract(loaded, layers, [photo] * 2, **EXACT)
    fused = hookcli.extract(loaded, layers, [photo] * 2, memory_format="contiguous", fuse=True, device="cpu")
    assert int(fused.metadata["fused"]) == 3 and exact.metadata["fused"] == "0"  # 0 before BatchNormAct2d fused
    for key in ("blocks.1.0.bn1.act", "blocks.2"):  # the hooked activation inside a BatchNormAct2d still fires
        torch.testing.assert_close(fused[key], exact[key], rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # the archive is made here
def test_a_torchscript_file_as_weights_is_named_as_such_before_torch_reads_it(tmp_path):
    scripted = tmp_path / "net_script.pt"
    torch.jit.script(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))).save(str(scripted))
    with (
        warnings.catch_warnings(record=True) as warned,
        pytest.raises(
            HookcliError,
            match=r"weights file '.*net_script.pt' is a TorchScript archive, not a state "
            r"dict\. Hint: save model.state_dict\(\) of the model it came from",
        ),
    ):
        warnings.simplefilter("always")
        load_model("timm:test_resnet", str(scripted))
    assert [str(w.message) for w in warned] == []  # torch.load's "looks like a TorchScript archive" warning


def test_a_whole_open_clip_checkpoint_loads_its_image_tower(clip_config, tmp_path):
    open_clip.add_model_config(clip_config)
    whole = open_clip.create_model(clip_config.stem)
    path = tmp_path / "clip.pth"
    torch.save(whole.state_dict(), path)
    loaded = load_model(f"open_clip:{clip_config}", str(path))
    assert torch.equal(loaded.module.conv1.weight, whole.visual.conv1.weight)
    assert loaded.weights["source"] == "file"


def test_keyword_inputs_that_are_not_per_image_are_left_out_and_said():
    class Block(torch.nn.Module):
        def forward(self, hidden, *, table):
            return hidden + table.sum()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x, table=torch.ones(5, 5))

    from hookcli.run.capture import FeatureCapture

    with FeatureCapture(Model(), ["block"], capture="both") as capture:
        found = capture.run(torch.ones(2, 3))
    assert sorted(found) == ["block", "block@input"] and capture.omitted == {"block@input#table"}


def test_resize_on_a_squashing_model_squashes_and_untrusted_processor_files_fall_back(vit_folder, tmp_path, photo):
    run = hookcli.plan("extract", f"hf:{vit_folder}", ".", [photo, photo], resize=48)
    assert (run.settings.preprocess.resize, run.settings.preprocess.crop) == ((48, 48), None)
    cropped = hookcli.plan("extract", f"hf:{vit_folder}", ".", [photo, photo], resize=72, crop=64)
    assert (cropped.settings.preprocess.resize, cropped.settings.preprocess.crop) == (72, 64)
    broken = tmp_path / "broken"
    shutil.copytree(vit_folder, broken)
    for text in (
        "[1, 2]",
        '{"size": "big"}',
        '{"size": {"height": 64, "width": 64}, "image_mean": [0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}',
        '{"size": {"shortest_edge": 64}, "crop_pct": 0}',
    ):
        (broken / "preprocessor_config.json").write_text(text)
        loaded = load_model(f"hf:{broken}", "none")
        assert (loaded.preprocess.resize, loaded.preprocess.crop) == (73, 64)  # ImageNet's, at its 64 pixels
        assert loaded.notes[0].startswith(f"hf:{broken}: its preprocessor_config.json cannot be used (")
    (broken / "preprocessor_config.json").unlink()
    (broken / "processor_config.json").write_text(
        json.dumps(
            {
                "image_processor": {
                    "size": {"shortest_edge": 72},
                    "do_center_crop": True,
                    "crop_size": {"height": 64, "width": 64},
                    "image_mean": [0.1, 0.2, 0.3],
                    "image_std": [0.5, 0.5, 0.5],
                    "resample": 3,
                }
            }
        )
    )
    loaded = load_model(f"hf:{broken}", "none")
    assert (loaded.preprocess.resize, loaded.preprocess.crop, loaded.preprocess.mean) == (72, 64, (0.1, 0.2, 0.3))
    assert loaded.notes == ()


def test_transformers_classifiers_and_clip_towers_count_their_prefix_tokens():
    small = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 64,
        "patch_size": 16,
    }
    deit = transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**small))
    registers = transformers.Dinov2WithRegistersForImageClassification(
        transformers.Dinov2WithRegistersConfig(num_register_tokens=4, **small)
    )
    clip = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**small))
    assert [prefix_tokens(m) for m in (deit, registers, clip)] == [2, 5, 1]


def test_a_factory_that_exits_is_an_error_not_an_exit(runner, tmp_path):
    (tmp_path / "train.py").write_text(
        "import argparse\nargparse.ArgumentParser().parse_args(['--epochs', '3'])\ndef make():\n    pass\n"
    )  # a training script parsing its own options
    result = runner.invoke(main, ["layers", "-m", f"{tmp_path / 'train.py'}:make"])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        "Error: running train.py failed: SystemExit: 2. Hint: run it in Python to see where"
    )


def test_a_tag_named_twice_differently_is_refused_and_an_edited_factory_runs_anew(tmp_path):
    with pytest.raises(
        UsageProblem, match="timm:test_vit.r160_in1k names the tag 'r160_in1k', and --weights names another, 'in22k'"
    ):
        load_model("timm:test_vit.r160_in1k", "in22k")
    factory = tmp_path / "edited.py"
    factory.write_text("import torch.nn as nn\ndef make():\n    return nn.Conv2d(3, 2, 1)\n")
    first = load_model(f"{factory}:make", "none")
    factory.write_text("import torch.nn as nn\ndef make():\n    return nn.Conv2d(3, 5, 1)\n")
    second = load_model(f"{factory}:make", "none")
    assert (first.module.out_channels, second.module.out_channels) == (2, 5)
    assert first.weights["code_sha256"] != second.weights["code_sha256"]


def test_transformers_logging_is_left_as_it_was(vit_folder):
    transformers.utils.logging.set_verbosity_warning()
    load_model(f"hf:{vit_folder}", "none")
    assert transformers.utils.logging.get_verbosity() == transformers.utils.logging.WARNING
    transformers.utils.logging.set_verbosity_error()


def test_compile_with_the_model_itself_runs_eagerly_and_says_why(photo):
    features = hookcli.extract("resnet18", [".", "layer1"], photo, weights="none", compile=True, resize=64, crop=64)
    assert features.notes == (
        "--compile: the model's own output ('.') is caught by a hook, which a compiled graph "
        "does not keep; running eagerly",
    )
    assert features["output"].shape == (1, 1000)
