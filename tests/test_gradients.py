"""hookcli grad and cam: gradients equal autograd's on hook-free references, CAM values, targets, errors."""

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torchvision
from PIL import Image
from safetensors import safe_open

from hookcli.cli import main
from hookcli.errors import CaptureError, UsageProblem
from hookcli.run.capture import GradientCapture
from hookcli.run.gradients import class_activation_maps, frozen_parameters, picked_classes
from hookcli.run.targets import Target, parse_target

SMALL = ["--resize", "64", "--crop", "64"]


def _seeded(name):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    if name.startswith("vit"):
        nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts ViT heads at zero: no gradient at all
    return model


def _ours(model, layers, x, target=None):
    target = target or Target(top=1)
    with frozen_parameters(model), GradientCapture(model, layers) as capture:
        return capture.run_gradients(x, functools.partial(picked_classes, target))


def _reference(head, tail, x, classes):
    """d logit / d (head's output), where logits = tail(head(x)): no hooks, the network split by hand."""
    with torch.no_grad():
        activation = head(x)
    leaf = activation.clone().requires_grad_()
    logits = tail(leaf.clone())  # the clone takes any in-place op at the start of the tail
    return activation, torch.autograd.grad(logits.gather(1, classes).sum(), leaf)[0]


def _resnet_tail(r, after):
    stages = [r.layer1, r.layer2, r.layer3, r.layer4]
    rest = stages[after:]

    def head(x):
        x = r.maxpool(r.relu(r.bn1(r.conv1(x))))
        for stage in stages[:after]:
            x = stage(x)
        return x

    def tail(x):
        for stage in rest:
            x = stage(x)
        return r.fc(torch.flatten(r.avgpool(x), 1))

    return head, tail


def _vit_split(v, block):
    def head(x):
        x = v._process_input(x)
        x = torch.cat([v.class_token.expand(len(x), -1, -1), x], dim=1)
        x = v.encoder.dropout(x + v.encoder.pos_embedding)
        return v.encoder.layers[: block + 1](x)

    def tail(x):
        x = v.encoder.ln(v.encoder.layers[block + 1 :](x))
        return v.heads(x[:, 0])

    return head, tail


