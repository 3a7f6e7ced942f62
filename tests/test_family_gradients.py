"""Gradients and class-activation maps of segmentation and detection models, checked against autograd by hand."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import functional as F

import hookcli
from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.models.loading import load_model


def _noise(path, size, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _gradient_by_hand(module, path, forward, score):
    """The layer at ``path``'s output and d score / d output, kept by a hook written here."""
    kept = []

    def keep(m, inputs, output):
        output.retain_grad()
        kept.append(output)

    handle = dict(module.named_modules())[path].register_forward_hook(keep)
    try:
        with torch.enable_grad():
            score(forward()).backward()
    finally:
        handle.remove()
    return kept[0].detach(), kept[0].grad


def _segmentation_input(path, size):
    image = F.resize(Image.open(path), [size])
    return F.normalize(
        F.convert_image_dtype(F.pil_to_tensor(image), torch.float), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    )[None]


def test_segmentation_gradients_are_of_the_class_mask(tmp_path):
    images = [_noise(tmp_path / "a.png", (48, 40), 0), _noise(tmp_path / "b.png", (40, 56), 1)]
    features = hookcli.grad(  # on the CPU, as the gradients by hand below (a near tie picks the class)
        "lraspp_mobilenet_v3_large", "backbone.12", images, weights="none", resize=32, target="top1", device="cpu"
    )
    targets = json.loads(features.metadata["targets"])
    loaded = load_model("lraspp_mobilenet_v3_large", "none")
    for index, path in enumerate(images):
        tensor = _segmentation_input(path, 32)

        def score(output, index=index):
            logits = output["out"]
            chosen = targets[index][0]["class"]
            mask = logits.detach().argmax(1) == chosen
            assert int(mask.sum()) == targets[index][0]["pixels"] > 0
            assert targets[index][0]["share"] == int(mask.sum()) / mask.numel()
            return (logits[:, chosen] * mask).sum()

        activation, gradient = _gradient_by_hand(loaded.module, "backbone.12", lambda: loaded.module(tensor), score)
        assert features.row_shape("backbone.12", index) == list(activation.shape[1:])
        torch.testing.assert_close(features.row("backbone.12", index), activation[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(features.row("backbone.12@grad", index), gradient[0], rtol=1e-4, atol=1e-7)


def test_segmentation_gradients_of_batches_of_one_shape_then_another_keep_each_rows_shape(tmp_path):
    images = [_noise(tmp_path / "a.png", (48, 40), 0), _noise(tmp_path / "b.png", (40, 56), 1)]
    common = {"weights": "none", "resize": 32, "device": "cpu"}  # batches of two sizes agree to rounding there
    features = hookcli.grad("lraspp_mobilenet_v3_large", "backbone.12", images, batch_size=1, **common)
    whole = hookcli.grad("lraspp_mobilenet_v3_large", "backbone.12", images, **common)
    assert [features.row_shape("backbone.12@grad", i) for i in range(2)] == [[112, 2, 3], [112, 3, 2]]
    for key in ("backbone.12", "backbone.12@grad"):
        for row in range(2):
            torch.testing.assert_close(features.row(key, row), whole.row(key, row), rtol=1e-5, atol=1e-7)


def test_a_region_scores_the_class_over_the_box(tmp_path):
    image = _noise(tmp_path / "a.png", (48, 48), 0)
    features = hookcli.grad(
        "lraspp_mobilenet_v3_large", "backbone.12", image, weights="none", resize=32, target="5",
        region="0,0,0.5,0.25", device="cpu",
    )  # fmt: skip
    (row,) = json.loads(features.metadata["targets"])
    assert row[0]["pixels"] == 16 * 8 and row[0]["class"] == 5 and features.metadata["target"] == "5 in 0,0,0.5,0.25"
    assert row[0]["region"] == [0.0, 0.0, 0.5, 0.25] and row[0]["share"] == 16 * 8 / (32 * 32)
    loaded = load_model("lraspp_mobilenet_v3_large", "none")
    _, gradient = _gradient_by_hand(
        loaded.module,
        "backbone.12",
        lambda: loaded.module(_segmentation_input(image, 32)),
        lambda output: output["out"][0, 5, :8, :16].sum(),
    )
    torch.testing.assert_close(features.row("backbone.12@grad", 0), gradient[0], rtol=1e-4, atol=1e-7)


def _detector():
    loaded = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none")
    loaded.module.roi_heads.score_thresh = 0.0  # random weights score low: keep what they find
    loaded.module.roi_heads.detections_per_img = 5
    return loaded


def test_detection_gradients_are_of_the_best_detections_score(tmp_path):
    images = [_noise(tmp_path / "a.png", (64, 48), 0), _noise(tmp_path / "b.png", (40, 72), 1)]
    loaded = _detector()
    features = hookcli.grad(loaded, "backbone.body.12", images, target="top1", device="cpu")  # as the reference
    targets = json.loads(features.metadata["targets"])
    tensors = [F.convert_image_dtype(F.pil_to_tensor(Image.open(p)), torch.float) for p in images]
    activation, gradient = _gradient_by_hand(
        loaded.module,
        "backbone.body.12",
        lambda: loaded.module(tensors),
        lambda output: sum(found["scores"][found["scores"].detach().argmax()] for found in output),
    )
    with torch.no_grad():
        found = loaded.module(tensors)
        resized = loaded.module.transform(tensors)[0]
    padded = resized.tensors.shape[-2:]
    for index, (height, width) in enumerate(resized.image_sizes):
        best = int(found[index]["scores"].argmax())
        assert targets[index][0]["detection"] == best
        assert targets[index][0]["box"] == [round(float(v), 2) for v in found[index]["boxes"][best]]
        rows = -(-activation.shape[2] * height // padded[0])
        columns = -(-activation.shape[3] * width // padded[1])
        torch.testing.assert_close(
            features.row("backbone.body.12@grad", index), gradient[index, :, :rows, :columns], rtol=1e-4, atol=1e-9
        )


def test_a_detection_is_named_by_its_place_in_the_output(tmp_path):
    image = _noise(tmp_path / "a.png", (48, 48), 0)
    features = hookcli.grad(_detector(), "backbone.body.12", [image, image], target="#3")
    rows = json.loads(features.metadata["targets"])
    assert [row[0]["detection"] for row in rows] == [3, 3] and features.metadata["target"] == "#3"
    assert rows[0][0]["box"] == rows[1][0]["box"] and rows[0][0]["score"] > 0
    missing = hookcli.grad(_detector(), "backbone.body.12", image, target="#99")
    assert json.loads(missing.metadata["targets"])[0][0]["detection"] is None
    with pytest.raises(UsageProblem, match="target '#3' names a detection, and only detection models give detections"):
        hookcli.grad("resnet18", "layer4", image, weights="none", target="#3")


def test_an_image_without_the_asked_detection_says_so_and_has_no_gradient(tmp_path):
    image = _noise(tmp_path / "a.png", (48, 48), 0)
    features = hookcli.grad(
        "fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.12", image, weights="none", target="top2"
    )  # random weights find nothing above the model's threshold
    (row,) = json.loads(features.metadata["targets"])
    assert row == [{"detection": None, "class": None, "name": None, "score": None, "box": None}] * 2
    assert float(features.row("backbone.body.12@grad#1", 0).abs().sum()) == 0


def test_detection_cam_rows_are_each_images_own_map(tmp_path):
    images = [_noise(tmp_path / "a.png", (64, 48), 0), _noise(tmp_path / "b.png", (40, 72), 1)]
    maps = hookcli.cam(_detector(), images, target="top1")
    assert maps.ragged("cam")
    assert [maps.row_shape("cam", i) for i in range(2)] == [[10, 14], [18, 10]]
    assert maps.metadata["cam_layer"] == "backbone.body.16"
    written = hookcli.cam(_detector(), images[:1], target="top1", output=tmp_path / "cams")
    with hookcli.open_features(written) as stored:
        (target,) = json.loads(stored.metadata["targets"])[0]
    picture = np.asarray(Image.open(written.parent / "00000_a.png").convert("RGB"))
    cyan = np.argwhere((picture == (0, 255, 255)).all(axis=2))
    scale = picture.shape[1] / 64  # the picture is the photo enlarged, under a caption band
    x0, _, x1, _ = target["box"]
    assert abs(cyan[:, 1].min() - x0 * scale) <= 2 and abs(cyan[:, 1].max() - x1 * scale) <= 2
    # With --resize the model is given the photo resized (shorter side 32: 42x32), and boxes are in its pixels.
    written = hookcli.cam(_detector(), images[:1], target="top1", output=tmp_path / "resized", resize=32)
    with hookcli.open_features(written) as stored:
        (target,) = json.loads(stored.metadata["targets"])[0]
    picture = np.asarray(Image.open(written.parent / "00000_a.png").convert("RGB"))
    cyan = np.argwhere((picture == (0, 255, 255)).all(axis=2))
    scale = picture.shape[1] / 42
    x0, _, x1, _ = target["box"]
    assert abs(cyan[:, 1].min() - x0 * scale) <= 3 and abs(cyan[:, 1].max() - x1 * scale) <= 3


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            ["cam", "-m", "raft_small"],
            "Error: cam does not apply to optical flow models. Hint: a flow field is not a "
            "class score; extract the layers instead",
        ),
        (
            ["grad", "-m", "quantized_resnet18", "-l", "layer1"],
            "Error: grad does not apply to quantized models. Hint: quantized kernels have no backward; use the float "
            "model "
            "(the name without quantized_)",
        ),
        (
            ["cam", "-m", "r3d_18"],
            "Error: cam does not apply to video models. Hint: a clip has no one photo to draw a "
            "map over; 'hookcli grad' gives the gradients of a video model",
        ),
        (
            ["grad", "-m", "resnet18", "-l", "layer1", "--region", "0,0,1,1"],
            "Error: --region applies to segmentation models. Hint: see 'hookcli grad --help'",
        ),
        (
            ["grad", "-m", "lraspp_mobilenet_v3_large", "-l", "backbone.1", "--region", "0,0,1"],
            "Error: region '0,0,1' is not x0,y0,x1,y1 with fractions of the image from 0 to 1, x0 < x1 and y0 < y1. "
            "Hint: for example --region 0.25,0.25,0.75,0.75 (the middle)",
        ),
    ],
)
def test_families_without_gradients_are_refused_with_why(tmp_path, runner, arguments, message):
    image = _noise(tmp_path / "a.png", (32, 32), 0)
    result = runner.invoke(main, [*arguments, "-w", "none", str(image), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output.strip() == message


def test_targets_of_no_pixel_are_said_once(tmp_path):
    from hookcli.events import Note

    images = [_noise(tmp_path / "a.png", (48, 40), 0), _noise(tmp_path / "b.png", (40, 56), 1)]
    events = []
    features = hookcli.grad("lraspp_mobilenet_v3_large", "backbone.12", images, weights="none", resize=32, crop=32,
                            target="top21", device="cpu", progress=events.append)  # fmt: skip
    bare = sum(1 for row in json.loads(features.metadata["targets"]) for target in row if target["pixels"] == 0)
    assert bare > 0  # 21 classes: no 32x32 prediction holds all of them
    assert [event.text for event in events if isinstance(event, Note)] == [
        f"--target top21: an image predicted to hold fewer than 21 classes still takes 21 targets, and those of no "
        f"pixel ({bare:,} in the first batch that had any) have a score and gradients of 0"
    ]
