"""Any nn.Module handed in: extract, grad, cam, stats, compare and layers take the module itself (or the module and
its preprocessing), capture what hooks written by hand capture, and give the module back as it came."""

import itertools
import json
import re
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

import hookcli
from hookcli.errors import UsageProblem
from hookcli.options.run import MEMORY_FORMATS

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


class TinyCNN(torch.nn.Module):
    """A convolution, a BatchNorm whose output an in-place ReLU overwrites, and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.relu = torch.nn.ReLU(inplace=True)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.pool(self.relu(self.bn1(self.conv(x)))).flatten(1))


def _net(seed: int = 0) -> TinyCNN:
    torch.manual_seed(seed)
    net = TinyCNN()
    with torch.no_grad():
        net.bn1.running_mean.uniform_(-0.5, 0.5)
        net.bn1.running_var.uniform_(0.5, 1.5)
    return net.train()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    paths = []
    for n in range(4):
        path = folder / f"{n}.png"
        Image.fromarray(rng.integers(0, 255, size=(40, 48, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _by_hand(net, photos, layers, size=32):
    """What forward hooks written by hand keep (each output cloned before the in-place ReLU), on the batch
    torchvision's transforms make of the photos, the module in eval mode."""
    made = transforms.Compose(
        [transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor(), transforms.Normalize(*IMAGENET)]
    )
    batch = torch.stack([made(Image.open(path).convert("RGB")) for path in photos])
    kept, handles = {}, []
    for name in layers:
        module = net.get_submodule(name)
        handles.append(module.register_forward_hook(lambda m, i, out, name=name: kept.__setitem__(name, out.clone())))
    mode = net.training
    net.eval()
    with torch.no_grad():
        net(batch)
    net.train(mode)
    for handle in handles:
        handle.remove()
    return kept


def _state(net):
    return {key: (value.data_ptr(), value.clone()) for key, value in net.state_dict().items()}


def test_a_module_handed_in_captures_what_hooks_by_hand_capture_and_comes_back_as_it_came(photos):
    net = _net()
    before, heard = _state(net), []
    found = hookcli.extract(
        net, ["bn1", "fc"], photos, resize=32, crop=32, memory_format="contiguous", progress=heard.append
    )
    expected = _by_hand(net, photos, ["bn1", "fc"])
    for key in ("bn1", "fc"):
        torch.testing.assert_close(found[key], expected[key], rtol=1e-5, atol=1e-5)
    assert (found["bn1"] < 0).any(), "the capture is what bn1 returned, before the in-place ReLU"
    assert net.training and not net._forward_hooks and not net.bn1._forward_hooks
    after = _state(net)
    assert all(after[k][0] == before[k][0] and torch.equal(after[k][1], before[k][1]) for k in before)
    assert found.metadata["model"] == "TinyCNN"
    weights = json.loads(found.metadata["weights"])
    assert weights["source"] == "module" and len(weights["sha256"]) == 64
    notes = [event.text for event in heard if type(event).__name__ == "Note"]
    assert notes == [
        "TinyCNN: the module was given without preprocessing, so what --resize, --crop, --mean and --std do not set "
        "is ImageNet's preprocessing (mean 0.485,0.456,0.406, std 0.229,0.224,0.225)"
    ]


def test_modules_of_one_class_with_other_weights_are_told_apart(photos):
    one = hookcli.extract(_net(0), "fc", photos[:1], resize=32, crop=32)
    other = hookcli.extract(_net(1), "fc", photos[:1], resize=32, crop=32)
    assert json.loads(one.metadata["weights"])["sha256"] != json.loads(other.metadata["weights"])["sha256"]


def test_a_sequential_with_its_preprocessing_needs_no_note(photos):
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    heard = []
    found = hookcli.extract((seq, {"resize": 24, "crop": 24, "mean": (0.5,) * 3, "std": (0.5,) * 3}), "0", photos,
                            progress=heard.append)  # fmt: skip
    assert tuple(found["0"].shape) == (4, 4, 22, 22) and found.metadata["model"] == "Sequential"
    assert not [event for event in heard if type(event).__name__ == "Note"]
    assert json.loads(found.metadata["preprocess"])["mean"] == [0.5, 0.5, 0.5]