@pytest.mark.parametrize(
    "name, layer, split",
    [
        ("resnet18", "layer3", lambda m: _resnet_tail(m, 3)),
        ("resnet18", "layer1", lambda m: _resnet_tail(m, 1)),
        (
            "vgg16_bn",
            "features.18",
            lambda m: (m.features[:19], lambda a: m.classifier(torch.flatten(m.avgpool(m.features[19:](a)), 1))),
        ),
        (
            "mobilenet_v3_small",
            "features.5",
            lambda m: (m.features[:6], lambda a: m.classifier(torch.flatten(m.avgpool(m.features[6:](a)), 1))),
        ),
        ("vit_b_16", "encoder.layers.encoder_layer_5", lambda m: _vit_split(m, 5)),
    ],
)
def test_gradient_equals_autograd_on_the_network_split_by_hand(name, layer, split):
    model = _seeded(name)
    size = 224 if name.startswith("vit") else 64
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    flat, classes, logits = _ours(model, [layer], x)
    assert torch.equal(classes, logits.argmax(dim=1, keepdim=True))
    head, tail = split(model)
    activation, expected = _reference(head, tail, x, classes)
    torch.testing.assert_close(flat[layer], activation, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(flat[f"{layer}@grad"], expected, rtol=1e-4, atol=1e-7)
    assert expected.abs().max() > 0
    assert all(p.requires_grad and p.grad is None for p in model.parameters())  # restored, nothing accumulated


def test_a_layer_followed_by_in_place_ops_inside_a_block():
    """bn2 in a BasicBlock is followed by `out += identity` and ReLU(inplace=True)."""
    model = _seeded("resnet18")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    flat, classes, _ = _ours(model, ["layer3.0.bn2", "layer2"], x)
    delta = torch.zeros_like(flat["layer3.0.bn2"], requires_grad=True)  # d logit / d output = d logit / d delta at 0
    handle = model.layer3[0].bn2.register_forward_hook(lambda module, inputs, output: output + delta)
    try:
        logits = model(x)
    finally:
        handle.remove()
    expected = torch.autograd.grad(logits.gather(1, classes).sum(), delta)[0]
    torch.testing.assert_close(flat["layer3.0.bn2@grad"], expected, rtol=1e-4, atol=1e-7)
    head, tail = _resnet_tail(model, 2)
    torch.testing.assert_close(flat["layer2@grad"], _reference(head, tail, x, classes)[1], rtol=1e-4, atol=1e-7)


def test_top_k_gives_one_gradient_per_target_and_repeated_modules_every_call():
    model = _seeded("resnet18")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    flat, classes, logits = _ours(model, ["layer1.0.relu"], x, Target(top=3))
    assert sorted(flat) == sorted(
        f"layer1.0.relu:{c}{s}" for c in (0, 1) for s in ("", "@grad#0", "@grad#1", "@grad#2")
    )
    assert torch.equal(classes, logits.topk(3, dim=1).indices)
    assert not torch.equal(flat["layer1.0.relu:1@grad#0"], flat["layer1.0.relu:1@grad#1"])


class _SideBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Linear(4, 3)
        self.side = nn.Linear(4, 2)

    def forward(self, x):
        self.side(x)  # runs, but the logits do not depend on it
        return self.main(x)


_NO_PATH_HINT = (
    "Hint: choose a layer the model's output depends on, not one its forward runs under torch.no_grad() or detaches"
)


def test_a_layer_without_a_gradient_path_is_an_error():
    with pytest.raises(CaptureError) as caught:
        _ours(_SideBranch(), ["side", "main"], torch.ones(2, 4))
    assert str(caught.value) == f"layer side has no gradient path to the target logit. {_NO_PATH_HINT}"


class _Probe(nn.Module):
    """A frozen feature layer under torch.no_grad(), or detached, and a linear probe on it."""

    def __init__(self, detach: bool):
        super().__init__()
        self.features, self.probe, self.detach = nn.Linear(4, 6), nn.Linear(6, 3), detach

    def forward(self, x):
        if self.detach:
            return self.probe(self.features(x).detach())
        with torch.no_grad():
            x = self.features(x)
        return self.probe(x)


@pytest.mark.parametrize("detach", [False, True])
def test_a_layer_the_forward_cuts_from_autograd_is_refused_not_given_zero_gradients(detach):
    with pytest.raises(CaptureError) as caught:
        _ours(_Probe(detach), ["features"], torch.ones(2, 4))
    assert str(caught.value) == f"layer features has no gradient path to the target logit. {_NO_PATH_HINT}"


def test_gradients_are_taken_inside_the_callers_inference_mode():
    model = _seeded("resnet18")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    expected = _ours(model, ["layer4"], x)[0]["layer4@grad"]
    with torch.inference_mode():
        found = _ours(model, ["layer4"], x)[0]["layer4@grad"]
    assert found.abs().max() > 0 and torch.equal(found, expected)


def test_target_parsing():
    names = ["tench", "goldfish", "great white shark"]
    assert parse_target("top5", names, 3 + 997) == Target(top=5)
    assert parse_target("2", None, 1000) == Target(class_index=2)
    assert parse_target("Goldfish", names, 1000) == Target(class_index=1)
    with pytest.raises(
        UsageProblem,
        match=r"^target class 1000 is out of range: the model has 1000 classes\. "
        r"Hint: use 0 to 999, a class name or top1$",
    ):
        parse_target("1000", names, 1000)
    with pytest.raises(UsageProblem, match=r"Hint: use 0 to 999 or top1$"):  # no names: random weights
        parse_target("1000", None, 1000)
    with pytest.raises(UsageProblem, match=r"^unknown class name 'goldfsh' \(closest: goldfish"):
        parse_target("goldfsh", names, 1000)
    with pytest.raises(UsageProblem, match="is a class name, but these weights have no class names"):
        parse_target("goldfish", None, 1000)


def test_cam_formulas_on_known_values():
    acts = torch.tensor([[[[1.0, 3.0], [0.0, 2.0]], [[2.0, 0.0], [1.0, 1.0]]]])  # [1, 2, 2, 2]
    grads = torch.tensor([[[[1.0, 1.0], [1.0, 1.0]], [[-2.0, 0.0], [2.0, 4.0]]]])
    # Grad-CAM: weights = mean gradient (1, 1); map = ReLU(A0 + A1)
    assert class_activation_maps(acts, grads, "gradcam")[0].tolist() == [[3.0, 3.0], [1.0, 3.0]]
    # LayerCAM: ReLU(Σ ReLU(g)·A) position by position
    assert class_activation_maps(acts, grads, "layercam")[0].tolist() == [[1.0, 3.0], [2.0, 6.0]]
    # XGrad-CAM: w_c = Σ A·g / Σ A → w0 = 6/6, w1 = (-4+2+4)/4
    expected = torch.relu(1.0 * acts[0, 0] + 0.5 * acts[0, 1])
    assert torch.equal(class_activation_maps(acts, grads, "xgradcam")[0], expected)
    # Grad-CAM++, from the paper's closed form with first-order terms
    g, a = grads[0], acts[0]
    alpha = g**2 / (2 * g**2 + a.sum(dim=(1, 2), keepdim=True) * g**3)
    alpha = torch.where(torch.isfinite(alpha), alpha, torch.zeros(()))
    weights = (alpha * torch.relu(g)).sum(dim=(1, 2))
    expected = torch.relu((weights[:, None, None] * a).sum(0))
    torch.testing.assert_close(class_activation_maps(acts, grads, "gradcam++")[0], expected)


def _read(path):
    with safe_open(str(path), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


def test_grad_command_writes_activations_gradients_and_targets(runner, resnet18_args, images, tmp_path):
    out = tmp_path / "g.safetensors"
    result = runner.invoke(
        main,
        resnet18_args("grad", "-l", "layer4", "--target", "top2", *SMALL, "-o", str(out), *map(str, images[:2])),
    )
    assert result.exit_code == 0, result.output
    tensors, metadata = _read(out)
    assert sorted(tensors) == ["layer4", "layer4@grad#0", "layer4@grad#1"]
    assert tensors["layer4@grad#0"].shape == (2, 512, 2, 2)
    targets = json.loads(metadata["targets"])
    assert len(targets) == 2 and [len(t) for t in targets] == [2, 2]
    assert targets[0][0]["logit"] >= targets[0][1]["logit"] and targets[0][0]["name"] is None
    assert 0 < targets[0][0]["probability"] < 1 and metadata["target"] == "top2"
    assert json.loads(metadata["layers"])["layer4"]["keys"] == ["layer4", "layer4@grad#0", "layer4@grad#1"]


def test_cam_values_equal_a_direct_computation_from_grad_output(runner, resnet18_args, images, tmp_path):
    paths = list(map(str, images))
    result = runner.invoke(
        main,
        resnet18_args("grad", "-l", "layer3", "-t", "7", *SMALL, "-o", str(tmp_path / "g.safetensors"), *paths),
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        main,
        resnet18_args("cam", "-l", "layer3", "-t", "7", *SMALL, "-o", str(tmp_path / "cams"), *paths),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(tmp_path / "cams" / "cams.safetensors")] + [
        str(tmp_path / "cams" / f"{i:05d}_{n}.png") for i, n in enumerate("abc")
    ]
    grads, _ = _read(tmp_path / "g.safetensors")
    cams, metadata = _read(tmp_path / "cams" / "cams.safetensors")
    weights = grads["layer3@grad"].mean(dim=(2, 3), keepdim=True)
    expected = torch.relu((weights * grads["layer3"]).sum(dim=1))
    assert cams["cam"].shape == (3, 4, 4)
    torch.testing.assert_close(cams["cam"], expected)
    assert (metadata["method"], metadata["cam_layer"], metadata["target"]) == ("gradcam", "layer3", "7")
    assert [t[0]["class"] for t in json.loads(metadata["targets"])] == [7, 7, 7]


def test_cam_overlay_is_brighter_where_the_map_is_high(runner, resnet18_args, photo, tmp_path):
    result = runner.invoke(
        main,
        resnet18_args(
            "cam",
            "-l",
            "layer2",
            "--alpha",
            "0.6",
            "--resize",
            "128",
            "--crop",
            "128",
            "-o",
            str(tmp_path / "cams"),
            str(photo),
        ),
    )
    assert result.exit_code == 0, result.output
    cams, _ = _read(tmp_path / "cams" / "cams.safetensors")
    heat = cams["cam"][0].numpy()  # [16, 16]
    png = np.asarray(Image.open(tmp_path / "cams" / "00000_grace_hopper.png").convert("RGB")).astype(float)
    from hookcli.inputs.images import load_rgb, model_view
    from hookcli.pictures.text import caption_font

    bar = caption_font(512).getbbox("Ag")[3] + 12
    picture = png[-512 - bar : -bar]  # the view drawn 512 px, between the caption and the colour bar
    view = np.asarray(model_view(load_rgb(photo), resize=512, crop=512)).astype(float)
    added = (picture - 0.4 * view).mean(axis=2)  # what the heat map contributed
    cell = 512 // 16
    hot, cold = np.unravel_index(heat.argmax(), heat.shape), np.unravel_index(heat.argmin(), heat.shape)

    def at(index):
        return added[
            index[0] * cell + 2 : (index[0] + 1) * cell - 2, index[1] * cell + 2 : (index[1] + 1) * cell - 2
        ].mean()

    assert at(hot) > at(cold) + 60


def test_cam_on_a_vit_folds_tokens_into_a_square(runner, images, tmp_path):
    result = runner.invoke(main, ["cam", "-m", "vit_b_16", "-w", "none", "-o", str(tmp_path / "cams"), str(images[0])])
    assert result.exit_code == 0, result.output
    cams, metadata = _read(tmp_path / "cams" / "cams.safetensors")
    assert cams["cam"].shape == (1, 14, 14)
    assert metadata["cam_layer"] == "encoder.layers.encoder_layer_11.ln_1"


def test_cam_of_a_map_whose_channels_equal_its_height_on_an_input_that_is_not_square(tmp_path):
    import hookcli

    photo = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(photo)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    net = (net, {"resize": [32, 40]})  # its own preprocessing: squashed to 32 high, 40 wide
    found = hookcli.grad(net, "0", [photo], target="1")
    activations, gradients = found["0"], found["0@grad"]
    assert activations.shape == (1, 8, 8, 10)  # [N, C, H, W], C equal to H: channels first, as the module says
    expected = class_activation_maps(activations, gradients)
    cams = hookcli.cam(net, [photo], layer="0", target="1")
    assert cams["cam"].shape == (1, 8, 10)
    torch.testing.assert_close(cams["cam"], expected)


def test_class_names_come_with_pretrained_weights(runner, images, tmp_path):
    torch.manual_seed(0)
    cached = Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torchvision.models.resnet18().state_dict(), cached)
    try:
        result = runner.invoke(
            main, ["cam", "-m", "resnet18", "-t", "goldfish", *SMALL, "-o", str(tmp_path / "c"), str(images[0])]
        )
        assert result.exit_code == 0, result.output
        targets = json.loads(_read(tmp_path / "c" / "cams.safetensors")[1]["targets"])
        assert targets[0][0]["class"] == 1 and targets[0][0]["name"] == "goldfish"
    finally:
        cached.unlink()


def test_gradient_command_errors(runner, images, tmp_path):
    base = ["-m", "resnet18", "-w", "none", *SMALL, str(images[0])]
    cases = [
        (
            ["grad", "-l", "layer4", "-t", "1000", *base],
            2,
            "Error: target class 1000 is out of range: the model has 1000 classes. Hint: use 0 to 999 or top1",
        ),
        (
            ["cam", "-t", "goldfish", *base],
            2,
            "Error: target 'goldfish' is a class name, but these weights have no class names. Hint: give a class index "
            "(0 to 999) or top1; names come with pretrained --weights",
        ),
        (
            ["cam", "-l", "layer4.*", *base],
            2,
            "Error: cam takes one layer, and 'layer4.*' matches 2. Hint: see 'hookcli cam --help'",
        ),
    ]
    for args, code, message in cases:
        result = runner.invoke(main, args)
        assert (result.exit_code, result.stderr) == (code, message + "\n")
    assert not any(tmp_path.iterdir()) or sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]


