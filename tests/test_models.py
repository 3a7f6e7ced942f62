"""Model names, weights sources and default preprocessing."""

import os
import threading
import zipfile
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file

from hookcli.errors import UnknownModelError, WeightsError
from hookcli.inputs.transforms import to_transform
from hookcli.models.loading import load_model
from hookcli.models.state_dicts import weights_cache_path


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_unknown_model_lists_the_closest_names():
    with pytest.raises(UnknownModelError) as caught:
        load_model("resnet5", "none")
    assert (
        str(caught.value)
        == "unknown model 'resnet5' (closest: resnet50, resnet152, resnet34). Hint: 'hookcli models' lists every model"
    )


def test_random_weights_follow_the_seed_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = load_model("resnet18", "none", seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = load_model("resnet18", "NONE", seed=7)
    c = load_model("resnet18", "none", seed=8)
    assert _same_weights(a.module, b.module)
    assert not _same_weights(a.module, c.module)
    assert a.weights == {"source": "none", "seed": 7}
    assert not a.module.training
    assert (a.preprocess.resize, a.preprocess.crop) == (256, 224)


@pytest.fixture(scope="module")
def reference():
    return load_model("resnet18", "none", seed=3).module


@pytest.mark.parametrize("layout", ["plain", "wrapped", "dataparallel", "compiled"])
def test_state_dict_files_load_with_common_wrappers(tmp_path, reference, layout):
    state = reference.state_dict()
    if layout == "wrapped":
        state = {"epoch": 4, "state_dict": state}
    elif layout == "dataparallel":
        state = {"model": {f"module.{k}": v for k, v in state.items()}}
    elif layout == "compiled":
        state = {f"_orig_mod.{k}": v for k, v in state.items()}
    path = tmp_path / "ckpt.pth"
    torch.save(state, path)
    loaded = load_model("resnet18", str(path))
    assert _same_weights(loaded.module, reference)
    assert loaded.weights["source"] == "file" and loaded.weights["path"] == str(path.resolve())
    assert len(loaded.weights["sha256"]) == 64


def test_safetensors_weights_and_a_fine_tuned_class_count(tmp_path):
    torch.manual_seed(0)
    tuned = torchvision.models.resnet18(num_classes=10)
    path = tmp_path / "tuned.safetensors"
    save_file(tuned.state_dict(), str(path))
    loaded = load_model("resnet18", str(path))
    assert loaded.module.fc.out_features == 10
    assert loaded.weights["num_classes"] == 10
    assert _same_weights(loaded.module, tuned)


def test_a_checkpoint_of_another_architecture_is_refused(tmp_path, reference):
    path = tmp_path / "r18.pt"
    torch.save(reference.state_dict(), path)
    with pytest.raises(WeightsError, match=r"weights file '.*r18.pt' does not fit model 'resnet34': missing layer1.2"):
        load_model("resnet34", str(path))


class _Payload:
    pass


def test_pickled_code_is_never_unpickled(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": _Payload()}, path)
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", str(path))
    assert str(caught.value) == (
        f"cannot read weights file '{path}': it holds pickled objects other than tensors, which hookcli refuses "
        "to unpickle. Hint: save a plain state_dict (torch.save(model.state_dict(), path))"
    )


def test_missing_weights_file():
    with pytest.raises(WeightsError, match="weights file not found: 'nowhere/w.pth'"):
        load_model("resnet18", "nowhere/w.pth")


def test_unknown_weights_name_lists_the_available_ones():
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", "IMAGENET1K_V9")
    assert str(caught.value) == (
        "model 'resnet18' has no weights 'IMAGENET1K_V9' (available: DEFAULT, IMAGENET1K_V1, none). "
        "Hint: or pass a path to a .pth/.safetensors state dict"
    )


def _uncached(weights: str) -> str:
    """The error message for resnet18's pretrained weights while they are not cached and downloads are off."""
    cached = Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    return (
        f"pretrained weights ResNet18_Weights.{weights} are not cached and downloads are off (HOOKCLI_OFFLINE); "
        f"place https://download.pytorch.org/models/resnet18-f37072fd.pth at {cached}. "
        "Hint: or use --weights none for random weights"
    )


@pytest.mark.parametrize("spec", ["DEFAULT", "default", "IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1"])
def test_weights_names_win_over_files_and_folders_of_that_name(tmp_path, monkeypatch, reference, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "DEFAULT").mkdir()
    (tmp_path / "default").mkdir()
    for name in ("IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1", "none"):
        torch.save(reference.state_dict(), tmp_path / name)
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", spec)
    assert str(caught.value) == _uncached("IMAGENET1K_V1")
    assert load_model("resnet18", "none", seed=5).weights == {"source": "none", "seed": 5}


def test_a_file_named_like_weights_is_read_when_written_as_a_path(tmp_path, monkeypatch, reference):
    monkeypatch.chdir(tmp_path)
    torch.save(reference.state_dict(), tmp_path / "DEFAULT")
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", "DEFAULT")
    assert str(caught.value) == _uncached("IMAGENET1K_V1")
    loaded = load_model("resnet18", "./DEFAULT")
    assert _same_weights(loaded.module, reference)
    assert loaded.weights["path"] == str(tmp_path / "DEFAULT")


def test_an_unknown_name_with_a_file_of_that_name_says_how_to_load_the_file(tmp_path, monkeypatch, reference):
    monkeypatch.chdir(tmp_path)
    torch.save(reference.state_dict(), tmp_path / "mine")
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", "mine")
    assert str(caught.value) == (
        "model 'resnet18' has no weights 'mine' (available: DEFAULT, IMAGENET1K_V1, none). "
        "Hint: to load the file 'mine' in the current folder, write it as ./mine"
    )
    assert _same_weights(load_model("resnet18", "./mine").module, reference)


@pytest.mark.parametrize(
    "num_classes, changed, detail",
    [
        (
            1000,
            {"conv1.weight": (64, 3, 3, 3), "fc.bias": (999,)},
            "conv1.weight is [64, 3, 3, 3] in the file but [64, 3, 7, 7] in the model (and 1 more)",
        ),
        (
            10,
            {"layer4.1.bn2.running_mean": (256,)},
            "layer4.1.bn2.running_mean is [256] in the file but [512] in the model",
        ),
    ],
    ids=["imagenet", "fine-tuned"],
)
def test_tensors_of_the_wrong_shape_name_the_first_key_and_both_shapes(tmp_path, num_classes, changed, detail):
    state = torchvision.models.resnet18(num_classes=num_classes).state_dict()
    state.update({key: torch.zeros(shape) for key, shape in changed.items()})
    path = tmp_path / "w.pth"
    torch.save(state, path)
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", str(path))
    assert str(caught.value) == (
        f"weights file '{path}' does not fit model 'resnet18': {detail}. "
        "Hint: check that it was saved from the same architecture"
    )


_NOT_WEIGHTS_HINT = (
    "Hint: give a complete file written by torch.save(model.state_dict(), path) or safetensors.torch.save_file"
)


def _write_zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not tensors")


def _write_truncated_checkpoint(path: Path) -> None:
    torch.save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:2000])