def test_every_command_that_runs_a_model_takes_a_module(photos):
    net = _net()
    before = _state(net)
    stats = hookcli.stats(net, "bn1", photos, resize=32, crop=32, top=2)
    assert tuple(stats["bn1@top_maps"].shape) == (8, 2, 30, 30)
    cka = hookcli.compare(net, ["bn1", "fc"], photos, model2=net, layers2=["conv"], resize=32, crop=32)
    assert tuple(cka["linear-cka"].shape) == (2, 1)
    grads = hookcli.grad(net, "bn1", photos[:2], resize=32, crop=32)
    assert tuple(grads["bn1@grad"].shape) == (2, 8, 30, 30)
    cams = hookcli.cam(net, photos[:2], layer="bn1", resize=32, crop=32)
    assert tuple(cams["cam"].shape) == (2, 30, 30)
    rows = hookcli.layers(net)
    assert [row.path for row in rows] == [".", "conv", "bn1", "relu", "pool", "fc"]
    assert rows[2].output == [1, 8, 222, 222]
    after = _state(net)
    assert net.training and all(torch.equal(after[k][1], before[k][1]) for k in before)


def test_what_is_not_a_model_is_refused_in_one_line(photos):
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(5, "x", photos)
    assert str(refused.value) == (
        "a model is a name, an nn.Module or a module and its preprocessing, and this is of type int. Hint: "
        "'hookcli models' lists the names"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script says it is deprecated
        scripted_module = torch.jit.script(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(UsageProblem) as scripted:
        hookcli.extract(scripted_module, "0", photos)
    assert str(scripted.value).startswith("the model given is a TorchScript module (RecursiveScriptModule)")


class Sized(TinyCNN):
    """A model of one input size, which it asserts, as torchvision's ViTs do; ``failure``: a RuntimeError of its own
    at its call ``failing_call``."""

    def __init__(self, failure: str = "", failing_call: int = 1) -> None:
        super().__init__()
        self.failure, self.failing_call, self.calls = failure, failing_call, 0

    def forward(self, x):
        self.calls += 1
        if self.failure and self.calls == self.failing_call:
            raise RuntimeError(self.failure)
        assert x.shape[-1] == 48, f"Wrong image width! Expected 48 but got {x.shape[-1]}!"
        return super().forward(x)


def test_a_model_that_cannot_take_the_runs_input_size_says_so_in_its_own_words(photos):
    from hookcli.errors import CaptureError

    with pytest.raises(CaptureError) as refused:
        hookcli.extract(Sized(), "conv", photos, resize=32, crop=32)
    assert str(refused.value) == (
        "Sized cannot run on this run's inputs ([4, 3, 32, 32]: Wrong image width! Expected 48 but got 32!). Hint: "
        "give it inputs of a size it takes (--resize, --crop)"
    )
    with pytest.raises(CaptureError) as named:
        hookcli.extract("vit_b_16", "encoder", photos[:1], weights="none", resize=32, crop=32)
    assert str(named.value) == (
        "vit_b_16 cannot run on this run's inputs ([1, 3, 32, 32]: Wrong image height! Expected 224 but got 32!). "
        "Hint: give it inputs of a size it takes (--resize, --crop); hookcli layers -m vit_b_16 runs it on its natural "
        "input"
    )
    # Not a refusal of the inputs' size, or not at the first batch: raised as it was.
    cuda = "CUDA error: no kernel image is available for execution on the device"
    with pytest.raises(RuntimeError, match=f"^{cuda}$"):
        hookcli.extract(Sized(cuda), "conv", photos, resize=32, crop=32)
    later = "the size of tensor a (3) must match the size of tensor b (4)"
    with pytest.raises(RuntimeError, match=rf"^{re.escape(later)}$"):
        hookcli.extract(Sized(later, failing_call=2), "conv", photos, resize=48, crop=48, batch_size=2)


def test_weights_and_flags_that_cannot_apply_are_refused(photos):
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(_net(), "bn1", photos, weights="IMAGENET1K_V1")
    assert str(refused.value) == (
        "weights choose what hookcli builds a model from a name with, and TinyCNN is built already. Hint: load the "
        "weights into the model first, or give the model by its name"
    )
    with pytest.raises(UsageProblem) as flag:
        hookcli.stats(_net(), "bn1", photos, pca="no")
    assert str(flag.value) == "pca must be True or False, not 'no'. Hint: see --help for the values each option takes"


class SharedReLU(torch.nn.Module):
    """One ReLU module called after both convolutions: it has no one map to take a CAM at."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)
        self.relu, self.fc = torch.nn.ReLU(), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.relu(self.conv2(self.relu(self.conv1(x)))).mean(dim=(2, 3)))


def test_the_default_cam_layer_is_one_that_runs_once(photos):
    cams = hookcli.cam(SharedReLU(), photos[:1], resize=32, crop=32)
    assert cams.metadata["cam_layer"] == "conv2" and tuple(cams["cam"].shape) == (1, 28, 28)


def test_an_unknown_layer_of_a_module_points_at_hookcli_layers(photos):
    from hookcli.errors import UnknownLayerError

    with pytest.raises(UnknownLayerError) as refused:
        hookcli.extract(_net(), "bn2", photos)
    assert str(refused.value).endswith("Hint: hookcli.layers(model) lists them")


def test_a_module_is_fused_only_when_asked(photos):
    many = photos * 4  # 16 inputs: a model built from a name fuses from here on (on the CPU, where fusion is)
    assert hookcli.extract(_net(), "fc", many, resize=32, crop=32, device="cpu").metadata["fused"] == "0"
    assert hookcli.extract(_net(), "fc", many, resize=32, crop=32, device="cpu", fuse=True).metadata["fused"] == "1"


class WithAside(TinyCNN):
    """Logits in a mapping, beside an auxiliary head of another width defined after the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.aside = torch.nn.Linear(8, 2)

    def forward(self, x):
        pooled = self.pool(self.relu(self.bn1(self.conv(x)))).flatten(1)
        return {"logits": self.fc(pooled), "aside": self.aside(pooled)}


def test_gradients_of_a_mapping_take_its_logits_and_count_its_classes_as_it_runs(photos):
    torch.manual_seed(0)
    net = WithAside().eval()
    plain = TinyCNN().eval()
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("aside")})
    options = {"resize": 32, "crop": 32}
    for target in ("3", "top4"):
        found = hookcli.grad(net, "conv", photos, target=target, **options)
        expected = hookcli.grad(plain, "conv", photos, target=target, **options)
        assert found["conv@grad" if target == "3" else "conv@grad#3"].abs().max() > 0
        assert all(torch.equal(found[key], expected[key]) for key in expected)
    assert torch.equal(hookcli.cam(net, photos, layer="conv", **options)["cam"],
                       hookcli.cam(plain, photos, layer="conv", **options)["cam"])  # fmt: skip
    for target, refusal in (
        ("4", "target class 4 is out of range: the model has 4 classes. Hint: use 0 to 3 or top1"),
        ("top5", "target 'top5' asks for 5 classes of 4. Hint: use top1 to top4"),
        ("-1", "target class -1 is out of range. Hint: count classes from 0, or use top1"),
    ):
        with pytest.raises(UsageProblem) as caught:
            hookcli.grad(net, "conv", photos, target=target, **options)
        assert str(caught.value) == refusal


