"""Model families beyond classification: discovery, the natural input of each, and rows of their own shapes."""

import json

import numpy as np
import pytest
import torch

import hookcli
from hookcli.cli import main
from hookcli.errors import CaptureError, FeatureFileError
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_transform
from hookcli.storage.features import FeatureFile, Features
from hookcli.storage.fileformat import RunFacts, RunRecord, run_metadata
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shard_writer import ShardWriter
from hookcli.storage.shards import ShardedFeatures
from hookcli.storage.writers import RowBuffer


@pytest.mark.parametrize(
    "model, options, path, shape",
    [
        (
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            ["--input-size", "96"],
            "backbone.body",
            {"0": [1, 160, 10, 10], "1": [1, 960, 10, 10]},
        ),
        ("lraspp_mobilenet_v3_large", ["--input-size", "64"], "classifier", [1, 21, 8, 8]),
        ("r3d_18", ["--input-size", "32", "--frames", "4"], "layer2", [1, 128, 2, 8, 8]),
        ("raft_small", ["--input-size", "128"], "update_block.flow_head", [1, 2, 16, 16]),
        ("quantized_resnet18", ["--input-size", "64"], "layer4", [1, 512, 2, 2]),
    ],
)
def test_layers_runs_each_family_on_its_natural_input(runner, model, options, path, shape):
    result = runner.invoke(main, ["layers", "--model", model, "--json", *options])
    assert result.exit_code == 0, result.output
    rows = {row["path"]: row for row in json.loads(result.stdout)}
    assert rows[path]["output"] == shape and rows[path]["calls"] >= 1


def test_layers_of_a_detection_model_shows_its_final_detections(runner):
    rows = {row.path: row for row in hookcli.layers("fasterrcnn_mobilenet_v3_large_320_fpn", input_size=64)}
    assert rows["transform"].output[0] is None  # an ImageList is not a tensor
    assert rows["roi_heads"].output[0][0] == {
        "boxes": [rows["roi_heads"].output[0][0]["boxes"][0], 4],
        "labels": rows["roi_heads"].output[0][0]["labels"],
        "scores": rows["roi_heads"].output[0][0]["scores"],
    }


@pytest.mark.parametrize(
    "name, kind, resize, crop, mean",
    [
        ("resnet18", "classification", 256, 224, (0.485, 0.456, 0.406)),
        ("deeplabv3_resnet50", "segmentation", 520, None, (0.485, 0.456, 0.406)),
        ("fasterrcnn_resnet50_fpn", "detection", None, None, None),
        ("r2plus1d_18", "video", (128, 171), 112, (0.43216, 0.394666, 0.37645)),
        ("mvit_v2_s", "video", 256, 224, (0.45, 0.45, 0.45)),
        ("raft_large", "optical_flow", None, None, (0.5, 0.5, 0.5)),
        ("quantized_mobilenet_v2", "classification", 256, 224, (0.485, 0.456, 0.406)),
    ],
)
def test_each_family_takes_its_weights_own_preprocessing(name, kind, resize, crop, mean):
    import torchvision.models

    spec = Preprocess.from_transforms(torchvision.models.get_model_weights(name).DEFAULT.transforms())
    assert (spec.kind, spec.resize, spec.crop, spec.mean) == (kind, resize, crop, mean)
    assert Preprocess.from_metadata(spec.to_json()) == spec


def test_family_transforms_equal_torchvisions_presets(photo):
    import numpy as np
    import torchvision.models
    from PIL import Image

    image = Image.open(photo).convert("RGB").resize((60, 48))
    for name in ("deeplabv3_resnet50", "fasterrcnn_resnet50_fpn", "raft_small"):
        weights = torchvision.models.get_model_weights(name).DEFAULT
        ours = to_transform(Preprocess.from_transforms(weights.transforms()))(image)
        if name == "raft_small":
            from torchvision.transforms import functional as F

            tensor = F.pil_to_tensor(image)[None]
            theirs = weights.transforms()(tensor, tensor)[0][0]
        else:
            theirs = weights.transforms()(image)
        assert torch.equal(ours, theirs), name
    frames = np.stack([np.asarray(image)] * 3)
    weights = torchvision.models.get_model_weights("r3d_18").DEFAULT
    clip = to_transform(Preprocess.from_transforms(weights.transforms()))(frames)
    assert clip.shape == (3, 3, 112, 112)
    assert torch.equal(clip, weights.transforms()(torch.from_numpy(frames).permute(0, 3, 1, 2)))


