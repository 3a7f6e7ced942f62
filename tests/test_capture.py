"""FeatureCapture against torchvision's FX extractor, plus hook hygiene."""

import pytest
import torch
import torch.nn as nn
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

from hookcli.errors import CaptureError, LayerNotRunError
from hookcli.run.capture import COUNTING_FORWARD_FROM, FeatureCapture


def _seeded(name):
    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None).eval()


@pytest.fixture(scope="module")
def vgg():
    return _seeded("vgg16_bn")


@pytest.fixture(scope="module")
def resnet():
    return _seeded("resnet18")


def _fx(model, node, x):
    """The FX reference, one node at a time: asking FX for several nodes keeps later in-place ops in its graph."""
    with torch.inference_mode():
        return create_feature_extractor(model, return_nodes=[node])(x)[node]


def _capture(model, layers, x, **options):
    with FeatureCapture(model, layers, **options) as capture, torch.inference_mode():
        return capture.run(x)


@pytest.mark.parametrize(
    "name, layer, size",
    [
        ("vgg16_bn", "features.18", 64),  # BatchNorm followed by ReLU(inplace=True)
        ("vgg16_bn", "features.41", 64),  # last BatchNorm, also before an in-place ReLU
        ("resnet18", "layer3.1.conv2", 64),
        ("resnet18", "layer2.0.bn2", 64),  # its output gets `out += identity` in place
        ("resnet18", "layer4", 64),
        ("mobilenet_v3_small", "features.4.block.2", 64),
        ("vit_b_16", "encoder.layers.encoder_layer_1", 224),
        ("vit_b_16", "encoder.ln", 224),
    ],
)
def test_capture_equals_fx_extractor(name, layer, size):
    model = _seeded(name)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    expected = _fx(model, layer, x)
    got = _capture(model, [layer], x)
    assert list(got) == [layer]
    assert got[layer].shape == expected.shape
    assert torch.equal(got[layer], expected)


def test_inplace_relu_does_not_reach_the_capture(vgg):
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    kept = {}
    handle = vgg.features[18].register_forward_hook(lambda module, inputs, output: kept.setdefault("ref", output))
    try:
        with torch.inference_mode():
            vgg(x)
    finally:
        handle.remove()
    got = _capture(vgg, ["features.18"], x)["features.18"]
    # A kept reference was overwritten by ReLU(inplace=True): no negatives left. The capture keeps BatchNorm's values.
    assert (kept["ref"] < 0).sum().item() == 0
    assert (got < 0).float().mean().item() > 0.3
    assert torch.equal(got, _fx(vgg, "features.18", x))


def test_input_is_read_before_an_inplace_module_changes_it(vgg):
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    got = _capture(vgg, ["features.19"], x, capture="both")
    assert sorted(got) == ["features.19", "features.19@input"]
    assert torch.equal(got["features.19@input"], _fx(vgg, "features.18", x))
    assert torch.equal(got["features.19"], _fx(vgg, "features.19", x))
    assert (got["features.19@input"] < 0).any() and not (got["features.19"] < 0).any()


def test_module_run_twice_yields_every_call(resnet):
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with FeatureCapture(resnet, {"layer1.0.relu": "act"}, capture="both") as capture, torch.inference_mode():
        got = capture.run(x)
    assert capture.calls == {"layer1.0.relu": 2}
    assert sorted(got) == ["act:0", "act:0@input", "act:1", "act:1@input"]
    assert torch.equal(got["act:0"], _fx(resnet, "layer1.0.relu", x))
    assert torch.equal(got["act:1"], _fx(resnet, "layer1.0.relu_1", x))
    assert torch.equal(got["act:1@input"], _fx(resnet, "layer1.0.add", x))