_NOT_WEIGHTS_FILES = [
    ("empty.pth", lambda path: path.write_bytes(b""), "is empty"),
    ("notes.pth", lambda path: path.write_text("fc.weight: 0.1, 0.2\n"), "is text"),
    ("notes.safetensors", lambda path: path.write_text('{"a": 1}\n'), "is text"),
    ("cat.png", lambda path: Image.new("RGB", (4, 4)).save(path), "is a PNG image"),
    ("cat.jpg", lambda path: Image.new("RGB", (4, 4)).save(path), "is a JPEG image"),
    ("notes.zip", _write_zip, "is a zip archive but not a PyTorch checkpoint"),
    ("cut.pth", _write_truncated_checkpoint, "is a truncated PyTorch checkpoint (its end is missing)"),
    (
        "noise.bin",
        lambda path: path.write_bytes(bytes(range(1, 256)) * 4),
        "is not a PyTorch (.pth/.pt) or safetensors weights file",
    ),
]


@pytest.mark.parametrize("name, write, kind", _NOT_WEIGHTS_FILES, ids=[case[0] for case in _NOT_WEIGHTS_FILES])
def test_a_file_that_holds_no_weights_says_what_it_is(tmp_path, name, write, kind):
    path = tmp_path / name
    write(path)
    with pytest.raises(WeightsError) as caught:
        load_model("resnet18", str(path))
    assert str(caught.value) == f"weights file '{path}' {kind}. {_NOT_WEIGHTS_HINT}"


