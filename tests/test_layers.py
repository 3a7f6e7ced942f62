"""Layer selectors and the layer table."""

import pytest
import torch
import torch.nn as nn
import torchvision

from hookcli.errors import UnknownLayerError, UsageProblem
from hookcli.run.layer_table import describe_layers
from hookcli.run.selectors import resolve_layers


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval()


def test_exact_paths_come_back_in_model_order(resnet):
    assert resolve_layers(resnet, ["layer3.1.conv2", "conv1"]) == {"conv1": "conv1", "layer3.1.conv2": "layer3.1.conv2"}


def test_star_stays_in_one_component_and_double_star_crosses(resnet):
    assert list(resolve_layers(resnet, ["layer3.*.conv2"])) == ["layer3.0.conv2", "layer3.1.conv2"]
    assert list(resolve_layers(resnet, ["layer4.*"])) == ["layer4.0", "layer4.1"]
    deep = resolve_layers(resnet, ["layer4.**"])
    assert "layer4.0.downsample.0" in deep and "layer4.1.bn2" in deep and len(deep) == 15
    assert list(resolve_layers(resnet, ["layer[12].0.conv?"])) == [
        "layer1.0.conv1",
        "layer1.0.conv2",
        "layer2.0.conv1",
        "layer2.0.conv2",
    ]


def test_type_selectors(resnet):
    assert list(resolve_layers(resnet, ["type:AdaptiveAvgPool2d", "type:Linear"])) == ["avgpool", "fc"]
    assert len(resolve_layers(resnet, ["type:Conv2d"])) == 20
    assert len(resolve_layers(resnet, ["type:torch.nn.modules.conv.*"])) == 20


def test_rename_and_duplicates(resnet):
    assert resolve_layers(resnet, ["layer4=final", "fc", "fc"]) == {"layer4": "final", "fc": "fc"}
    with pytest.raises(UsageProblem, match="'layer4.\\*=x' renames 2 layers"):
        resolve_layers(resnet, ["layer4.*=x"])
    with pytest.raises(UsageProblem, match="layer 'fc' is selected under two names, 'fc' and 'logits'"):
        resolve_layers(resnet, ["fc", "fc=logits"])
    with pytest.raises(UsageProblem, match="two layers would be stored under the key 'fc'"):
        resolve_layers(resnet, ["fc", "avgpool=fc"])
    with pytest.raises(UsageProblem, match="invalid key name in 'fc=a@b'"):
        resolve_layers(resnet, ["fc=a@b"])


def test_unknown_path_names_the_three_closest(resnet):
    with pytest.raises(UnknownLayerError) as caught:
        resolve_layers(resnet, ["layer3.1.conv3"], model_name="resnet18")
    assert str(caught.value) == (
        "no layer 'layer3.1.conv3' in resnet18 (closest: layer3.1.conv2, layer3.1.conv1, layer4.1.conv2). "
        "Hint: run 'hookcli layers --model resnet18' to list them"
    )


def test_unknown_type_and_empty_glob(resnet):
    with pytest.raises(UnknownLayerError, match=r"no layer of type 'Conv1d' in resnet18 \(closest types: Conv2d"):
        resolve_layers(resnet, ["type:Conv1d"], model_name="resnet18")
    with pytest.raises(UnknownLayerError, match="no layer matches 'layer9.*' in resnet18"):
        resolve_layers(resnet, ["layer9.*"], model_name="resnet18")


def test_describe_layers_in_forward_order_with_shapes_params_and_calls(resnet):
    rows = describe_layers(resnet, torch.zeros(1, 3, 224, 224))
    by_path = {r.path: r for r in rows}
    assert [r.path for r in rows[:6]] == [".", "conv1", "bn1", "relu", "maxpool", "layer1"]  # the model first
    assert (rows[0].type, rows[0].output, rows[0].params) == ("ResNet", [1, 1000], 11_689_512)
    assert rows[-1].path == "fc" and by_path["fc"].output == [1, 1000]
    assert by_path["fc"].params == 512 * 1000 + 1000
    assert by_path["layer3"].output == [1, 256, 14, 14]
    assert by_path["layer1.0.relu"].calls == 2
    assert len(rows) == len(list(resnet.named_modules()))
    assert resnet._forward_hooks == {} and not any(m._forward_pre_hooks for m in resnet.modules())


