"""A request's refusals come in one order, before any model is built: the options' values (ranges, choices, layer
selectors), then what the model's family and the command refuse, then the output."""

import numpy as np
import pytest
from PIL import Image

import hookcli
from hookcli.errors import UsageProblem


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.zeros((20, 24, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(autouse=True)
def _no_model_is_built(monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("a refusal came after the model was built")

    monkeypatch.setattr("hookcli.models.loading.build_model", built)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (  # a value out of range before the command's own advice on it
            lambda photo: hookcli.patch("resnet18", "layer1", pairs_from=(photo.parent, photo.parent), batch_size=-1),
            "batch_size must be a whole number of at least 1, not -1",
        ),
        (  # a choice that is none before what the command says of it
            lambda photo: hookcli.extract("resnet18", "layer1", photo, attention="bogus"),
            "attention must be one of all, class, mean, class-mean, not 'bogus'",
        ),
        (  # a layer selector that is none before the output
            lambda photo: hookcli.stats("resnet18", "", photo, output="-"),
            "empty layer selector ''",
        ),
        (  # a region that is none with the family's other options
            lambda photo: hookcli.grad("fcn_resnet50", "backbone.layer1", photo, region="bad", clip_length=4),
            "region 'bad' is not x0,y0,x1,y1 with fractions of the image from 0 to 1, x0 < x1 and y0 < y1",
        ),
        (  # cam's colour map, before the model is built
            lambda photo: hookcli.cam("resnet18", photo, cmap="nope"),
            "unknown colormap 'nope' (closest: copper, copper_r, bone)",
        ),
        (  # how to compare, before what to compare
            lambda photo: hookcli.compare(method="bogus"),
            "method must be one of linear-cka, minibatch-cka, rsa, not 'bogus'",
        ),
    ],
    ids=["range", "choice", "selector", "region", "cmap", "method"],
)
def test_the_first_refusal_is_of_the_options_values_and_comes_before_any_model_is_built(photo, call, message):
    with pytest.raises(UsageProblem) as refused:
        call(photo)
    assert refused.value.message == message