def _load_in_a_thread(spec: str, seconds: float = 30) -> BaseException | None:
    """Call load_model in a daemon thread so that a blocking open fails the test instead of hanging it."""
    raised = []

    def target():
        try:
            load_model("resnet18", spec)
        except Exception as err:  # handed back to the test, which checks its type and text
            raised.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"load_model('resnet18', {spec!r}) still runs after {seconds} s"
    return raised[0] if raised else None


@pytest.mark.parametrize("kind", ["a FIFO (named pipe)", "a folder", "a device"])
def test_a_path_that_is_no_regular_file_is_refused_without_opening_it(tmp_path, kind):
    if kind == "a FIFO (named pipe)":
        path = tmp_path / "pipe.pth"
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "a folder":
        path = tmp_path / "checkpoint.pth"
        path.mkdir()
    else:
        path = Path("/dev/zero")
    err = _load_in_a_thread(str(path))
    assert isinstance(err, WeightsError)
    assert str(err) == (
        f"weights path '{path}' is not a regular file but {kind}. "
        "Hint: give the path of the .pth/.pt/.safetensors file itself"
    )


def test_pretrained_weights_are_read_from_the_torch_home_cache(reference):
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    cached = weights_cache_path(weights)
    assert cached == Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True, exist_ok=True)
    torch.save(reference.state_dict(), cached)
    try:
        for spec in ("DEFAULT", "IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1"):
            loaded = load_model("resnet18", spec)
            assert _same_weights(loaded.module, reference)
            assert loaded.weights == {"source": "torchvision", "name": "ResNet18_Weights.IMAGENET1K_V1"}
            assert loaded.categories[:2] == ["tench", "goldfish"] and len(loaded.categories) == 1000
        cached.write_bytes(b"not a checkpoint")
        with pytest.raises(WeightsError, match=f"cached weights file {cached} cannot be loaded"):
            load_model("resnet18", "DEFAULT")
    finally:
        cached.unlink()


def test_uncached_pretrained_weights_say_where_to_put_the_file():
    with pytest.raises(WeightsError) as caught:
        load_model("alexnet", "DEFAULT")
    cached = Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth"
    assert str(caught.value) == (
        "pretrained weights AlexNet_Weights.IMAGENET1K_V1 are not cached and downloads are off (HOOKCLI_OFFLINE); "
        f"place https://download.pytorch.org/models/alexnet-owt-7be5be79.pth at {cached}. "
        "Hint: or use --weights none for random weights"
    )


@pytest.mark.parametrize("name, spec", [("resnet50", "IMAGENET1K_V2"), ("vit_b_16", "IMAGENET1K_SWAG_E2E_V1")])
def test_default_preprocessing_equals_the_weights_transforms(photo, name, spec):
    from hookcli.inputs.preprocess import Preprocess

    weights = torchvision.models.get_model_weights(name)[spec]
    ours = to_transform(Preprocess.from_transforms(weights.transforms()))
    image = Image.open(photo).convert("RGB")
    assert torch.equal(ours(image), weights.transforms()(image))


def test_a_download_message_never_reaches_stdout(runner, images, monkeypatch):
    """torch.hub announces downloads on stdout; with -o - that would corrupt the safetensors bytes."""
    import sys

    import torchvision.models._api as api
    from safetensors.torch import load as load_bytes

    from hookcli.cli import main

    torch.manual_seed(0)
    state = torchvision.models.resnet18().state_dict()

    def fake_download(url, *args, **kwargs):
        sys.stdout.write(f'Downloading: "{url}" to somewhere\n')
        return state

    monkeypatch.delenv("HOOKCLI_OFFLINE")
    monkeypatch.setattr(api, "load_state_dict_from_url", fake_download)
    result = runner.invoke(
        main,
        ["extract", "-m", "resnet18", "-l", "avgpool", "--resize", "32", "--crop", "32", "-o", "-", str(images[0])],
    )
    assert result.exit_code == 0, result.stderr
    assert load_bytes(result.stdout_bytes)["avgpool"].shape == (1, 512, 1, 1)
    assert result.stderr.startswith('Downloading: "https://download.pytorch.org/models/resnet18-f37072fd.pth"')
