"""Extraction from each family's models, checked against hooks written by hand on the same models and inputs."""

import json

import av
import numpy as np
import pytest
import torch
import torchvision.models
from PIL import Image
from safetensors import safe_open
from torchvision.transforms import functional as F

import hookcli
from hookcli.cli import main
from hookcli.errors import VideoError
from hookcli.inputs.transforms import to_transform
from hookcli.models.loading import load_model
from hookcli.run.request import request
from hookcli.storage.shards import open_features


def _noise(path, size, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _video(path, frames: np.ndarray):
    """A lossless MP4 of ``frames`` ([T, H, W, 3] uint8), decoded back exactly."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264rgb", rate=8, options={"qp": "0"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "rgb24"
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def _frames(count, size=(40, 32), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size[1], size[0], 3), dtype=np.uint8)


def _by_hand(module, path, call):
    """What ``module``'s layer at ``path`` returns during ``call()``, caught by a hook written here."""
    caught = []
    handle = dict(module.named_modules())[path].register_forward_hook(lambda m, i, o: caught.append(o.detach().clone()))
    try:
        with torch.no_grad():
            call()
    finally:
        handle.remove()
    return caught


def test_segmentation_rows_of_their_own_sizes_equal_hooks_by_hand(tmp_path):
    images = [
        _noise(tmp_path / "wide.png", (60, 40), 0),
        _noise(tmp_path / "tall.png", (40, 56), 1),
        _noise(tmp_path / "wide2.png", (60, 40), 2),
    ]
    features = hookcli.extract(  # on the CPU, as the hooks by hand below
        "lraspp_mobilenet_v3_large", ["backbone.4", "classifier"], images, weights="none", resize=32, device="cpu"
    )
    assert features.metadata["family"] == "segmentation" and features.metadata["format"] == "2"
    assert features.ragged("classifier") and features.shape("classifier") == [3, 21, 6, 6]
    assert [features.row_shape("classifier", i) for i in range(3)] == [[21, 4, 6], [21, 6, 4], [21, 4, 6]]
    loaded = load_model("lraspp_mobilenet_v3_large", "none")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    for index, path in enumerate(images):
        tensor = F.normalize(
            F.convert_image_dtype(F.pil_to_tensor(F.resize(Image.open(path), [32])), torch.float), mean, std
        )[None]
        for key in ("backbone.4", "classifier"):
            (expected,) = _by_hand(loaded.module, key, lambda: loaded.module(tensor))
            torch.testing.assert_close(torch.from_numpy(features.read(key, index)), expected[0], rtol=1e-5, atol=1e-5)


def test_a_shard_folder_of_ragged_rows_is_stored_without_padding_in_format_3(tmp_path):
    images = [_noise(tmp_path / "wide.png", (60, 40), 0), _noise(tmp_path / "tall.png", (40, 56), 1)]
    index = hookcli.extract(
        "lraspp_mobilenet_v3_large",
        "classifier",
        images,
        weights="none",
        resize=32,
        output=str(tmp_path / "feats") + "/",
        shard_size=1,
    )
    in_memory = hookcli.extract("lraspp_mobilenet_v3_large", "classifier", images, weights="none", resize=32)
    header = json.loads(index.read_text().splitlines()[0])
    assert header["metadata"]["format"] == "3"
    with open_features(tmp_path / "feats") as features:
        assert features.metadata["format"] == "3" and features.shape("classifier") == [2, 21, 6, 6]
        assert [features.row_shape("classifier", i) for i in range(2)] == [[21, 4, 6], [21, 6, 4]]
        for row in range(2):
            np.testing.assert_array_equal(features.read("classifier", row), in_memory.read("classifier", row))
        np.testing.assert_array_equal(features["classifier"], in_memory.read("classifier"))  # padded when whole
    for number, shard in enumerate(sorted((tmp_path / "feats").glob("features-*.safetensors"))):
        with safe_open(str(shard), "np") as stored:
            assert stored.metadata()["format"] == "3"
            assert stored.get_tensor("classifier").shape == (21 * 4 * 6,)  # the row's values, no padding
            assert stored.get_tensor("classifier@shape").tolist() == [[[21, 4, 6], [21, 6, 4]][number]]


def test_detection_rows_are_each_images_part_of_the_padded_batch(tmp_path, runner):
    images = [_noise(tmp_path / "a.png", (64, 48), 0), _noise(tmp_path / "b.png", (40, 72), 1)]
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            "-w",
            "none",
            "-l",
            "backbone.body.3",
            "--device",
            "cpu",  # as the hooks by hand below
            *map(str, images),
            "-o",
            str(tmp_path / "d.safetensors"),
        ],
    )
    assert result.exit_code == 0, result.output
    loaded = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none")
    tensors = [F.convert_image_dtype(F.pil_to_tensor(Image.open(p)), torch.float) for p in images]
    (batch,) = _by_hand(loaded.module, "backbone.body.3", lambda: loaded.module(tensors))
    image_list = loaded.module.transform(tensors)[0]
    padded = image_list.tensors.shape[-2:]
    assert padded == (576, 448)
    with open_features(tmp_path / "d.safetensors") as features:
        assert features.metadata["format"] == "3" and features.metadata["family"] == "detection"
        for index, (height, width) in enumerate(image_list.image_sizes):
            rows = -(-batch.shape[-2] * height // padded[0])
            columns = -(-batch.shape[-1] * width // padded[1])
            expected = batch[index, :, :rows, :columns]
            assert features.row_shape("backbone.body.3", index) == list(expected.shape)
            torch.testing.assert_close(
                torch.from_numpy(features.read("backbone.body.3", index)), expected, rtol=1e-5, atol=1e-5
            )
    assert image_list.image_sizes == [(320, 426), (576, 320)]
    result = runner.invoke(main, ["info", str(tmp_path / "d.safetensors"), "--no-stats"])
    assert "backbone.body.3  F32    [2,24,≤144,≤107]" in result.stdout


def test_final_detections_are_stored_as_rows_of_their_own_lengths(tmp_path):
    images = [_noise(tmp_path / "a.png", (64, 48), 0), _noise(tmp_path / "b.png", (40, 72), 1)]
    loaded = load_model("maskrcnn_resnet50_fpn", "none")
    loaded.module.roi_heads.score_thresh = 0.0  # random weights score low: keep everything they find
    loaded.module.roi_heads.detections_per_img = 5
    loaded.module.transform.min_size, loaded.module.transform.max_size = (64,), 96
    features = hookcli.extract(loaded, "backbone.body.layer1", images, detections=True, device="cpu")  # as below
    expected = loaded.module([F.convert_image_dtype(F.pil_to_tensor(Image.open(p)), torch.float) for p in images])
    assert [k for k in features.keys() if k.startswith("detections")] == [
        "detections#boxes",
        "detections#labels",
        "detections#masks",
        "detections#scores",
    ]
    for index, found in enumerate(expected):
        assert features.row_shape("detections#boxes", index) == [len(found["boxes"]), 4]
        assert features.row("detections#labels", index).tolist() == found["labels"].tolist()
        torch.testing.assert_close(features.row("detections#boxes", index), found["boxes"].detach())
        torch.testing.assert_close(features.row("detections#masks", index), found["masks"].detach())
    assert features["detections#labels"].dtype == torch.int64
    assert sum(len(found["boxes"]) for found in expected) > 0


def test_video_clips_equal_hooks_by_hand_and_say_their_frames(tmp_path):
    frames = _frames(10)
    video = _video(tmp_path / "walk.mp4", frames)
    features = hookcli.extract(
        "r3d_18",
        "layer2",
        video,
        weights="none",
        clip_length=4,
        frame_stride=2,
        clips_per_video=2,
        resize=24,
        crop=24,
        output=tmp_path / "v.safetensors",
        device="cpu",  # as the hooks by hand below
    )
    loaded = load_model("r3d_18", "none")
    preset = torchvision.models.video.R3D_18_Weights.DEFAULT.transforms()
    preset.resize_size, preset.crop_size = [24], [24, 24]
    with open_features(features) as stored:
        assert json.loads(stored.metadata["frames"]) == [[0, 2, 4, 6], [3, 5, 7, 9]]
        assert json.loads(stored.metadata["inputs"]) == [str(video)] * 2
        assert (stored.metadata["clip_length"], stored.metadata["frame_stride"]) == ("4", "2")
        for row, chosen in enumerate(([0, 2, 4, 6], [3, 5, 7, 9])):
            clip = preset(torch.from_numpy(frames[chosen]).permute(0, 3, 1, 2))[None]
            (expected,) = _by_hand(loaded.module, "layer2", lambda: loaded.module(clip))
            assert stored.shape("layer2") == [2, 128, 2, 6, 6]
            torch.testing.assert_close(torch.from_numpy(stored.read("layer2", row)), expected[0], rtol=1e-5, atol=1e-5)


def test_a_folder_of_frames_is_a_video_and_a_shard_folder_keeps_the_frames(tmp_path, runner):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, pixels in enumerate(_frames(5)):
        Image.fromarray(pixels).save(folder / f"f{i}.png")
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "r3d_18",
            "-w",
            "none",
            "-l",
            "layer1",
            "--clip-length",
            "2",
            "--clips-per-video",
            "0",
            "--resize",
            "16",
            "--crop",
            "16",
            str(folder),
            "-o",
            str(tmp_path / "out") + "/",
            "--shard-size",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    with open_features(tmp_path / "out") as features:
        assert json.loads(features.metadata["frames"]) == [[0, 1], [2, 3]]
        assert features.metadata["format"] == "1"
        assert features.shape("layer1") == [2, 64, 2, 8, 8]


def test_optical_flow_pairs_equal_hooks_by_hand(tmp_path):
    frames = _frames(3, size=(128, 128))
    video = _video(tmp_path / "pan.mp4", frames)
    features = hookcli.extract("raft_small", "update_block.flow_head", video, weights="none", device="cpu")
    assert json.loads(features.metadata["frames"]) == [[0, 1], [1, 2]]
    assert features.metadata["family"] == "optical_flow"
    loaded = load_model("raft_small", "none")
    preset = torchvision.models.optical_flow.Raft_Small_Weights.DEFAULT.transforms()
    for row, (first, second) in enumerate([(0, 1), (1, 2)]):
        pair = preset(
            torch.from_numpy(frames[[first]]).permute(0, 3, 1, 2),
            torch.from_numpy(frames[[second]]).permute(0, 3, 1, 2),
        )
        caught = _by_hand(loaded.module, "update_block.flow_head", lambda: loaded.module(*pair))
        assert len(caught) == 12 == len([k for k in features.keys() if k.startswith("update_block.flow_head:")])
        for call in (0, 11):
            torch.testing.assert_close(
                torch.from_numpy(features.read(f"update_block.flow_head:{call}", row)),
                caught[call][0],
                rtol=1e-4,
                atol=1e-5,
            )


def test_optical_flow_from_two_image_lists_pairs_them_in_order(tmp_path, runner):
    firsts, seconds = tmp_path / "before", tmp_path / "after"
    firsts.mkdir(), seconds.mkdir()
    for i in range(2):
        _noise(firsts / f"{i}.png", (128, 128), i)
        _noise(seconds / f"{i}.png", (128, 128), 10 + i)
    features = hookcli.extract(
        "raft_small", "update_block.flow_head", firsts, weights="none", pair_with=[seconds], device="cpu"
    )
    assert json.loads(features.metadata["inputs"]) == [str(firsts / "0.png"), str(firsts / "1.png")]
    assert json.loads(features.metadata["second_inputs"]) == [str(seconds / "0.png"), str(seconds / "1.png")]
    assert len(features.metadata["second_inputs_sha256"]) == 64
    loaded = load_model("raft_small", "none")
    preset = torchvision.models.optical_flow.Raft_Small_Weights.DEFAULT.transforms()
    pair = preset(*(F.pil_to_tensor(Image.open(folder / "1.png"))[None] for folder in (firsts, seconds)))
    caught = _by_hand(loaded.module, "update_block.flow_head", lambda: loaded.module(*pair))
    torch.testing.assert_close(
        torch.from_numpy(features.read("update_block.flow_head:11", 1)), caught[11][0], rtol=1e-4, atol=1e-5
    )
    _noise(seconds / "2.png", (128, 128), 3)
    result = runner.invoke(
        main,
        ["extract", "-m", "raft_small", "-w", "none", "-l", "update_block", str(firsts), "--pair-with", str(seconds)],
    )
    assert (result.exit_code, result.output) == (
        2,
        "Error: the two image lists differ in length: 2 first images and "
        "3 given with --pair-with. Hint: give one second image for each "
        "input image, in order\n",
    )
    _noise(seconds / "2.png", (64, 128), 3)
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "raft_small",
            "-w",
            "none",
            "-l",
            "update_block",
            str(firsts / "0.png"),
            "--pair-with",
            str(seconds / "2.png"),
        ],
    )
    assert result.exit_code == 1 and result.output.startswith(
        f"Error: the images of the pair '{firsts / '0.png'}' and '{seconds / '2.png'}' differ in size (128x128 and "
        "64x128). Hint: a pair of frames must be of one size"
    )