def test_a_module_of_other_dtypes_is_refused_in_one_line_and_its_layers_are_described_in_them(photos):
    from hookcli.errors import CaptureError

    hint = (
        "Hint: give it float32 parameters (module.float()); a bfloat16 or float16 model runs with --precision bf16 "
        "(or fp16 on a GPU)"
    )
    for dtype, words in ((torch.float64, "double"), (torch.bfloat16, "c10::BFloat16")):
        net = _net().to(dtype)
        for run in (hookcli.extract, hookcli.ablate):
            with pytest.raises(CaptureError) as caught:
                run(net, "conv", photos, resize=32, crop=32)
            name = str(dtype).removeprefix("torch.")
            assert str(caught.value) == (
                f"TinyCNN has {name} parameters, which a run in fp32 does not feed (Input type (float) and bias type "
                f"({words}) should be the same). {hint}"
            )
        assert [(row.path, row.output) for row in hookcli.layers(net)][1] == ("conv", [1, 8, 222, 222])
    bf16 = hookcli.extract(_net().to(torch.bfloat16), "conv", photos, resize=32, crop=32, precision="bf16")
    assert bf16["conv"].shape == (4, 8, 30, 30)


def test_arguments_python_users_try_are_refused_in_one_line_before_any_run(photos):
    from hookcli.errors import InputError

    net = _net()
    refusals = [
        (lambda: hookcli.extract(net, net.conv, photos), UsageProblem,
         "layers are named by their paths in the model, such as 'layer3.1.conv2', and one given is of type Conv2d. "
         "Hint: give a path as a string, or a list of them (hookcli.layers(model) lists the paths)"),
        (lambda: hookcli.extract(net, ["conv", 3], photos), UsageProblem, "one given is of type int. Hint:"),
        (lambda: hookcli.extract(net, ["conv", None], photos), UsageProblem, "one given is of type NoneType. Hint:"),
        (lambda: hookcli.extract(net, "conv", [photos[0], None]), InputError, "one given is of type NoneType. Hint:"),
        (lambda: hookcli.extract(net, "conv", Image.open(photos[0])), InputError,
         "inputs are paths of images, videos, folders or archives, and one given is of type PngImageFile. Hint: save "
         "the images and give their paths (or a folder, or '-' for a list on stdin)"),
        (lambda: hookcli.extract(net, "conv", torch.zeros(2, 3, 8, 8)), InputError,
         "one given is of type Tensor. Hint:"),
        (lambda: hookcli.extract(TinyCNN, "conv", photos), UsageProblem,
         "the model given is the class TinyCNN, not a model built from it. Hint: give one built: TinyCNN(…)"),
        (lambda: hookcli.extract((net, {"crop": 32}), "conv", photos), UsageProblem,
         "the preprocessing the module TinyCNN gives is not usable: resize must be given (and crop, with one side)."),
        (lambda: hookcli.extract((net, {"resize": 32, "crop": 32, "centre": 1}), "conv", photos), UsageProblem,
         "the preprocessing the module TinyCNN gives is not usable: centre is none of its fields (resize, crop,"),
    ]  # fmt: skip
    for call, kind, words in refusals:
        with pytest.raises(kind) as caught:
            call()
        assert words in str(caught.value) and caught.value.exit_code == 2


