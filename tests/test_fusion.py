"""Fused CPU inference: equal to the model as written (to fp32 rounding), hooked layers untouched, model unchanged."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

import hookcli
from hookcli.events import Note
from hookcli.models.loading import load_model
from hookcli.run.capture import FeatureCapture
from hookcli.run.fusion import FusedConvolution, fused_for_inference
from hookcli.run.settings import RunSettings

#: How close a fused fp32 forward stays to the model as written: oneDNN's kernels sum in their own order, which
#: moves values of order 1 by about 1e-5 on AVX2 CPUs (a folded BatchNorm left out would move them by order 1).
FP32_FUSED = {"rtol": 1e-4, "atol": 1e-4}
#: Whether oneDNN has bf16 convolutions on this CPU (AVX-512 BF16 or AMX): elsewhere bf16 runs unfused.
BF16_KERNELS = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _with_running_stats(model, seed=0):
    """Random BatchNorm statistics, so that folding them in really changes the weights."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.rand(module.num_features, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(module.num_features, generator=generator) - 0.5)
    return model.eval()


def _seeded(name):
    torch.manual_seed(0)
    return _with_running_stats(torchvision.models.get_model(name, weights=None))


def _fused_modules(module):
    return [m for m in module.modules() if isinstance(m, FusedConvolution)]


def test_resnet_fused_equals_the_model_and_leaves_it_unchanged():
    model = _seeded("resnet18")
    before = copy.deepcopy(model.state_dict())
    block = model.layer1[0]
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        expected = model(x)
    fused, count = fused_for_inference(model, [], dtype=torch.float32)
    # conv1, 16 block convolutions, 3 downsamples: every BatchNorm folded, the ReLUs and residual adds fused.
    assert count == 20 and len(_fused_modules(fused)) == 20
    assert [m.add for m in _fused_modules(fused)].count(True) == 8
    code = fused.code
    assert "bn" not in code and "relu" not in code and "add" not in code
    with torch.inference_mode():
        got = fused(x)
    torch.testing.assert_close(got, expected, **FP32_FUSED)
    assert not torch.equal(got, expected)  # folding really ran: other kernels, other rounding
    # The model given is the model it was: same modules, same weights, same results.
    assert model.layer1[0] is block and type(block.conv1) is nn.Conv2d and type(block.bn1) is nn.BatchNorm2d
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.inference_mode():
        assert torch.equal(model(x), expected)


def test_channels_last_bf16_fusion_matches_autocast():
    model = _seeded("resnet18").to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    fused, count = fused_for_inference(model, [], dtype=torch.bfloat16, channels_last=True)
    if not BF16_KERNELS:  # oneDNN has no bf16 kernels on this CPU: the model runs as written
        assert (fused, count) == (model, 0)
        return
    assert count == 20
    assert all(m.weight.dtype == torch.bfloat16 for m in _fused_modules(fused))  # cast once, not per batch
    assert _fused_modules(fused)[0].weight.is_contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        reference = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = fused(x)
    assert got.dtype == torch.bfloat16
    error = ((got.float() - reference).norm() / reference.norm()).item()
    assert error < 2e-2


def test_a_hooked_batchnorm_stays_whole_and_sees_its_own_output():
    model = _seeded("vgg16_bn")
    x = torch.randn(1, 3, 32, 32)
    fused, count = fused_for_inference(model, ["features.18"], dtype=torch.float32)
    # The 5 conv/BatchNorm pairs before features.17, which feeds the hooked features.18 and stays as it is.
    assert count == 5
    assert fused.get_submodule("features.18") is model.features[18]
    with FeatureCapture(fused, ["features.18"]) as capture, torch.inference_mode():
        got = capture.run(x)["features.18"]
    with torch.inference_mode():
        expected = create_feature_extractor(model, return_nodes=["features.18"])(x)["features.18"]
    torch.testing.assert_close(got, expected, **FP32_FUSED)
    assert (got < 0).any()  # before the in-place ReLU
    assert not model.features[18]._forward_hooks  # the hook went on the model's own module and came off