def test_stop_early_gives_the_same_tensors_without_running_later_layers(resnet):
    x = torch.randn(COUNTING_FORWARD_FROM, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    ran = []
    handle = resnet.fc.register_forward_pre_hook(lambda module, inputs: ran.append(len(inputs[0])))
    try:
        with FeatureCapture(resnet, ["layer2", "layer1.0.relu"]) as capture, torch.inference_mode():
            first = capture.run(x)  # a one-image forward learns the call counts; the batch stops after layer2
            second = capture.run(x)  # stops after layer2
        with FeatureCapture(resnet, ["layer2", "layer1.0.relu"], stop_early=False) as capture, torch.inference_mode():
            capture.run(x)
            full = capture.run(x)
    finally:
        handle.remove()
    # Only a one-image forward (learning the call counts) and the two full ones reached fc.
    assert ran == [1, COUNTING_FORWARD_FROM, COUNTING_FORWARD_FROM]
    assert sorted(first) == sorted(second) == sorted(full) == ["layer1.0.relu:0", "layer1.0.relu:1", "layer2"]
    for key in full:
        assert torch.equal(second[key], full[key])


class Fallback(nn.Module):
    """A forward with a fallback path for any ``Exception``, and a hook that torch calls even when it raises."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 3)
        self.heard: list = []
        self.register_forward_hook(lambda module, args, output: self.heard.append(output), always_call=True)

    def forward(self, x):
        try:
            return self.second(self.first(x))
        except Exception:
            return self.second(self.first(x) * 0 + 1)


def test_stopping_early_is_not_an_exception_a_forwards_fallback_or_an_always_called_hook_sees():
    net = Fallback().eval()
    x = torch.randn(COUNTING_FORWARD_FROM, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    with FeatureCapture(net, ["first"]) as capture, torch.inference_mode():
        capture.run(x)  # learns that first runs once, then stops after it
        caught = capture.run(x)
    assert list(caught) == ["first"] and torch.equal(caught["first"], net.first(x))
    assert [None if output is None else tuple(output.shape) for output in net.heard] == [(1, 2, 4, 4)]  # counting


def test_a_first_batch_too_small_for_a_counting_forward_runs_whole_and_learns_the_counts(resnet):
    x = torch.randn(COUNTING_FORWARD_FROM - 1, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    ran = []
    handle = resnet.fc.register_forward_pre_hook(lambda module, inputs: ran.append(len(inputs[0])))
    try:
        with FeatureCapture(resnet, ["layer1.0.relu", "layer2"]) as capture, torch.inference_mode():
            first = capture.run(x)
            calls = dict(capture.calls)
            second = capture.run(x)
    finally:
        handle.remove()
    assert ran == [COUNTING_FORWARD_FROM - 1]  # the first batch ran whole, the second stopped after layer2
    assert calls == {"layer1.0.relu": 2, "layer2": 1}
    assert list(first) == list(second) == ["layer1.0.relu:0", "layer1.0.relu:1", "layer2"]
    assert torch.equal(first["layer2"], _fx(resnet, "layer2", x))
    assert torch.equal(first["layer1.0.relu:1"], _fx(resnet, "layer1.0.relu_1", x))
    for key in first:
        assert torch.equal(second[key], first[key])


def _hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class _Explodes(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_hooks_removed_and_mode_restored_when_forward_raises():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(), _Explodes())
    model.train()
    model[1].eval()  # a mixed state must come back exactly
    with pytest.raises(ValueError, match="boom"):
        with FeatureCapture(model, ["0", "1"], capture="both") as capture:
            assert _hook_count(model) == 4
            assert not any(m.training for m in model.modules())
            capture.run(torch.ones(2, 4))
    assert _hook_count(model) == 0
    assert [m.training for m in model.modules()] == [True, True, False, True]


def test_hooks_removed_after_a_normal_run(resnet):
    with FeatureCapture(resnet, ["layer1", "layer3.0.conv1"], capture="both") as capture, torch.inference_mode():
        capture.run(torch.zeros(1, 3, 32, 32))
    assert _hook_count(resnet) == 0


class _Containers(nn.Module):
    def forward(self, x):
        return x * 2, None, {"half": x / 2, "pair": [x + 1, x - 1]}


class _TakesTwo(nn.Module):
    def forward(self, a, b):
        return a + b


class _Wiring(nn.Module):
    def __init__(self):
        super().__init__()
        self.split = _Containers()
        self.join = _TakesTwo()
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        doubled, _, rest = self.split(x)
        return self.join(doubled, rest["half"])


def test_container_outputs_are_saved_element_by_element():
    x = torch.arange(6.0).reshape(2, 3)
    with FeatureCapture(_Wiring(), ["split", "join"], capture="both") as capture:
        got = capture.run(x)
    assert sorted(got) == sorted(
        [
            "join",
            "join@input#0",
            "join@input#1",
            "split#0",
            "split#2#half",
            "split#2#pair#0",
            "split#2#pair#1",
            "split@input",
        ]
    )
    assert torch.equal(got["split#2#pair#1"], x - 1)
    assert torch.equal(got["join"], x * 2 + x / 2)
    assert capture.omitted == {"split#1"}


def test_a_layer_that_never_runs_is_an_error():
    with pytest.raises(LayerNotRunError) as caught:
        with FeatureCapture(_Wiring(), ["join", "unused"]) as capture:
            capture.run(torch.ones(2, 3))
    assert str(caught.value) == (
        "layer unused never ran during the forward pass. Hint: the model defines it but does not call it "
        "(in eval mode); pick another with 'hookcli layers'"
    )


class _Summary(nn.Module):
    def forward(self, x):
        return x.mean()


def test_a_non_batch_first_output_is_an_error():
    model = nn.Sequential(nn.Linear(3, 3), _Summary())
    with pytest.raises(CaptureError, match=r"'1' has shape \[\], not batch-first for a batch of 2"):
        with FeatureCapture(model, ["1"]) as capture:
            capture.run(torch.ones(2, 3))


def test_the_batch_pipeline_leaves_grad_mode_alone_between_batches(images):
    from hookcli.models.loading import load_model
    from hookcli.run.pipeline import iter_batches
    from hookcli.run.settings import RunSettings

    loaded = load_model("resnet18", "none")
    batches = iter_batches(loaded, {"layer1": "layer1"}, images, RunSettings(batch_size=1))
    next(batches)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    del batches  # an abandoned run must not leave anything switched either
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


class _MixedRows:
    """A forward strategy whose one key has rows of two dtypes in each batch."""

    def __init__(self, model, layers, settings, on_note=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def __call__(self, batch):
        return {"mixed": [torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)]}, None

    def facts(self):
        return None


def test_rows_of_one_key_in_two_dtypes_are_refused_naming_the_key(images):
    from hookcli.models.loading import load_model
    from hookcli.run.pipeline import iter_batches

    batches = iter_batches(load_model("resnet18", "none"), {"layer1": "mixed"}, images[:2], forward=_MixedRows)
    with pytest.raises(CaptureError) as caught:
        next(batches)
    assert str(caught.value) == (
        "'mixed' has rows of 2 dtypes in one batch (int32, int64). "
        "Hint: hookcli stores a key in one dtype; select a layer whose rows share one"
    )