def test_a_run_leaves_the_callers_random_state_and_refuses_a_text_stdout(photos, monkeypatch):
    import io
    import sys

    net = _net()
    torch.manual_seed(0)
    expected = torch.rand(3)
    for workers in (0, 1):
        torch.manual_seed(0)
        features = hookcli.extract(net, "conv", photos, resize=32, crop=32, workers=workers)
        assert torch.equal(torch.rand(3), expected)  # the loader drew its seeds from a generator of its own
    assert isinstance(features, hookcli.FeatureReader)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract(net, "conv", photos, resize=32, crop=32, output="-")
    assert str(caught.value) == (
        "output '-' writes the file's bytes to stdout, and this stdout takes text alone. Hint: give a binary stream "
        "as the output (io.BytesIO(), a file opened 'wb') or a path"
    )


def test_a_module_made_under_inference_mode_is_refused_in_one_line_and_given_back(photos):
    from hookcli.errors import CaptureError

    with torch.inference_mode():
        net = TinyCNN().eval()
    weight = net.conv.weight
    for memory_format, given in itertools.product(MEMORY_FORMATS, (photos[:1], photos)):
        # weights laid out (or moved to a GPU) for the run, as they were made
        found = hookcli.extract(net, "conv", given, resize=32, crop=32, memory_format=memory_format)
        assert found["conv"].shape == (len(given), 8, 30, 30)
        assert net.conv.weight is weight and weight.is_contiguous()
    for run in (lambda: hookcli.grad(net, "conv", photos, resize=32, crop=32),
                lambda: hookcli.cam(net, photos, layer="conv", resize=32, crop=32)):  # fmt: skip
        with pytest.raises(CaptureError) as caught:
            run()
        assert str(caught.value).startswith(
            "TinyCNN's parameters were made under torch.inference_mode(), and torch runs them here no more ("
        )
        assert caught.value.hint == "build or load the model outside torch.inference_mode()"
        assert all(parameter.requires_grad for parameter in net.parameters())  # as it came


