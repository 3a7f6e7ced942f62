"""Strategies chosen by the size of the run: short runs skip what only long ones pay back, with the same values."""

import json

import pytest
import torch
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.inputs.images import load_rgb
from hookcli.inputs.transforms import to_transform
from hookcli.models.loading import load_model
from hookcli.run.capture import COUNTING_FORWARD_FROM
from hookcli.run.forwards import EagerForward, FusedForward
from hookcli.run.pipeline import iter_batches
from hookcli.run.settings import RunSettings
from hookcli.run.speed import FUSE_FROM, resolve_settings, to_memory_format

SMALL = {"resize": 64, "crop": 64}
CPU = {**SMALL, "device": "cpu"}  # fusion is the CPU's (a GPU machine's default device runs unfused)


@pytest.fixture
def many(tmp_path, make_image):
    """FUSE_FROM small noise PNGs: the shortest run that fuses by default."""
    folder = tmp_path / "many"
    folder.mkdir()
    return [make_image(folder / f"{i:02d}.png", seed=i) for i in range(FUSE_FROM)]


@pytest.fixture(scope="module")
def loaded():
    return load_model("resnet18", "none", seed=0)


def _by_hand(loaded, layer, paths, memory_format):
    """The layer's output for ``paths`` as one batch, from a forward hook written by hand."""
    transform = to_transform(loaded.preprocess.replace(**SMALL))
    batch = to_memory_format(torch.stack([transform(load_rgb(p)) for p in paths]), memory_format)
    model = to_memory_format(loaded.module, memory_format)
    grabbed = []
    handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, i, out: grabbed.append(out.clone()))
    try:
        with torch.inference_mode():
            model(batch)
    finally:
        handle.remove()
        model.to(memory_format=torch.contiguous_format)
    return grabbed[0]


def test_a_short_run_runs_the_model_as_written_and_a_long_one_fuses(loaded, images, many):
    short = hookcli.plan("extract", loaded, "layer2", images[:1], **CPU)
    long = hookcli.plan("extract", loaded, "layer2", many, **CPU)
    assert (short.settings.fuse, short.record.fuse, short.forward) == (False, False, EagerForward)
    assert (long.settings.fuse, long.record.fuse, long.forward) == (True, True, FusedForward)
    assert hookcli.plan("extract", loaded, "layer2", many[:-1], **CPU).settings.fuse is False

    one = hookcli.execute(short)
    assert (one.facts.fused, one.metadata["fused"], one.metadata["memory_format"]) == (0, "0", "channels_last")
    assert torch.equal(one["layer2"], _by_hand(loaded, "layer2", images[:1], "channels_last"))

    rows = hookcli.execute(long)
    assert (rows.facts.fused, rows.metadata["fused"]) == (5, "5")  # conv1 and layer1's four; layer2 stays whole
    expected = _by_hand(loaded, "layer2", many, "channels_last")
    difference = (rows["layer2"] - expected).norm() / expected.norm()
    assert 0 < difference < 1e-6  # other kernels, the same values to fp32 rounding
    unfused = hookcli.extract(loaded, "layer2", many, fuse=False, **CPU)
    assert unfused.facts.fused == 0 and torch.equal(unfused["layer2"], expected)


def test_fuse_and_no_fuse_override_the_run_size(loaded, images, many):
    forced = hookcli.plan("extract", loaded, "layer2", images[:1], fuse=True, **CPU)
    refused = hookcli.plan("extract", loaded, "layer2", many, fuse=False, **CPU)
    assert (forced.forward, forced.record.fuse) == (FusedForward, True)
    assert (refused.forward, refused.record.fuse) == (EagerForward, False)
    assert hookcli.execute(forced).metadata["fused"] == "5"
    one = hookcli.extract(loaded, "layer2", images[:1], **CPU)
    fused = hookcli.execute(forced)
    torch.testing.assert_close(fused["layer2"], one["layer2"], rtol=1e-5, atol=1e-5)
    assert not torch.equal(fused["layer2"], one["layer2"])  # fused kernels did run


def test_settings_decide_fusion_from_the_whole_run_also_when_it_resumes(loaded, many):
    assert (RunSettings().fuse, RunSettings().fusing) == (None, False)  # undecided until resolved
    assert resolve_settings(RunSettings(), loaded, FUSE_FROM - 1).fuse is False
    assert resolve_settings(RunSettings(), loaded, FUSE_FROM).fuse is True
    assert resolve_settings(RunSettings(fuse=False), loaded, 1000).fuse is False
    # The last image of a long run, resumed on its own, still runs fused, as the rest of the run did.
    settings = RunSettings(device="cpu", preprocess=loaded.preprocess.replace(**SMALL))
    (batch,) = iter_batches(loaded, {"layer2": "layer2"}, many, settings, order=[[FUSE_FROM - 1]])
    assert (batch.indices, batch.facts.fused) == ([FUSE_FROM - 1], 5)


def test_a_small_first_batch_learns_the_call_counts_from_itself(loaded, images, many):
    seen = []
    handle = loaded.module.fc.register_forward_pre_hook(lambda module, inputs: seen.append(len(inputs[0])))
    try:
        hookcli.extract(loaded, "layer2", images, **SMALL)  # one batch of 3: runs whole, no one-image forward
        few = list(seen)
        seen.clear()
        hookcli.extract(loaded, "layer2", many, batch_size=COUNTING_FORWARD_FROM, **SMALL)
    finally:
        handle.remove()
    assert few == [3]
    assert seen == [1]  # a first batch of 8 learns the counts from one image, and every batch stops at layer2


def test_a_list_read_from_stdin_is_counted_before_the_choice(runner, resnet18_args, many, tmp_path):
    out = tmp_path / "stdin.safetensors"
    result = runner.invoke(
        main,
        resnet18_args("extract", "-l", "layer2", "--resize", "64", "--crop", "64", "--device", "cpu", "-o", str(out))
        + ["-"],
        input="".join(f"{p}\n" for p in many),
    )
    assert result.exit_code == 0, result.output
    with safe_open(str(out), "pt") as handle:
        metadata = handle.metadata()
    assert (metadata["fused"], len(json.loads(metadata["inputs"]))) == ("5", FUSE_FROM)


def test_the_help_states_the_rule(runner):
    result = runner.invoke(main, ["extract", "--help"])
    assert f"Default: fuse runs of {FUSE_FROM} images or more" in " ".join(result.output.split())
