"""The model registry cache, and what plan refuses before a model loads (or torch is imported)."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torchvision.models

import hookcli.models.loading
from hookcli import __version__
from hookcli.cli import main
from hookcli.errors import UnknownModelError, UnknownWeightsError
from hookcli.models.catalog import choose_model, describe_models
from hookcli.models.registry import ModelEntry, cache_path, model_registry

TINY = {"tinynet": {"enum": "TinyNet_Weights", "default": "V2", "weights": ["V1", "V2"], "family": "video"}}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache folder of this test's own; returns the cache file's path."""
    monkeypatch.setenv("HOOKCLI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models.json"


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _versions() -> dict:
    return {"hookcli": __version__, "torchvision": version("torchvision")}


def test_a_cold_cache_is_filled_with_what_torchvision_lists(cache):
    rows = describe_models()
    modules = {
        "classification": torchvision.models,
        "detection": torchvision.models.detection,
        "segmentation": torchvision.models.segmentation,
        "video": torchvision.models.video,
        "optical_flow": torchvision.models.optical_flow,
        "quantized": torchvision.models.quantization,
    }
    families = {
        name: family for family, module in modules.items() for name in torchvision.models.list_models(module=module)
    }
    names = sorted(families)
    assert [row["model"] for row in rows] == names and len(names) == 121
    assert {row["model"]: row["family"] for row in rows} == families
    assert [row["model"] for row in describe_models("detection")] == sorted(
        torchvision.models.list_models(module=torchvision.models.detection)
    )
    assert all(row["default"] == torchvision.models.get_model_weights(row["model"]).DEFAULT.name for row in rows)
    written = json.loads(cache.read_text())
    assert {key: written[key] for key in ("hookcli", "torchvision")} == _versions()
    assert list(written["models"]) == names
    assert written["models"]["resnet18"] == {
        "enum": "ResNet18_Weights",
        "default": "IMAGENET1K_V1",
        "weights": ["IMAGENET1K_V1"],
        "family": "classification",
    }
    assert written["models"]["resnet50"] == {
        "enum": "ResNet50_Weights",
        "default": "IMAGENET1K_V2",
        "weights": ["IMAGENET1K_V1", "IMAGENET1K_V2"],
        "family": "classification",
    }
    assert written["models"]["quantized_resnet18"] == {
        "enum": "ResNet18_QuantizedWeights",
        "default": "IMAGENET1K_FBGEMM_V1",
        "weights": ["IMAGENET1K_FBGEMM_V1"],
        "family": "quantized",
    }
    assert not list(cache.parent.glob("*.part"))


def test_a_warm_cache_is_what_is_listed(cache, runner):
    _write(cache, {**_versions(), "models": TINY})
    assert model_registry() == {
        "tinynet": ModelEntry(enum="TinyNet_Weights", default="V2", weights=("V1", "V2"), family="video")
    }
    result = runner.invoke(main, ["models"])
    assert (result.exit_code, result.stdout) == (0, "model    family  weights\ntinynet  video   V1 V2 (default V2)\n")
    result = runner.invoke(main, ["models", "--json"])
    assert json.loads(result.stdout) == [
        {"model": "tinynet", "family": "video", "default": "V2", "weights": ["V1", "V2"]}
    ]
    assert runner.invoke(main, ["models", "--family", "detection"]).stdout == "model  family  weights\n"
    result = runner.invoke(main, ["models", "--family", "audio"])
    assert result.exit_code == 2 and "'audio' is not one of 'classification', 'detection'" in result.output


def test_weights_names_are_checked_against_the_cache(cache, tmp_path, monkeypatch):
    _write(cache, {**_versions(), "models": TINY})
    monkeypatch.chdir(tmp_path)
    for path in ("w.pth", "V1"):  # paths are files that exist
        (tmp_path / path).write_bytes(b"weights")
    assert [
        choose_model("tinynet", spec).member
        for spec in ("default", " V1 ", "TinyNet_Weights.V2", "TinyNet_Weights.DEFAULT", "None", "w.pth", "./V1")
    ] == ["DEFAULT", "V1", "V2", "DEFAULT", None, None, None]
    with pytest.raises(UnknownModelError) as caught:
        choose_model("tinynte", "none")
    assert str(caught.value) == "unknown model 'tinynte' (closest: tinynet). Hint: 'hookcli models' lists every model"
    with pytest.raises(UnknownWeightsError) as caught:
        choose_model("tinynet", "V3")
    assert str(caught.value) == (
        "model 'tinynet' has no weights 'V3' (available: DEFAULT, V1, V2, none). "
        "Hint: or pass a path to a .pth/.safetensors state dict"
    )
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("stale", [{"torchvision": "0.0.1"}, {"hookcli": "0.0.1"}], ids=["torchvision", "hookcli"])
def test_a_cache_for_other_versions_is_rebuilt(cache, stale):
    _write(cache, {**_versions(), "models": TINY, **stale})
    registry = model_registry()
    assert "tinynet" not in registry and registry["resnet18"].weights == ("IMAGENET1K_V1",)
    written = json.loads(cache.read_text())
    assert {key: written[key] for key in ("hookcli", "torchvision")} == _versions()
    assert written["models"]["vgg16_bn"] == {
        "enum": "VGG16_BN_Weights",
        "default": "IMAGENET1K_V1",
        "weights": ["IMAGENET1K_V1"],
        "family": "classification",
    }


def _tiny(**fields) -> dict:
    return {"tinynet": {**TINY["tinynet"], **fields}}


_MALFORMED = {
    "empty": b"",
    "not JSON": b'{"hookcli": ',
    "not UTF-8": b'{"hookcli": "\xff"}',
    "an array": b"[]",
    "nested deep": b"[" * 100_000 + b"]" * 100_000,
    "a key missing": json.dumps({"hookcli": __version__, "models": TINY}).encode(),
    "a key more": {"models": TINY, "extra": 1},
    "no models": {"models": {}},
    "models a list": {"models": ["tinynet"]},
    "a name that is a path": {"models": {"../tinynet": TINY["tinynet"]}},
    "an entry a string": {"models": {"tinynet": "V1"}},
    "an entry key more": {"models": _tiny(url="http://x")},
    "enum not a string": {"models": _tiny(enum=3)},
    "weights a string": {"models": _tiny(weights="V1")},
    "no weights": {"models": _tiny(weights=[])},
    "weights twice": {"models": _tiny(weights=["V2", "V2"])},
    "DEFAULT among weights": {"models": _tiny(weights=["V2", "DEFAULT"])},
    "default not among weights": {"models": _tiny(default="V3")},
    "a weights name with a newline": {"models": _tiny(weights=["V2", "V1\nV3"])},
    "an unknown family": {"models": _tiny(family="audio")},
    "no family (an older cache)": {"models": {"tinynet": {k: v for k, v in TINY["tinynet"].items() if k != "family"}}},
}


@pytest.mark.parametrize("content", _MALFORMED.values(), ids=_MALFORMED.keys())
def test_a_malformed_cache_is_rebuilt(cache, content):
    if isinstance(content, bytes):
        cache.parent.mkdir()
        cache.write_bytes(content)
    else:
        _write(cache, {**_versions(), **content})
    assert "tinynet" not in model_registry()
    written = json.loads(cache.read_text())
    assert {key: written[key] for key in ("hookcli", "torchvision")} == _versions()
    assert list(written["models"]) == [row["model"] for row in describe_models()] and len(written["models"]) == 121


def test_a_cache_too_large_is_rebuilt(cache):
    _write(cache, {**_versions(), "models": TINY})
    cache.write_text(cache.read_text() + " " * (1 << 20))  # still valid JSON, but no cache is this large
    assert "tinynet" not in model_registry()
    assert cache.stat().st_size < 100_000


@pytest.mark.parametrize("kind", ["folder", "fifo", "broken link"])
def test_a_cache_path_that_is_no_file_is_read_from_torchvision(cache, kind):
    cache.parent.mkdir()
    if kind == "folder":
        cache.mkdir()
    elif kind == "fifo":
        os.mkfifo(cache)  # reading it would wait for a writer forever
    else:
        cache.symlink_to(cache.parent / "nowhere.json")
    assert model_registry()["resnet18"].default == "IMAGENET1K_V1"
    assert cache.is_dir() if kind == "folder" else json.loads(cache.read_text())["models"]["resnet18"]


def test_a_cache_folder_that_cannot_be_written_is_no_error(tmp_path, monkeypatch, runner):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder's parent should be")
    monkeypatch.setenv("HOOKCLI_CACHE_DIR", str(blocker / "cache"))
    result = runner.invoke(main, ["models", "--json"])
    assert (result.exit_code, result.stderr) == (0, "")
    assert json.loads(result.stdout) == describe_models()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_where_the_cache_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOOKCLI_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "mine" / "models.json"
    monkeypatch.delenv("HOOKCLI_CACHE_DIR")
    assert cache_path() == tmp_path / "xdg" / "hookcli" / "models.json"
    model_registry()
    assert (tmp_path / "xdg" / "hookcli" / "models.json").is_file()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    assert cache_path() == tmp_path / "home" / ".cache" / "hookcli" / "models.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_path() == tmp_path / "home" / ".cache" / "hookcli" / "models.json"


_NO_TORCH = """
import sys
from hookcli.cli import main

for args in sys.argv[1:]:
    try:
        main(args.split(), prog_name="hookcli")
    except SystemExit as done:
        print("exit", done.code, file=sys.stderr)
print(*(name for name in ("torch", "torchvision", "numpy") if name in sys.modules))
"""


def test_with_a_warm_cache_models_and_refusals_import_no_torch(cache, tmp_path, make_image, monkeypatch):
    model_registry()
    monkeypatch.chdir(tmp_path)
    make_image(tmp_path / "img.png")
    (tmp_path / "resnet18-layer1.safetensors").write_bytes(b"earlier")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _NO_TORCH,
            "models",
            "models --json",
            "extract -m resnet5 -l layer1 img.png",
            "extract -m resnet18 -w IMAGENET1K_V9 -l layer1 img.png -o out.safetensors",
            "extract -m resnet18 -l layer1 img.png",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    lines = result.stdout.splitlines()
    rows = describe_models()
    assert len(lines) == 1 + len(rows) + len(json.dumps(rows, indent=2).splitlines()) + 1
    assert lines[-1] == ""  # none of torch, torchvision, numpy
    assert result.stderr.splitlines() == [
        "exit 0",
        "exit 0",
        "Error: unknown model 'resnet5' (closest: resnet50, resnet152, resnet34). "
        "Hint: 'hookcli models' lists every model",
        "exit 2",
        "Error: model 'resnet18' has no weights 'IMAGENET1K_V9' (available: DEFAULT, IMAGENET1K_V1, none). "
        "Hint: or pass a path to a .pth/.safetensors state dict",
        "exit 2",
        "Error: output 'resnet18-layer1.safetensors' already exists. Hint: add --force to overwrite it",
        "exit 2",
    ]


@pytest.mark.parametrize(
    "command, layers, existing",
    [
        ("extract", ["layer1"], "resnet18-layer1.safetensors"),
        ("extract", ["layer1", " layer1"], "resnet18-layer1.safetensors"),
        ("extract", ["layer1", "fc=logits"], "resnet18-2layers.safetensors"),
        ("grad", ["layer4=final"], "resnet18-final.grad.safetensors"),
    ],
    ids=["one", "one twice", "two", "grad renamed"],
)
def test_an_existing_default_output_is_refused_before_the_model_loads(
    runner, tmp_path, monkeypatch, make_image, no_model, command, layers, existing
):
    monkeypatch.chdir(tmp_path)
    make_image(tmp_path / "img.png")
    (tmp_path / existing).write_bytes(b"earlier")
    result = runner.invoke(main, [command, "-m", "resnet18", *(f"-l{layer}" for layer in layers), "img.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: output '{existing}' already exists. Hint: add --force to overwrite it\n",
    )
    assert (tmp_path / existing).read_bytes() == b"earlier"


def test_a_default_output_named_by_a_glob_is_refused_once_the_model_has_loaded(
    runner, resnet18_args, tmp_path, monkeypatch, make_image
):
    monkeypatch.chdir(tmp_path)
    make_image(tmp_path / "img.png")
    (tmp_path / "resnet18-layer1.safetensors").write_bytes(b"earlier")
    loads = []
    build_model = hookcli.models.loading.build_model
    monkeypatch.setattr(
        hookcli.models.loading,
        "build_model",
        lambda choice, **kwargs: loads.append((choice.name, choice.weights)) or build_model(choice, **kwargs),
    )
    result = runner.invoke(main, resnet18_args("extract", "-l", "lay?r1", "img.png"))
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: output 'resnet18-layer1.safetensors' already exists. Hint: add --force to overwrite it\n",
    )
    assert loads == [("resnet18", "none")]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["-w", "IMAGENET1K_V9", "-l", "layer1"],
            "Error: model 'resnet18' has no weights 'IMAGENET1K_V9' (available: DEFAULT, IMAGENET1K_V1, none). "
            "Hint: or pass a path to a .pth/.safetensors state dict",
        ),
        (
            ["-l", "layer1=a:b"],
            "Error: invalid key name in 'layer1=a:b'. Hint: names may not be empty or contain : @ #",
        ),
        (["-l", " "], "Error: empty layer selector ' '. Hint: give a path such as features.18"),
    ],
    ids=["weights name", "key", "empty selector"],
)
def test_names_are_refused_before_the_model_loads(runner, tmp_path, make_image, no_model, args, message):
    make_image(tmp_path / "img.png")
    result = runner.invoke(
        main, ["extract", "-m", "resnet18", *args, str(tmp_path / "img.png"), "-o", str(tmp_path / "out.safetensors")]
    )
    assert (result.exit_code, result.stderr) == (2, message + "\n")