def _as_given(net) -> tuple:
    """What the caller sees of ``net``: each module's mode and hooks, each parameter's need of a gradient and layout."""
    return (
        [(module.training, len(module._forward_hooks), len(module._forward_pre_hooks)) for module in net.modules()],
        [(p.requires_grad, p.is_contiguous()) for p in net.parameters()],
    )


@pytest.mark.parametrize("command", ["extract", "grad", "stats", "compare"])
def test_a_module_is_given_back_before_an_error_from_outside_its_forward_is_raised_on(photos, command):
    net = _net()
    given = _as_given(net)

    def interrupted(event):  # a Ctrl-C landing in the caller's progress bar, the error then kept (as a notebook does)
        if type(event).__name__ == "Advanced":
            raise KeyboardInterrupt

    extra = {"target": "0"} if command == "grad" else {"model2": net} if command == "compare" else {}
    with pytest.raises(KeyboardInterrupt) as kept:
        getattr(hookcli, command)(net, ["bn1"], photos, resize=32, crop=32, batch_size=2, progress=interrupted, **extra)
    assert kept.value is not None and _as_given(net) == given  # while the error is alive
    net.eval()(torch.zeros(1, 3, 32, 32))  # the caller's own forward runs, with no hook of the run left


def test_a_second_side_sharing_modules_with_the_first_runs_a_copy_and_both_come_back(photos):
    net = _net()
    wrapped = torch.nn.Sequential(net, torch.nn.Identity())
    given, state = _as_given(net), _state(net)
    found = hookcli.compare(net, ["bn1"], photos, model2=wrapped, layers2=["0.bn1"], resize=32, crop=32, batch_size=2)
    torch.testing.assert_close(found["linear-cka"], torch.ones(1, 1, dtype=torch.float64))
    assert _as_given(net) == given and all(torch.equal(state[k][1], v) for k, v in net.state_dict().items())


def test_a_layer_that_returns_several_values_is_refused_by_compare_naming_them(photos):
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x, None

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), Pair())
    said = (
        "'1' returns several values (1#0): a comparison takes layers that return one tensor. Hint: choose another "
        "layer, or extract this one and compare the value saved, as hookcli compare FILE -k '1#0'"
    )
    for extra in ({}, {"model2": net}):
        with pytest.raises(hookcli.HookcliError) as refused:
            hookcli.compare(net, ["0", "1"], photos, resize=32, crop=32, **extra)
        assert str(refused.value) == said


def test_gradients_are_taken_of_a_module_handed_in_under_the_callers_inference_mode(photos):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(3)
    )
    net(torch.zeros(1, 3, 32, 32))
    asked = {"target": "0", "resize": 32, "crop": 32, "memory_format": "channels_last"}
    expected = hookcli.grad(net, "0", photos, **asked)
    with torch.inference_mode():  # the weights laid out channels-last for the run are no inference tensors
        found = hookcli.grad(net, "0", photos, **asked)
    torch.testing.assert_close(found["0@grad"], expected["0@grad"])
    assert not any(p.is_inference() for p in net.parameters()) and net[0].weight.is_contiguous()


@pytest.mark.parametrize("command", [hookcli.extract, hookcli.grad])
def test_a_weight_that_a_pre_hook_derives_is_the_callers_tensor_after_a_run(photos, command):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # old-style weight_norm is deprecated, and still in use
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.utils.weight_norm(torch.nn.Conv2d(3, 4, 3)), torch.nn.Flatten(), torch.nn.LazyLinear(3)
        )
    net(torch.zeros(1, 3, 32, 32))
    derived = net[0].weight
    command(net, "0", photos, resize=32, crop=32)
    assert net[0].weight is derived and not derived.is_inference() and derived.requires_grad
    (net[0].weight * 2).sum().backward()  # the caller's autograd takes it, as before the run
    assert net[0].weight_v.grad.abs().sum() > 0