@pytest.mark.parametrize(
    "size, refusal",
    [
        (
            (96, 96),
            "96x96 as the model would see them, and optical-flow models take sides of 128 pixels or more. Hint: "
            "give a larger",
        ),
        (
            (132, 128),
            "132x128 as the model would see them, and optical-flow models take sides divisible by 8. Hint: give --crop",
        ),
    ],
)
def test_flow_frames_raft_cannot_take_are_refused_with_a_hint(tmp_path, runner, size, refusal):
    video = _video(tmp_path / "frames.mp4", _frames(4, size=size))
    result = runner.invoke(main, ["extract", "-m", "raft_small", "-w", "none", "-l", "update_block", str(video)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: the frames of '{video}' are {refusal}")
    assert result.output.endswith("; or add --on-error skip to leave out the videos that fail so\n")
    skipped = runner.invoke(
        main, ["extract", "-m", "raft_small", "-w", "none", "-l", "update_block", "--on-error", "skip", str(video)]
    )
    said = [line for line in skipped.stderr.splitlines() if line.startswith("Skipped:")]
    assert len(said) == 1 and said[0].startswith(f"Skipped: the frames of '{video}' are {refusal}")  # 3 pairs: once


def test_quantized_captures_are_the_real_values_and_run_on_the_cpu(tmp_path, runner, no_model):
    image = _noise(tmp_path / "a.png", (40, 40), 0)
    for options, message in [
        (
            ["--device", "cuda"],
            "Error: quantized models run on the CPU only, not on 'cuda'. Hint: use --device cpu "
            "(or auto), or the model without the quantized_ prefix",
        ),
        (
            ["--precision", "bf16"],
            "Error: quantized models compute in int8 and take --precision fp32 only, not "
            "bf16. Hint: see 'hookcli extract --help'",
        ),
    ]:
        result = runner.invoke(
            main, ["extract", "-m", "quantized_resnet18", "-w", "none", "-l", "layer3", str(image), *options]
        )
        assert (result.exit_code, result.output.strip()) == (2, message)


def test_a_quantized_models_request_runs_on_the_cpu_as_made(tmp_path):
    image = _noise(tmp_path / "a.png", (40, 40), 0)
    asked = request("extract", "quantized_resnet18", "layer3", image, weights="none")
    assert (asked.opts.device, asked.settings.device) == ("cpu", "cpu")


def test_quantized_model_extraction_equals_hooks_by_hand(tmp_path):
    image = _noise(tmp_path / "a.png", (40, 40), 0)
    features = hookcli.extract("quantized_resnet18", ["layer3", "quant"], image, weights="none", resize=32, crop=32)
    loaded = load_model("quantized_resnet18", "none")
    tensor = to_transform(loaded.preprocess.replace(resize=32, crop=32))(Image.open(image).convert("RGB"))[None]
    for key in ("layer3", "quant"):
        (expected,) = _by_hand(loaded.module, key, lambda: loaded.module(tensor))
        assert expected.is_quantized
        assert torch.equal(features[key], expected.dequantize())
    assert features.metadata["device"] == "cpu" and features.metadata["fused"] == "0"


@pytest.mark.parametrize(
    "options, message",
    [
        (["--clip-length", "8"], "Error: --clip-length applies to video models, and this one is classification"),
        (
            ["--frame-stride", "2"],
            "Error: --frame-stride applies to video and optical-flow models, and this one is classification",
        ),
        (
            ["-m", "r3d_18", "--memory-format", "channels_last"],
            "Error: video models take 5-D clips, which have no channels-last layout",
        ),
        (["--detections"], "Error: --detections applies to detection models, and this one is classification"),
        (["--pair-with", "b.png"], "Error: --pair-with applies to optical-flow models, and this one is classification"),
    ],
)
def test_family_options_are_refused_for_other_families(resnet18_args, tmp_path, runner, no_model, options, message):
    image = _noise(tmp_path / "a.png", (40, 40), 0)
    result = runner.invoke(main, resnet18_args("extract", "-l", "layer1", str(image), *options))
    assert result.exit_code == 2 and result.output.startswith(message)


def test_layers_refuses_frames_for_other_families(runner, no_model):
    result = runner.invoke(main, ["layers", "-m", "resnet18", "--frames", "4"])
    assert (result.exit_code, result.output) == (
        2,
        "Error: --frames applies to video models, and resnet18 is classification. Hint: leave it out\n",
    )


def test_a_detection_backbone_fuses_and_gives_what_the_model_as_written_does(tmp_path):
    images = [_noise(tmp_path / "a.png", (64, 48), 0), _noise(tmp_path / "b.png", (40, 72), 1)]
    layers = ["backbone.body.3", "backbone.fpn"]
    fused = hookcli.extract(
        "fasterrcnn_mobilenet_v3_large_320_fpn",
        layers,
        images,
        weights="none",
        fuse=True,
        detections=True,
        device="cpu",
    )
    plain = hookcli.extract(
        "fasterrcnn_mobilenet_v3_large_320_fpn",
        layers,
        images,
        weights="none",
        fuse=False,
        detections=True,
        device="cpu",
    )
    assert (fused.metadata["fused"], plain.metadata["fused"]) == ("59", "0")  # the whole stack: the forward goes on
    for key in plain.keys():
        for row in range(2):
            torch.testing.assert_close(fused.row(key, row), plain.row(key, row), rtol=1e-4, atol=1e-5)
    early = hookcli.extract(
        "fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.3", images, weights="none", fuse=True, device="cpu"
    )
    assert early.metadata["fused"] == "6"  # up to the last hooked layer, where the forward stops


def test_the_final_flow_field_is_stored_when_asked(tmp_path, runner):
    frames = _frames(2, size=(128, 128))
    video = _video(tmp_path / "pan.mp4", frames)
    features = hookcli.extract("raft_small", "context_encoder", video, weights="none", flow=True)
    loaded = load_model("raft_small", "none")
    preset = torchvision.models.optical_flow.Raft_Small_Weights.DEFAULT.transforms()
    pair = preset(*(torch.from_numpy(frames[[i]]).permute(0, 3, 1, 2) for i in (0, 1)))
    with torch.no_grad():
        expected = loaded.module(*pair)[-1]
    assert features.shape("flow") == [1, 2, 128, 128]
    torch.testing.assert_close(features["flow"], expected, rtol=1e-4, atol=1e-4)
    result = runner.invoke(main, ["extract", "-m", "r3d_18", "-w", "none", "-l", "layer1", str(video), "--flow"])
    assert result.exit_code == 2 and result.output.startswith(
        "Error: --flow applies to optical-flow models, and this one is video"
    )


def test_compile_is_for_classification_and_other_families_say_they_run_eagerly(tmp_path):
    images = [_noise(tmp_path / "wide.png", (60, 40), 0), _noise(tmp_path / "tall.png", (40, 56), 1)]
    features = hookcli.extract(
        "lraspp_mobilenet_v3_large", "classifier", images, weights="none", resize=32, compile=True, batch_size=1
    )
    assert "--compile applies to classification models; this segmentation model runs eagerly" in features.notes
    assert [features.row_shape("classifier", i) for i in range(2)] == [[21, 4, 6], [21, 6, 4]]


def test_unreadable_and_short_videos_are_said(tmp_path, runner):
    short = _video(tmp_path / "short.mp4", _frames(3))
    text = tmp_path / "notes.mp4"
    text.write_text("not a video\n")
    base = [
        "extract",
        "-m",
        "r3d_18",
        "-w",
        "none",
        "-l",
        "layer1",
        "--clip-length",
        "4",
        "--resize",
        "16",
        "--crop",
        "16",
        "-o",
        str(tmp_path / "out.safetensors"),
    ]
    result = runner.invoke(main, [*base, str(text), str(short)])
    assert result.exit_code == 1 and result.output.startswith(f"Error: cannot read video '{text}'")
    result = runner.invoke(main, [*base, str(text), str(short), "--on-error", "skip"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("Note:")]
    assert notes[0].startswith(f"Note: skipped: cannot read video '{text}': ")
    assert notes[1] == f"Note: '{short}' is shorter than a clip: its last frame is repeated to fill one"
    with open_features(tmp_path / "out.safetensors") as features:
        assert json.loads(features.metadata["frames"]) == [[0, 1, 2, 2]]
    result = runner.invoke(main, [*base, str(text), "--on-error", "skip", "--force"])
    assert result.exit_code == 1 and "Error: none of the input videos could be read" in result.output


def test_a_video_whose_frames_cannot_be_decoded_is_said_to_be_a_video(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.png").write_text("not a picture\n")  # counted as frames, failing only when decoded
    with pytest.raises(VideoError, match=r"^none of the input videos could be read\. Hint: every input was skipped"):
        hookcli.extract("r3d_18", "layer1", [folder], weights="none", clip_length=2, resize=16, on_error="skip")


def test_pair_with_takes_one_folder_as_inputs_do(tmp_path):
    firsts, seconds = tmp_path / "before", tmp_path / "after"
    firsts.mkdir(), seconds.mkdir()
    _noise(firsts / "0.png", (128, 128), 0)
    _noise(seconds / "0.png", (128, 128), 1)
    features = hookcli.extract(
        "raft_small", "update_block.flow_head", str(firsts), weights="none", pair_with=str(seconds)
    )
    assert json.loads(features.metadata["second_inputs"]) == [str(seconds / "0.png")]


def test_a_segmentation_run_over_extreme_aspect_ratios_stores_no_padding(tmp_path):
    images = [_noise(tmp_path / "wide.png", (256, 32), 0), _noise(tmp_path / "tall.png", (32, 256), 1)]
    path = hookcli.extract(
        "lraspp_mobilenet_v3_large", "classifier", images, weights="none", resize=32, output=tmp_path / "s.safetensors"
    )
    with safe_open(str(path), "np") as stored:
        assert stored.get_tensor("classifier@shape").tolist() == [[21, 4, 32], [21, 32, 4]]
        assert stored.get_tensor("classifier").shape == (2 * 21 * 4 * 32,)  # padded, it would be 2 x 21 x 32 x 32
    assert path.stat().st_size < 2 * 21 * 4 * 32 * 4 + 8192  # the values, the companion and the header
    with open_features(path) as features:
        assert features.shape("classifier") == [2, 21, 32, 32] and features.nbytes("classifier") == 2 * 21 * 4 * 32 * 4