def test_a_preprocessing_record_is_checked_for_its_kind():
    with pytest.raises(
        ValueError,
        match="kind must be one of classification, segmentation, detection, video, optical_flow, not 'audio'",
    ):
        Preprocess.from_metadata(json.dumps({"resize": 1, "crop": 1, "kind": "audio"}))
    with pytest.raises(ValueError, match="crop must be a whole number from 1 to 8192, not None"):
        Preprocess(resize=256, crop=None, kind="video")
    with pytest.raises(ValueError, match="resize must be a whole number from 1 to 8192, not None"):
        Preprocess(resize=None, crop=224)
    with pytest.raises(ValueError, match=r"resize must be a whole number from 1 to 8192, not \(224, 0\)"):
        Preprocess(resize=(224, 0), crop=None)
    assert Preprocess(resize=(224, 160), crop=None).resize == (224, 160)  # squashed to that size, as HF's ViT does
    with pytest.raises(ValueError, match="mean and std must both be given or both be left out"):
        Preprocess(resize=None, crop=None, mean=None, kind="detection")
    assert Preprocess(resize=None, crop=None, mean=None, std=None, kind="detection").decode_size is None


def _ragged_rows() -> RowBuffer:
    rows = RowBuffer(3)
    rows.add(
        {"maps": [torch.full((2, 3, 4), 1.0), torch.full((2, 5, 2), 2.0)], "flat": torch.tensor([1.0, 2.0])},
        slice(None),
        ["a.jpg", "b.jpg"],
    )
    rows.add({"maps": [torch.full((2, 1, 6), 3.0)], "flat": torch.tensor([3.0])}, slice(None), ["c.jpg"])
    return rows


def test_ragged_rows_held_padded_read_as_stored_without_padding(tmp_path):
    tensors = _ragged_rows().tensors(flat=False)
    assert list(tensors) == ["maps", "maps@shape", "flat"]
    assert tensors["maps"].shape == (3, 2, 5, 6) and tensors["maps@shape"].tolist() == [[2, 3, 4], [2, 5, 2], [2, 1, 6]]
    assert tensors["maps"][0, :, 3:].abs().sum() == 0 and tensors["maps"][0, :, :, 4:].abs().sum() == 0
    record = RunRecord(
        model="m",
        weights={},
        layers={"x": "maps"},
        layer_types={"x": "Conv2d"},
        capture="output",
        preprocess={},
        pool="none",
        dtype="float32",
        precision="fp32",
        memory_format="contiguous",
        fuse=False,
        device="cpu",
        on_error="fail",
        shard_size=None,
        inputs=(),
        command={},
    )
    metadata = run_metadata(record, RunFacts(calls={"x": 1}), keys=list(tensors), flat=False)
    assert metadata["format"] == "2" and json.loads(metadata["layers"])["x"]["keys"] == ["maps"]
    path, flat = tmp_path / "r.safetensors", tmp_path / "flat.safetensors"
    write_safetensors(tensors, metadata, path)  # format 2, as files were before format 3
    stored = _ragged_rows().tensors()
    assert stored["maps"].shape == (2 * 3 * 4 + 2 * 5 * 2 + 2 * 1 * 6,)  # format 3: the rows' values, no padding
    write_safetensors(stored, run_metadata(record, RunFacts(calls={"x": 1}), keys=list(stored)), flat)
    assert FeatureFile(flat).metadata["format"] == "3" and flat.stat().st_size < path.stat().st_size
    for features in (FeatureFile(path), FeatureFile(flat), Features(tensors, metadata)):
        with features:
            assert list(features.keys()) == ["maps", "flat"]
            assert features.ragged("maps") and not features.ragged("flat")
            assert features.shape("maps") == [3, 2, 5, 6]
            assert [features.row_shape("maps", i) for i in range(3)] == [[2, 3, 4], [2, 5, 2], [2, 1, 6]]
            assert features.read("maps", 1).tolist() == [[[2.0] * 2] * 5] * 2
            assert features.read("maps", 2, slice(1, 2)).shape == (1, 1, 6)
            assert features.read("maps").shape == (3, 2, 5, 6)
            np.testing.assert_array_equal(features.read_rows("maps", 1, 3), tensors["maps"][1:3].numpy())
            assert features.row_shape("flat", 0) == []