def test_one_command_reads_and_checks_the_cache_once(monkeypatch):
    from hookcli.models import registry

    registry.model_registry()  # warm
    reads = []
    real = registry._read
    monkeypatch.setattr(registry, "_read", lambda *args: reads.append(1) or real(*args))
    registry._KNOWN.clear()
    first = registry.model_registry()
    assert registry.model_registry() is first and registry.model_registry()["resnet18"].enum == "ResNet18_Weights"
    assert len(reads) == 1
    path = registry.cache_path()
    path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")  # the file changed: read it again
    assert registry.model_registry() == first
    assert len(reads) == 2


def test_a_weights_path_that_is_missing_or_empty_is_refused_before_torch(tmp_path, photo):
    import subprocess
    import sys

    (tmp_path / "empty.pth").write_bytes(b"")
    script = (
        "import sys\nfrom hookcli.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as end:\n"
        "    print('torch' in sys.modules, end.code)\n"
    )
    for weights, message in [
        (
            "./nowhere.pth",
            "Error: weights file not found: 'nowhere.pth'. Hint: check the path, or use --weights DEFAULT|none",
        ),
        ("./empty.pth", "Error: weights file 'empty.pth' is empty."),
    ]:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                script,
                "extract",
                "-m",
                "resnet18",
                "-w",
                weights,
                "-l",
                "layer1",
                str(photo),
                "-o",
                "x.safetensors",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert done.stdout == "False 1\n"
        assert done.stderr.startswith(message)