def test_spatial_maps_reads_the_layout_from_the_shape():
    from hookcli.run.gradients import spatial_maps

    first = torch.arange(2 * 5 * 3 * 3.0).reshape(2, 5, 3, 3)
    assert spatial_maps(first) is first
    assert torch.equal(spatial_maps(first.permute(0, 2, 3, 1)), first)  # [N, H, W, C] back to [N, C, H, W]
    tokens = torch.arange(2 * 10 * 4.0).reshape(2, 10, 4)  # class token + 3x3 patches
    assert torch.equal(spatial_maps(tokens)[1, 2], tokens[1, 1:, 2].reshape(3, 3))


def test_cam_on_swin_takes_channels_last_layers_as_they_come(runner, images, tmp_path):
    result = runner.invoke(main, ["cam", "-m", "swin_t", "-w", "none", "-o", str(tmp_path / "default"), str(images[0])])
    assert result.exit_code == 0, result.output
    cams, metadata = _read(tmp_path / "default" / "cams.safetensors")
    assert metadata["cam_layer"] == "permute" and cams["cam"].shape == (1, 7, 7)
    for layer, side in (("features.0.0", 56), ("features.0", 56), ("norm", 7)):  # NCHW, then NHWC, NHWC
        result = runner.invoke(
            main, ["cam", "-m", "swin_t", "-w", "none", "-l", layer, "-o", str(tmp_path / layer), str(images[0])]
        )
        assert result.exit_code == 0, result.output
        assert _read(tmp_path / layer / "cams.safetensors")[0]["cam"].shape == (1, side, side)


@pytest.mark.parametrize(("model", "sizes"), [("resnet18", SMALL), ("lraspp_mobilenet_v3_large", ["--resize", "64"])])
def test_cam_decodes_each_image_once_for_the_model_and_its_picture(
    runner, photo, images, tmp_path, monkeypatch, model, sizes
):
    # A segmentation model (no crop) once also opened each image a third time for its size.
    opened = []
    real = Image.open

    def counted(handle, *args, **kwargs):
        opened.append(handle)
        return real(handle, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counted)
    inputs = [str(photo), str(images[0])]
    result = runner.invoke(main, ["cam", "-m", model, "-w", "none", *sizes, "-o", str(tmp_path / "cams"), *inputs])
    assert result.exit_code == 0, result.output
    assert len(opened) == len(inputs)
    assert len(list((tmp_path / "cams").glob("*.png"))) == len(inputs)