def test_a_companion_that_does_not_fit_is_refused(tmp_path):
    tensors = _ragged_rows().tensors(flat=False)
    path = tmp_path / "bad.safetensors"
    write_safetensors({**tensors, "maps@shape": tensors["maps@shape"][:, :2]}, {}, path)
    with pytest.raises(FeatureFileError) as caught:
        FeatureFile(path)
    assert str(caught.value).startswith(
        f"'{path}' is damaged: 'maps@shape' is not the row shapes of 'maps' [3, 2, 5, 6]"
    )
    shapes = tensors["maps@shape"].clone()
    shapes[1, 1] = 9
    write_safetensors({**tensors, "maps@shape": shapes}, {}, path, force=True)
    with FeatureFile(path) as features, pytest.raises(FeatureFileError) as caught:
        features.read("maps", 1)
    assert str(caught.value).startswith(
        f"'{path}' is damaged: row 1 of 'maps' claims shape [2, 9, 2], outside the stored [2, 5, 6]"
    )


def _ragged_folder(folder, version):
    """A shard folder of 3 inputs in 2 shards, with two ragged keys, in file format ``version``."""
    writer = ShardWriter(folder, {"run": 1, "inputs": 3, "shard_size": 2}, 3)
    header = {
        "hookcli_index": 1,
        "identity": {"run": 1, "inputs": 3, "shard_size": 2},
        "shard_size": 2,
        "inputs": 3,
        "shard_name": "features-{:05d}.safetensors",
        "metadata": {"format": version},
    }
    writer.start_writing(header)
    first, second = RowBuffer(2), RowBuffer(1)
    first.add(
        {"maps": [torch.ones(1, 2, 3), torch.ones(1, 4, 1)], "boxes": [torch.ones(2, 4), torch.ones(0, 4)]},
        slice(None),
        ["a", "b"],
    )
    second.add({"maps": [torch.full((1, 1, 5), 7.0)], "boxes": [torch.ones(1, 4)]}, slice(None), ["c"])
    for number, rows in enumerate((first, second)):
        writer.submit(
            number,
            rows.tensors(flat=version == "3"),
            {"format": version, "shard": str(number), "inputs": json.dumps(rows.inputs)},
            rows.inputs,
            [],
        )
    writer.close()


@pytest.mark.parametrize("version", ["2", "3"])
def test_a_shard_folder_reads_ragged_rows_across_shards(tmp_path, version):
    _ragged_folder(tmp_path / "feats", version)
    with ShardedFeatures(tmp_path / "feats") as features:
        assert features.ragged("maps") and features.shape("maps") == [3, 1, 4, 5]
        assert [features.row_shape("maps", i) for i in range(3)] == [[1, 2, 3], [1, 4, 1], [1, 1, 5]]
        assert features.read("maps", 2).tolist() == [[[7.0] * 5]]
        whole = features.read("maps")
        assert whole.shape == (3, 1, 4, 5) and whole[2, 0, 0].tolist() == [7.0] * 5 and whole[0].sum() == 6


@pytest.mark.parametrize("version", ["2", "3"])
def test_the_shape_of_each_ragged_key_of_a_folder_opens_no_shard_again(tmp_path, monkeypatch, version):
    _ragged_folder(tmp_path / "feats", version)
    opened = []

    class CountedFeatureFile(FeatureFile):
        def __init__(self, source, **options):
            opened.append(source.name)
            super().__init__(source, **options)

    monkeypatch.setattr("hookcli.storage.shards.FeatureFile", CountedFeatureFile)
    with ShardedFeatures(tmp_path / "feats") as features:
        assert opened == ["features-00000.safetensors", "features-00001.safetensors"]  # once each, to check it
        for _ in range(3):
            assert [features.shape("maps"), features.shape("boxes")] == [[3, 1, 4, 5], [3, 2, 4]]
        assert len(opened) == 2  # the largest rows were read on the opening pass


