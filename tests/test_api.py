"""The Python API as users call it: hookcli.extract / grad / cam / grid / layers, plan and execute."""

import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.errors import HookcliError, ImageError, OutputExistsError, UnknownLayerError, UsageProblem
from hookcli.events import Advanced, Note, Skipped, Started, Wrote
from hookcli.run.outputs import DEFAULT_OUTPUT, Output

SMALL = {"resize": 64, "crop": 64}
SMALL_FLAGS = ["--resize", "64", "--crop", "64"]


def _read(path):
    with safe_open(str(path), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


def _same_files(first, second):
    (a, meta_a), (b, meta_b) = _read(first), _read(second)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert meta_a == meta_b
    return a, meta_a


def test_extract_to_a_file_writes_what_the_cli_writes(runner, resnet18_args, images, tmp_path):
    args = resnet18_args(
        "extract",
        "-l",
        "layer2",
        "-l",
        "fc=logits",
        "--pool",
        "avg",
        "--dtype",
        "float16",
        "-b",
        2,
        "--fuse",
        "-d",
        "cpu",
    )
    result = runner.invoke(main, [*args, *SMALL_FLAGS, "-o", str(tmp_path / "cli.safetensors"), *map(str, images)])
    assert result.exit_code == 0, result.output
    written = hookcli.extract(
        "resnet18",
        ["layer2", "fc=logits"],
        [str(p) for p in images],
        output=tmp_path / "api.safetensors",
        weights="none",
        pool="avg",
        dtype="float16",
        batch_size=2,
        fuse=True,
        device="cpu",  # fusion is the CPU's
        **SMALL,
    )
    assert written == tmp_path / "api.safetensors"
    tensors, metadata = _same_files(tmp_path / "cli.safetensors", written)
    assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == {
        "layer2": ((3, 128), torch.float16),
        "logits": ((3, 1000), torch.float16),
    }
    assert (metadata["pool"], metadata["fused"], json.loads(metadata["inputs"])) == (
        "avg",
        "15",
        [str(p) for p in images],
    )


def test_in_memory_features_are_a_read_only_mapping_with_the_metadata_a_file_would_hold(images, tmp_path):
    path = hookcli.extract(
        "resnet18", "layer1.0.relu", images, output=tmp_path / "f.safetensors", weights="none", capture="both", **SMALL
    )
    features = hookcli.extract("resnet18", "layer1.0.relu", images, weights="none", capture="both", **SMALL)
    stored, metadata = _read(path)
    assert isinstance(features, Mapping) and sorted(features) == sorted(stored)
    assert list(features) == [
        "layer1.0.relu:0@input",
        "layer1.0.relu:0",
        "layer1.0.relu:1@input",
        "layer1.0.relu:1",
    ]  # in the order of the metadata's layer table
    assert all(torch.equal(features[k], stored[k]) for k in stored)
    assert features.metadata == metadata
    assert features.inputs == [str(p) for p in images] and features.skipped == []
    assert features.facts.calls == {"layer1.0.relu": 2} and features.facts.fused == 0 and features.notes == ()
    with pytest.raises(TypeError):
        features["layer1.0.relu:0"] = torch.zeros(1)
    assert features.shape("layer1.0.relu:1") == [3, 64, 16, 16] and features.dtype("layer1.0.relu:1") == "F32"
    assert np.array_equal(features.read("layer1.0.relu:1", 2), stored["layer1.0.relu:1"][2].numpy())


def test_a_folder_run_reports_events_and_resumes(images, tmp_path, make_image):
    broken = tmp_path / "imgs" / "broken.png"
    broken.write_bytes(b"not an image")
    inputs = [images[0], broken, images[1], images[2]]
    folder = f"{tmp_path / 'feats'}/"
    options = {"output": folder, "shard_size": 2, "on_error": "skip", "weights": "none", "batch_size": 3, **SMALL}
    events = []
    index = hookcli.extract("resnet18", "layer3", inputs, progress=events.append, **options)
    assert index == tmp_path / "feats" / "index.jsonl"
    assert events[0] == Started(total=4, done=0, output=folder)
    skipped = [e for e in events if isinstance(e, Skipped)]
    assert [e.input for e in skipped] == [str(broken)]
    assert (
        skipped[0].error == f"'{broken}' is not an image Pillow can read. Hint: check the file type; text or "
        "corrupt files cannot be used"
    )
    # Batches of 3 cut where shards of 2 end: inputs 0-1, 2, 3 (a batch never spans two shards).
    assert [e.count for e in events if isinstance(e, Advanced)] == [2, 1, 1]
    assert events[-1] == Wrote(index)
    with hookcli.open_features(folder) as features:
        assert features.shape("layer3") == [3, 256, 4, 4]
        assert json.loads(features.metadata["skipped"])[0]["input"] == str(broken)
    again = []
    assert hookcli.extract("resnet18", "layer3", inputs, progress=again.append, **options) == index
    assert again == [Started(total=4, done=4, output=folder), Wrote(index)]  # nothing computed twice


def test_errors_are_the_librarys_own_with_the_cli_texts(runner, resnet18_args, images, tmp_path):
    existing = tmp_path / "o.safetensors"
    existing.write_bytes(b"precious")
    base = {"weights": "none", **SMALL}
    cases = [
        (
            lambda: hookcli.extract("resnet18", "layer1", images[0], output=existing, **base),
            OutputExistsError,
            f"output '{existing}' already exists. Hint: add --force to overwrite it",
        ),
        (
            lambda: hookcli.extract("resnet18", "layer1", images[0], weights="DEFAULT", seed=3),
            UsageProblem,
            "--seed only applies to --weights none and to resample's pairing (pretrained and file weights are fixed). "
            "Hint: see 'hookcli extract --help'",
        ),
        (
            lambda: hookcli.extract("resnet18", "layer5", images[0], **base),
            UnknownLayerError,
            "no layer 'layer5' in resnet18 (closest: layer4, layer3, layer2). "
            "Hint: run 'hookcli layers --model resnet18' to list them",
        ),
        (
            lambda: hookcli.extract(
                "resnet18", "layer1", images[0], output=tmp_path / "x.safetensors", shard_size=4, **base
            ),
            UsageProblem,
            "--shard-size applies to a folder output (-o DIR/). Hint: see 'hookcli extract --help'",
        ),
        (
            lambda: hookcli.cam("resnet18", images[0], layer="layer4.*", **base),
            UsageProblem,
            "cam takes one layer, and 'layer4.*' matches 2. Hint: see 'hookcli cam --help'",
        ),
        (
            lambda: hookcli.extract("resnet18", "layer1", images[0], precision="fp8", **base),
            UsageProblem,
            "precision must be one of fp32, tf32, bf16, fp16, not 'fp8'. Hint: see --help for the values each option "
            "takes",
        ),
        (
            lambda: hookcli.extract("resnet18", "layer1", images[0], batch_size=0, **base),
            UsageProblem,
            "batch_size must be a whole number of at least 1, not 0. Hint: see --help for the values each option takes",
        ),
        (
            lambda: hookcli.extract("resnet18", "layer1", images[0], device="tpu", **base),
            UsageProblem,
            "invalid device: 'tpu' is not a device; use auto, cpu, cuda, cuda:N or mps. Hint: see --help for the "
            "values each option takes",
        ),
        (
            lambda: hookcli.grid(tmp_path / "nothing.safetensors"),
            HookcliError,
            f"no such file: '{tmp_path / 'nothing.safetensors'}'. Hint: check the path",
        ),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind) as caught:
            call()
        assert str(caught.value) == text
    assert existing.read_bytes() == b"precious"
    # The command line prints the same sentences.
    result = runner.invoke(main, resnet18_args("extract", "-l", "layer1", "-o", str(existing), str(images[0])))
    assert (result.exit_code, result.stderr) == (2, f"Error: {cases[0][2]}\n")
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'; did you mean 'batch_size'"):
        hookcli.extract("resnet18", "layer1", images[0], batchsize=2)
    with pytest.raises(TypeError, match="grad\\(\\) got an unexpected keyword argument 'pool'"):
        hookcli.grad("resnet18", "layer1", images[0], pool="avg")


def test_usage_errors_come_before_the_model_loads(images, tmp_path, monkeypatch):
    import hookcli.models.loading

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(hookcli.models.loading, "build_model", no_loading)
    existing = tmp_path / "o.safetensors"
    existing.write_bytes(b"")
    with pytest.raises(OutputExistsError):
        hookcli.extract("resnet18", "layer1", images[0], output=existing)
    with pytest.raises(OutputExistsError):
        (tmp_path / "cams").mkdir()
        (tmp_path / "cams" / "cams.safetensors").write_bytes(b"")
        hookcli.cam("resnet18", images[0], output=tmp_path / "cams")
    with pytest.raises(UsageProblem, match="fp16 compute needs a GPU"):
        hookcli.extract("resnet18", "layer1", images[0], precision="fp16", device="cpu")


@pytest.mark.parametrize(
    "call", ["extract('resnet18', 'layer1', 'missing.png')", "plan('extract', 'resnet18', 'layer1', 'missing.png')"]
)
def test_a_missing_input_is_refused_before_torch_is_imported(tmp_path, call):
    code = (
        f"import sys, hookcli\ntry:\n    hookcli.{call}\n"
        "except hookcli.HookcliError as err:\n    print(type(err).__name__, err, err.exit_code)\n"
        "print('torch' in sys.modules)"
    )
    listed = "import hookcli.models.registry as r; r.model_registry()"  # the model names, cached as a first run does
    subprocess.run([sys.executable, "-c", listed], check=True, cwd=tmp_path)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert result.stdout.splitlines() == [
        "InputError no such file or folder: 'missing.png'. Hint: check the path 2",
        "False",
    ]


def test_grad_and_cam_write_what_the_cli_writes(runner, resnet18_args, images, tmp_path):
    paths = [str(p) for p in images[:2]]
    result = runner.invoke(
        main,
        resnet18_args(
            "grad", "-l", "layer4", "-t", "top2", *SMALL_FLAGS, "-o", str(tmp_path / "cli.safetensors"), *paths
        ),
    )
    assert result.exit_code == 0, result.output
    written = hookcli.grad(
        "resnet18", "layer4", paths, output=tmp_path / "api.safetensors", target="top2", weights="none", **SMALL
    )
    tensors, metadata = _same_files(tmp_path / "cli.safetensors", written)
    assert sorted(tensors) == ["layer4", "layer4@grad#0", "layer4@grad#1"] and metadata["target"] == "top2"

    result = runner.invoke(
        main,
        resnet18_args("cam", "-l", "layer3", "-t", "5", *SMALL_FLAGS, "-o", str(tmp_path / "cli-cams"), *paths),
    )
    assert result.exit_code == 0, result.output
    events = []
    written = hookcli.cam(
        "resnet18",
        paths,
        layer="layer3",
        target="5",
        output=tmp_path / "api-cams",
        weights="none",
        progress=events.append,
        **SMALL,
    )
    assert written == tmp_path / "api-cams" / "cams.safetensors"
    _same_files(tmp_path / "cli-cams" / "cams.safetensors", written)
    names = [f"{i:05d}_{n}.png" for i, n in enumerate("ab")]
    pngs = [tmp_path / "api-cams" / n for n in names]
    assert [Path(e.path) for e in events if isinstance(e, Wrote)] == [written, *pngs]
    for name in names:
        cli_png = np.asarray(Image.open(tmp_path / "cli-cams" / name))
        assert np.array_equal(cli_png, np.asarray(Image.open(tmp_path / "api-cams" / name)))
    maps = hookcli.cam("resnet18", paths, layer="layer3", target="5", weights="none", **SMALL)
    assert torch.equal(maps["cam"], _read(written)[0]["cam"]) and maps.metadata["cam_layer"] == "layer3"
    assert not (tmp_path / "resnet18-cam").exists()  # in memory: no folder, no pictures


def test_grid_in_memory_draws_what_the_cli_writes(runner, images, tmp_path):
    path = hookcli.extract(
        "resnet18", ["layer2", "avgpool"], images[:2], output=tmp_path / "f.safetensors", weights="none", **SMALL
    )
    result = runner.invoke(main, ["grid", str(path), "--top", "8", "--cmap", "gray", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    pictures = hookcli.grid(path, top=8, cmap="gray")
    assert sorted(pictures) == sorted(Path(p).name for p in result.stdout.split())
    for name, pixels in pictures.items():
        assert np.array_equal(pixels, np.asarray(Image.open(tmp_path / "g" / name)))
    features = hookcli.extract("resnet18", ["layer2", "avgpool"], images[:2], weights="none", **SMALL)
    written = hookcli.grid(features, output=tmp_path / "g2", top=8, cmap="gray", images=1)
    assert [p.name for p in written] == ["layer2__00001_b.png", "avgpool__00001_b.png"]
    assert np.array_equal(np.asarray(Image.open(written[0])), pictures["layer2__00001_b.png"])
    with pytest.raises(UsageProblem, match="invalid channels: 'x' is not a channel range"):
        hookcli.grid(features, channels="x")


def test_layers_lists_what_the_cli_lists(runner):
    result = runner.invoke(main, ["layers", "-m", "resnet18", "--json", "--depth", "2"])
    rows = hookcli.layers("resnet18", depth=2)
    assert [r.to_dict() for r in rows] == json.loads(result.stdout)
    assert rows[1].path == "conv1" and rows[1].output == [1, 64, 112, 112]
    assert (rows[0].path, rows[0].output) == (".", [1, 1000])  # the model itself, what -l . stores


def test_plan_resolves_everything_once_and_is_frozen(images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = hookcli.plan("grad", "resnet18", "layer4", images, output=DEFAULT_OUTPUT, weights="none", compile=True)
    assert run.output == Output("file", "resnet18-layer4.grad.safetensors")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert (run.settings.memory_format, run.settings.workers, str(run.settings.device)) == ("channels_last", 0, device)
    assert run.record.command == {"target": "top1"} and run.record.fuse is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.force = True
    events = []
    assert hookcli.execute(run, progress=events.append) == Path("resnet18-layer4.grad.safetensors")
    assert events[0] == Note("--compile: gradients need the eager graph with hooks; running eagerly")
    assert (tmp_path / "resnet18-layer4.grad.safetensors").exists()


def test_no_readable_image_is_an_error_and_writes_nothing(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"")
    with pytest.raises(ImageError, match="none of the input images could be read"):
        hookcli.extract(
            "resnet18", "layer1", broken, output=tmp_path / "o.safetensors", on_error="skip", weights="none"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.png"]


def test_the_written_path_is_reported_as_given(runner, resnet18_args, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        main,
        resnet18_args("extract", "-l", "layer1", *SMALL_FLAGS, "-o", "./out.safetensors", str(images[0])),
    )
    assert (result.exit_code, result.stdout) == (0, "./out.safetensors\n")
    events = []
    returned = hookcli.extract(
        "resnet18", "layer1", images[0], output="./api.safetensors", weights="none", progress=events.append, **SMALL
    )
    assert returned == Path("api.safetensors") and events[-1] == Wrote("./api.safetensors")


def test_every_reader_is_a_read_only_mapping_of_the_same_values(images, tmp_path):
    import numpy as np

    from hookcli.storage.features import FeatureFile
    from hookcli.storage.shards import ShardedFeatures

    paths = [str(p) for p in images[:3]]
    options = {"weights": "none", "resize": 32, "crop": 32, "batch_size": 2}
    memory = hookcli.extract("resnet18", ["layer1", "fc"], paths, **options)
    hookcli.extract("resnet18", ["layer1", "fc"], paths, output=tmp_path / "one.safetensors", **options)
    hookcli.extract("resnet18", ["layer1", "fc"], paths, output=f"{tmp_path}/feats/", shard_size=2, **options)
    with (
        hookcli.open_features(tmp_path / "one.safetensors") as file,
        hookcli.open_features(f"{tmp_path}/feats/") as folder,
    ):
        assert (type(file), type(folder)) == (FeatureFile, ShardedFeatures)
        for reader in (file, folder):
            assert sorted(reader) == sorted(memory) == ["fc", "layer1"] and len(reader) == 2 and "fc" in reader
            assert reader.inputs == memory.inputs == paths
            for key in memory:
                np.testing.assert_array_equal(reader[key], memory[key].numpy())
                np.testing.assert_array_equal(reader.row(key, 2), memory[key][2].numpy())
            assert dict(reader.items()).keys() == {"fc", "layer1"}
        with pytest.raises(KeyError):
            file["layer9"]


def test_a_run_checks_its_precision_grid_folder_and_part_once(calls_to, images, tmp_path):
    from hookcli.run import launch, outputs, speed

    calls = calls_to(speed.check_precision, outputs.refuse_drawn_grids, launch.parse_part)
    written = hookcli.extract(
        "resnet18", "layer1", images[:2], weights="none", output=f"{tmp_path}/feats/", part="1/2", grid=tmp_path / "g"
    )
    assert written == tmp_path / "feats" / "index.jsonl"
    assert calls == ["parse_part", "check_precision"]  # a process of many may find its own run's pictures there
    calls.clear()
    hookcli.extract("resnet18", "layer1", images[:2], weights="none", output=f"{tmp_path}/alone/", grid=tmp_path / "h")
    assert calls == ["refuse_drawn_grids", "check_precision"]


def test_options_objects_give_what_the_same_keywords_give(images):
    """``options=`` takes the typed objects an editor completes; keywords beside them win, and an option the command
    does not take is refused as an unknown keyword is."""
    small = {"weights": "none", "resize": 32, "crop": 32}
    typed = hookcli.RunOptions(**small, batch_size=2, pool="avg")
    by_keywords = hookcli.extract("resnet18", "layer2", images, **small, batch_size=2, pool="avg")
    by_object = hookcli.extract("resnet18", "layer2", images, options=typed)
    assert torch.equal(by_object["layer2"], by_keywords["layer2"])
    assert by_object.metadata == by_keywords.metadata
    overridden = hookcli.extract("resnet18", "layer2", images[:1], options=typed, pool="max")
    assert overridden.metadata["pool"] == "max" and by_object.metadata["pool"] == "avg"
    with pytest.raises(TypeError, match=r"^extract\(\) got an unexpected keyword argument 'top'"):
        hookcli.extract("resnet18", "layer2", images, options=hookcli.RunOptions(top=3))
    with pytest.raises(TypeError, match=r"^options must be RunOptions \(or a list of them\), not GridOptions$"):
        hookcli.extract("resnet18", "layer2", images, options=hookcli.GridOptions())
    how = hookcli.CompareOptions(method="rsa", rsa_rows=3)
    compared = hookcli.compare("resnet18", ["layer1", "layer2"], images, options=[typed, how])
    assert list(compared) == ["rsa"] and compared["rsa"].shape == (2, 2)
    with pytest.raises(UsageProblem, match="rsa_rows must be a whole number of at least 3, not 1"):
        hookcli.CompareOptions(method="rsa", rsa_rows=1)
    drawn = hookcli.grid(by_object, options=hookcli.GridOptions(channels="0:4", columns=2), keys="layer2")
    assert sorted(drawn) == sorted(hookcli.grid(by_object, channels="0:4", columns=2, keys="layer2"))


def test_an_option_given_none_takes_its_default(images):
    small = {"weights": "none", "resize": 32, "crop": 32}
    plain = hookcli.grad("resnet18", "layer4", images[:2], **small)
    given_none = hookcli.grad("resnet18", "layer4", images[:2], target=None, batch_size=None, dtype=None, **small)
    assert given_none.metadata["targets"] == plain.metadata["targets"]
    assert torch.equal(given_none["layer4@grad"], plain["layer4@grad"])
    drawn = hookcli.grid(plain, keys="layer4", channels="0:4", columns=None)
    assert list(drawn) == ["layer4__00000_a.png", "layer4__00001_b.png"]