def test_a_shared_hooked_relu_keeps_every_call():
    model = _seeded("resnet18")
    x = torch.randn(2, 3, 64, 64)
    layers = {"layer1.0.relu": "relu", "layer2": "layer2"}
    fused, count = fused_for_inference(model, layers, dtype=torch.float32)
    # layer2, a leaf, keeps its 5 convolutions, and nothing after it is fused (extraction stops there);
    # layer1.0's convolutions keep the hooked ReLU out of their kernels.
    assert count == 5
    assert [(m.add, m.unary) for m in _fused_modules(fused)][1:3] == [(False, "none"), (True, "none")]
    with FeatureCapture(fused, layers) as capture, torch.inference_mode():
        got = capture.run(x)
        calls = capture.calls
    with FeatureCapture(model, layers) as capture, torch.inference_mode():
        expected = capture.run(x)
    assert calls == {"layer1.0.relu": 2, "layer2": 1}
    assert list(got) == ["relu:0", "relu:1", "layer2"] == list(expected)
    for key in got:
        torch.testing.assert_close(got[key], expected[key], **FP32_FUSED)


class _Chain(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.activation = activation

    def forward(self, x):
        return self.activation(self.norm(self.conv(x)))


@pytest.mark.parametrize(
    "activation",
    [
        nn.ReLU(inplace=True),
        nn.ReLU6(),
        nn.Hardtanh(-0.5, 0.5),
        nn.LeakyReLU(0.2),
        nn.GELU(),
        nn.GELU("tanh"),
        nn.SiLU(),
        nn.Hardswish(),
        nn.Hardsigmoid(),
        nn.Sigmoid(),
        nn.Tanh(),
        F.relu,
        torch.relu,
        F.relu6,
        F.silu,
        F.hardswish,
        torch.sigmoid,
        torch.tanh,
    ],
)
def test_each_activation_runs_inside_the_convolution(activation):
    model = _with_running_stats(_Chain(activation))
    x = torch.randn(2, 3, 10, 10)
    fused, count = fused_for_inference(model, [], dtype=torch.float32)
    assert count == 1
    (module,) = _fused_modules(fused)
    assert module.unary != "none"
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), **FP32_FUSED)


class _Residuals(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Conv2d(8, 8, 3, padding=1) for _ in range(4))
        self.na, self.nb, self.nc = nn.BatchNorm2d(8), nn.BatchNorm2d(8), nn.BatchNorm2d(8)
        self.shift = nn.Parameter(torch.randn(1, 8, 1, 1))

    def forward(self, x):
        out = self.na(self.a(x))
        out += x  # fused: conv + add + ReLU
        out = F.relu(out)
        kept = out.clone()
        kept.add_(self.nb(self.b(out)))  # in place: only the BatchNorm is folded
        broadcast = self.nc(self.c(kept)) + self.shift  # a broadcasting add: runs unfused inside the module
        used_twice = self.d(broadcast)  # its output has two users: left alone
        return used_twice + used_twice.relu(), kept


def test_residual_adds_fuse_only_where_nothing_else_sees_the_sum():
    model = _with_running_stats(_Residuals())
    x = torch.randn(2, 8, 6, 6)
    fused, count = fused_for_inference(model, [], dtype=torch.float32)
    assert count == 3
    assert [(m.add, m.unary) for m in _fused_modules(fused)] == [(True, "relu"), (False, "none"), (True, "none")]
    with torch.inference_mode():
        got, expected = fused(x), model(x)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **FP32_FUSED)


def test_models_with_nothing_to_fuse_or_that_cannot_be_traced_are_returned_as_they_are():
    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.norm(self.conv(x)) if x.sum() > 0 else x  # control flow on a value: not traceable

    branching = Branching().eval()
    assert fused_for_inference(branching, [], dtype=torch.float32) == (branching, 0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten()).eval()
    assert fused_for_inference(plain, [], dtype=torch.float32) == (plain, 0)
    assert fused_for_inference(_Chain(nn.ReLU()).eval(), [], dtype=torch.float16)[1] == 0  # not a CPU dtype