class Counting(TinyCNN):
    """A forward that counts its calls in buffers: one written in place, one put in the other's stead each call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("in_place", torch.zeros((), dtype=torch.int64))
        self.register_buffer("assigned", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.in_place += 1
        self.assigned = self.assigned + 1
        return super().forward(x)


@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_a_forward_keeps_what_it_writes_into_its_buffers_or_puts_in_their_place(photos, memory_format):
    net = Counting().eval()
    first, written = net.assigned, net.in_place
    hookcli.extract(net, "conv", photos[:2], resize=32, crop=32, memory_format=memory_format, batch_size=1)
    assert (int(net.in_place), int(net.assigned)) == (2, 2)  # one forward a batch of one
    assert net.in_place is written and net.assigned is not first and int(first) == 0  # as calls by hand leave them
    assert not net.assigned.is_inference()  # made in the run, and still a tensor autograd takes
    hookcli.extract(net, "conv", photos[:2], resize=32, crop=32, precision="bf16", batch_size=2)
    assert (int(net.in_place), int(net.assigned), net.assigned.dtype) == (3, 3, torch.int64)


class Growing(TinyCNN):
    """A forward that keeps each image's mean in a buffer that grows."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(0))

    def forward(self, x):
        self.seen = torch.cat([self.seen, x.mean(dim=(1, 2, 3))])
        return super().forward(x)


def test_a_buffer_the_forward_grows_comes_back_grown_and_usable_by_autograd(photos):
    net = Growing().eval()
    hookcli.extract(net, "conv", photos[:2], resize=32, crop=32, batch_size=2)
    assert net.seen.shape == (2,) and not net.seen.is_inference()
    (net.seen * torch.nn.Parameter(torch.ones(2))).sum().backward()


def test_a_data_parallel_module_runs_its_forwards_whole():
    from hookcli.run.capture import FeatureCapture

    assert FeatureCapture(TinyCNN(), ["conv"]).stop_early
    assert not FeatureCapture(torch.nn.DataParallel(TinyCNN()), ["module.conv"]).stop_early  # threads stop on it


class Branching(TinyCNN):
    """A forward that branches on a value: torch.compile's full graph cannot hold it."""

    def forward(self, x):
        y = self.conv(x)
        if y.sum().item() > 1e9:
            y = y * 2
        return self.fc(self.pool(y).flatten(1))


def test_a_compiled_module_whose_graph_cannot_run_is_refused_in_one_line_naming_the_compiler(photos):
    from hookcli.errors import CaptureError

    compiled = torch.compile(Branching().eval(), fullgraph=True)
    with pytest.raises(CaptureError) as raised:
        hookcli.extract(compiled, "_orig_mod.conv", photos[:1], resize=32, crop=32)
    assert raised.value.message.startswith(
        "OptimizedModule was compiled by torch.compile, and its compiled graph cannot run here ("
    )
    assert "\n" not in raised.value.message
    assert raised.value.hint == (
        "hand in the module before it was compiled (its _orig_mod), or compile it without fullgraph=True"
    )


class Flattened(torch.nn.Module):
    """A convolution, then a linear layer sized for 16 x 16 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(4 * 16 * 16, 5)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def test_a_compiled_module_that_refuses_an_inputs_size_says_so_in_the_models_words(photos, capfd):
    from hookcli.errors import CaptureError

    capfd.readouterr()
    with pytest.raises(CaptureError) as raised:
        hookcli.extract(torch.compile(Flattened().eval()), "_orig_mod.conv", photos[:1], resize=32, crop=32)
    assert raised.value.message.startswith("OptimizedModule cannot run on this run's inputs ([1, 3, 32, 32]: ")
    assert "4096" in raised.value.message  # torch's words of the flattened width: 4 x 32 x 32, not 4 x 16 x 16
    assert "failed while attempting to run meta" not in capfd.readouterr().err  # torch's log of the error raised


def test_torchs_log_of_a_failed_operator_is_dropped_inside_the_blocks_alone_in_every_thread():
    import logging
    import threading

    from hookcli.run.batches import quiet_meta_failures

    logger, seen = logging.getLogger("torch._subclasses.fake_tensor"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        inside, done = threading.Event(), threading.Event()

        def quiet_a_while():
            with quiet_meta_failures():
                inside.set()
                done.wait(10)
                logger.error("dropped in the other thread")

        other = threading.Thread(target=quiet_a_while)
        other.start()
        inside.wait(10)
        with quiet_meta_failures(), quiet_meta_failures():
            logger.error("dropped")
            logger.warning("kept: a warning")
        logger.error("kept: outside, while another thread is inside")
        done.set()
        other.join(10)
        logger.error("kept: after")
    finally:
        logger.removeHandler(handler)
    assert seen == ["kept: a warning", "kept: outside, while another thread is inside", "kept: after"]