def test_layers_that_never_run_come_last():
    model = nn.Sequential()
    model.add_module("unused", nn.Linear(2, 2))
    model.add_module("used", nn.Identity())
    model.forward = lambda x: model.used(x)
    rows = describe_layers(model, torch.zeros(1, 2))
    assert [(r.path, r.calls, r.output) for r in rows] == [(".", 1, [1, 2]), ("used", 1, [1, 2]), ("unused", 0, None)]


class SharedTwice(torch.nn.Module):
    """One convolution held at two names, run twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 3, 1)
        self.b = self.a
        self.head = torch.nn.Conv2d(3, 2, 1)

    def forward(self, x):
        return self.head(self.b(self.a(x)))


def test_a_module_at_a_second_name_is_refused_naming_its_first():
    with pytest.raises(UnknownLayerError) as raised:
        resolve_layers(SharedTwice(), ["head", "b"])
    assert raised.value.message == "'b' is the module that 'a' is (one module at two names): its calls are all 'a'"
    assert raised.value.hint == "select it as 'a'; its calls are counted apart (a:0, a:1…) where it runs twice"
    assert resolve_layers(SharedTwice(), ["a", "head"]) == {"a": "a", "head": "head"}


def _odd_names() -> nn.Module:
    """A model whose ModuleDict keys hold the characters selectors and stored keys give a meaning to."""
    model = nn.Module()
    model.d = nn.ModuleDict({name: nn.Identity() for name in ("k", "k@grad", "a:1", "p[0]", "q=r", "q")})
    return model


def test_a_path_holding_a_reserved_character_needs_a_key_of_its_own():
    with pytest.raises(UsageProblem) as raised:
        resolve_layers(_odd_names(), ["d.k", "d.k@grad"])
    assert raised.value.message == (
        "layer 'd.k@grad' cannot be stored under its path: '@' in a key marks a call, an input or a gradient "
        "(:, @, # are kept for that)"
    )
    assert raised.value.hint == "select it with a key of its own: 'd.k@grad=NAME'"
    with pytest.raises(UsageProblem, match="layer 'd.a:1' cannot be stored under its path: ':' in a key"):
        resolve_layers(_odd_names(), ["d.a*"])
    assert resolve_layers(_odd_names(), ["d.k", "d.k@grad=kg", "d.a:1=a1"]) == {
        "d.k": "d.k",
        "d.k@grad": "kg",
        "d.a:1": "a1",
    }


def test_an_exact_path_wins_over_a_glob_and_the_last_equals_sign_parts_a_key():
    assert resolve_layers(_odd_names(), ["d.p[0]"]) == {"d.p[0]": "d.p[0]"}
    assert resolve_layers(_odd_names(), ["d.q=r=qr", "d.q=r"]) == {"d.q=r": "qr", "d.q": "r"}
    model = _odd_names()
    del model.d["q"]
    with pytest.raises(UsageProblem) as raised:
        resolve_layers(model, ["d.q=r"])
    assert raised.value.message == (
        "'d.q=r' reads as layer 'd.q' under the key 'r', and the model has no 'd.q' (its layer 'd.q=r' has '=' in its "
        "name)"
    )
    assert raised.value.hint == "select that layer with a key of its own: 'd.q=r=NAME'"


def test_a_key_holds_no_equals_sign_and_a_pattern_over_a_reserved_path_says_how_to_leave_it_out():
    with pytest.raises(UsageProblem) as raised:
        resolve_layers(_odd_names(), ["d.k=a=b"])
    assert raised.value.message == (
        "'d.k=a=b' reads as layer 'd.k=a' under the key 'b' (the last '=' parts a key), and the model has no 'd.k=a'"
    )
    assert raised.value.hint == "a key may not hold '='"
    with pytest.raises(UsageProblem) as raised:
        resolve_layers(_odd_names(), ["d.k*"])
    assert raised.value.hint == (
        "select it with a key of its own: 'd.k@grad=NAME', and the others by paths or a pattern that leaves it out"
    )


def test_a_capture_given_paths_refuses_one_it_cannot_store_under_its_path():
    from hookcli.run.capture import GradientCapture

    with pytest.raises(UsageProblem, match="layer 'd.k@grad' cannot be stored under its path"):
        GradientCapture(_odd_names(), ["d.k", "d.k@grad"])
    assert GradientCapture(_odd_names(), {"d.k": "k", "d.k@grad": "kg"}).layers == {"d.k": "k", "d.k@grad": "kg"}