def test_extraction_fuses_when_asked_stops_early_and_leaves_no_hooks(images):
    loaded = load_model("resnet18", "none", seed=0)
    _with_running_stats(loaded.module)
    fc_calls = []
    handle = loaded.module.fc.register_forward_hook(lambda *_: fc_calls.append(1))
    try:
        fused = hookcli.extract(loaded, "layer2", images, batch_size=2, fuse=True, device="cpu")  # 3 fuse only if asked
        assert fc_calls == [1]  # the first batch of 2 runs whole and learns the call counts; the next stops at layer2
        plain = hookcli.extract(loaded, "layer2", images, batch_size=2, fuse=False, device="cpu")
    finally:
        handle.remove()
    assert fused["layer2"].shape == (len(images), 128, 28, 28)
    assert (fused.facts.fused, plain.facts.fused) == (5, 0)  # conv1 and layer1's four; layer2 is hooked, whole
    assert (fused.metadata["fused"], plain.metadata["fused"]) == ("5", "0")
    assert (
        RunSettings(fuse=True).fusing,
        RunSettings(fuse=False).fusing,
        RunSettings(fuse=True, compile=True).fusing,
    ) == (True, False, False)  # --compile fuses in its own way
    difference = (fused["layer2"] - plain["layer2"]).norm() / plain["layer2"].norm()
    assert 0 < difference < 1e-6  # other kernels, the same values to fp32 rounding
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in loaded.module.modules())
    assert all(type(m) is not FusedConvolution for m in loaded.module.modules())


def test_a_failing_fused_forward_falls_back_to_the_model_as_written(images, monkeypatch):
    loaded = load_model("resnet18", "none", seed=0)
    expected = hookcli.extract(loaded, "layer1", images, batch_size=2, fuse=False, device="cpu")

    def broken(self, x, other=None):
        raise RuntimeError("could not create a primitive\nsecond line")

    monkeypatch.setattr(FusedConvolution, "forward", broken)
    events = []
    run = hookcli.extract(loaded, "layer1", images, batch_size=2, fuse=True, device="cpu", progress=events.append)
    note = "the fused forward failed (RuntimeError: could not create a primitive); running the model unfused"
    assert run.notes == (note,) and [e for e in events if isinstance(e, Note)] == [Note(note)]
    assert run.facts.fused == 0 and run.metadata["fused"] == "0"  # the model as written ran
    assert torch.equal(run["layer1"], expected["layer1"])
    assert run.facts.calls == {"layer1": 1}
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in loaded.module.modules())


def test_modules_with_hooks_of_their_own_are_left_whole():
    model = _seeded("resnet18")
    x = torch.randn(2, 3, 64, 64)
    seen = []
    handle = model.layer1[0].conv1.register_forward_hook(lambda module, args, output: seen.append(output.clone()))
    try:
        fused, count = fused_for_inference(model, [], dtype=torch.float32)
        assert count == 19  # every convolution but the hooked one
        with torch.inference_mode():
            fused(x)
            expected = model.layer1[0].conv1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))
        assert len(seen) == 2 and torch.equal(seen[1], expected)  # the convolution's own output, BatchNorm apart
        assert torch.allclose(seen[0], expected, **FP32_FUSED)  # through the fused stem
        global_hook = nn.modules.module.register_module_forward_hook(lambda *args: None)
        try:
            assert fused_for_inference(model, [], dtype=torch.float32) == (model, 0)
        finally:
            global_hook.remove()
    finally:
        handle.remove()


def test_an_add_is_not_fused_when_the_convolution_input_changes_in_place_before_it():
    class Mutating(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)

        def forward(self, x):
            x = x * 1  # the graph's own tensor, changed in place below
            y = self.norm(self.conv(x))
            x.relu_()  # the convolution has read x already: running it at the add would read this
            return y + x

    model = _with_running_stats(Mutating())
    x = torch.randn(2, 4, 5, 5)
    fused, count = fused_for_inference(model, [], dtype=torch.float32)
    assert count == 1
    assert [(m.add, m.unary) for m in _fused_modules(fused)] == [(False, "none")]
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), **FP32_FUSED)