def test_layers_says_when_the_dummy_input_is_too_small_for_the_model(runner):
    result = runner.invoke(main, ["layers", "--model", "s3d", "--input-size", "64", "--frames", "4"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: s3d cannot run on the dummy clip: Given input size: (832x1x4x4). Calculated "
        "output size: (832x0x2x2). Output size is too small. Hint: give another --input-size "
        "or --frames\n"
    )


def test_a_key_that_changes_form_between_batches_is_refused():
    rows = RowBuffer(2)
    rows.add({"maps": torch.ones(1, 2, 3)}, slice(None), ["a.jpg"])
    with pytest.raises(ValueError, match="'maps' came as rows of their own shapes after coming the other way"):
        rows.add({"maps": [torch.ones(2, 4)]}, slice(None), ["b.jpg"])


def test_a_flat_companion_that_does_not_account_for_the_values_is_refused(tmp_path):
    tensors = _ragged_rows().tensors()
    path = tmp_path / "bad.safetensors"
    shapes = tensors["maps@shape"].clone()
    shapes[1, 1] = 9
    write_safetensors({**tensors, "maps@shape": shapes}, {"format": "3"}, path)
    with FeatureFile(path) as features, pytest.raises(FeatureFileError) as caught:
        features.read("maps", 1)
    assert str(caught.value) == (
        f"'{path}' is damaged: the row shapes in 'maps@shape' account for 72 values, and 'maps' holds 56. Hint: "
        "it was not written whole by a safetensors writer; write it again"
    )
    write_safetensors({**tensors, "maps": tensors["maps"][None]}, {"format": "3"}, path, force=True)
    with pytest.raises(FeatureFileError) as caught:
        FeatureFile(path)
    assert str(caught.value) == (
        f"'{path}' is damaged: 'maps@shape' is not the row shapes of 'maps' [1, 56]. Hint: 'maps' is [1, 56], where "
        "rows stored one after the other make one axis; write the file again"
    )


@pytest.mark.parametrize(
    ("shapes", "claimed"),
    [
        ([[-2, 2, 2], [2, 5, 2], [2, 1, 6]], "row 0 of 'maps' claims shape [-2, 2, 2]"),
        ([[2, 3, 4], [2**22] * 3, [0, 0, 0]], "row 1 of 'maps' claims shape [4194304, 4194304, 4194304]"),
    ],
)
def test_flat_row_shapes_that_are_negative_or_beyond_the_values_are_refused(tmp_path, shapes, claimed):
    """Sizes are whole numbers, so shapes whose product overflows 64 bits to a small number are refused too."""
    tensors = _ragged_rows().tensors()
    path = tmp_path / "bad.safetensors"
    write_safetensors({**tensors, "maps@shape": torch.tensor(shapes)}, {"format": "3"}, path)
    with FeatureFile(path) as features, pytest.raises(FeatureFileError) as caught:
        features.row_shape("maps", 0)
    assert str(caught.value) == (
        f"'{path}' is damaged: {claimed}, and 'maps' holds 56 values. Hint: it was not written whole by a "
        "safetensors writer; write it again"
    )


def test_flat_ragged_rows_read_by_negative_index_and_empty_rows_read_back(tmp_path):
    rows = RowBuffer(3)
    boxes = [torch.zeros(0, 4), torch.arange(8.0).reshape(2, 4), torch.zeros(0, 4)]  # images without detections
    rows.add({"boxes": boxes}, slice(None), ["a.jpg", "b.jpg", "c.jpg"])
    path = tmp_path / "boxes.safetensors"
    write_safetensors(rows.tensors(), {"format": "3"}, path)
    with FeatureFile(path) as features:
        assert [features.row_shape("boxes", i) for i in range(3)] == [[0, 4], [2, 4], [0, 4]]
        assert features.read("boxes", -2).tolist() == features.read("boxes", 1).tolist() == boxes[1].tolist()
        assert features.read("boxes", -1).shape == (0, 4) and features.read("boxes").shape == (3, 2, 4)


def test_tensors_are_laid_out_widest_first_so_each_starts_aligned(tmp_path):
    import struct

    path = tmp_path / "aligned.safetensors"
    write_safetensors({"a": torch.ones(3, dtype=torch.uint8), "b": torch.ones(2, dtype=torch.float64)}, {}, path)
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    assert (header["b"]["data_offsets"], header["a"]["data_offsets"]) == ([0, 16], [16, 19])
    with pytest.raises(CaptureError, match="'c' holds complex64 values, which hookcli does not store"):
        write_safetensors({"c": torch.zeros(2, dtype=torch.complex64)}, {}, tmp_path / "c.safetensors")
