"""Speed modes: channels-last, autocast precision, compiled forward, thread budget."""

import os

import pytest
import torch
import torchvision
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.run.speed import check_precision, choose_memory_format, thread_budget

ARGS = ["extract", "-m", "resnet18", "-w", "none", "--resize", "64", "--crop", "64", "-b", "2"]


def _read(path):
    with safe_open(str(path), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


def _run(runner, tmp_path, name, *args):
    out = tmp_path / f"{name}.safetensors"
    result = runner.invoke(main, [*ARGS, *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return (*_read(out), result)


def _relative_error(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_memory_format_choice():
    cpu = torch.device("cpu")
    assert choose_memory_format(torchvision.models.resnet18(), cpu) == "channels_last"
    assert choose_memory_format(torchvision.models.vit_b_16(), cpu) == "contiguous"  # one patch convolution
    assert choose_memory_format(torchvision.models.resnet18(), torch.device("mps")) == "contiguous"
    assert choose_memory_format(torchvision.models.resnet18(), cpu, "contiguous") == "contiguous"


def test_bf16_compute_is_recorded_and_close(runner, images, tmp_path):
    paths = list(map(str, images))
    exact, _, _ = _run(runner, tmp_path, "fp32", "-l", "layer3", "-l", "fc", *paths)
    fast, metadata, _ = _run(runner, tmp_path, "bf16", "-l", "layer3", "-l", "fc", "--precision", "bf16", *paths)
    assert metadata["precision"] == "bf16" and metadata["dtype"] == "float32"
    assert fast["layer3"].dtype == torch.float32  # computed in bf16, stored as asked
    for key in ("layer3", "fc"):
        assert 0 < _relative_error(fast[key], exact[key]) < 0.03
    stored, metadata, _ = _run(
        runner, tmp_path, "bf16-stored", "-l", "fc", "--precision", "bf16", "--dtype", "bfloat16", *paths
    )
    assert stored["fc"].dtype == torch.bfloat16


def test_fp16_compute_on_the_cpu_is_refused():
    with pytest.raises(UsageProblem) as caught:
        check_precision("fp16", torch.device("cpu"))
    assert str(caught.value) == "fp16 compute needs a GPU. Hint: use --precision bf16 on the CPU (or fp32)"


def test_fp16_error_through_the_cli(runner, images):
    result = runner.invoke(main, [*ARGS, "-l", "fc", "--precision", "fp16", "--device", "cpu", str(images[0])])
    assert result.exit_code == 2
    assert result.stderr == "Error: fp16 compute needs a GPU. Hint: use --precision bf16 on the CPU (or fp32)\n"


def test_compiled_forward_equals_eager(runner, images, tmp_path):
    paths = list(map(str, images))
    eager, _, _ = _run(runner, tmp_path, "eager", "-l", "layer2.0.bn2", "-l", "avgpool", *paths)
    compiled, _, result = _run(runner, tmp_path, "compiled", "-l", "layer2.0.bn2", "-l", "avgpool", "--compile", *paths)
    assert result.stderr == ""  # no fallback note: the compiled graph ran
    for key in eager:  # bn2 is followed by `out += identity`: the copy in the graph keeps BatchNorm's values
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-5, atol=1e-5)
    assert (compiled["layer2.0.bn2"] < 0).any()


def test_compile_falls_back_with_a_note_where_hooks_are_needed(runner, images, tmp_path):
    tensors, _, result = _run(runner, tmp_path, "fallback", "-l", "layer1.0.relu", "--compile", str(images[0]))
    assert result.stderr == (
        "Note: --compile: layer1.0.relu runs 2 times per forward, which needs hooks; running eagerly\n"
    )
    assert sorted(tensors) == ["layer1.0.relu:0", "layer1.0.relu:1"]
    result = runner.invoke(
        main, ["grad", *ARGS[1:], "-l", "layer4", "--compile", "-o", str(tmp_path / "g.safetensors"), str(images[0])]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == "Note: --compile: gradients need the eager graph with hooks; running eagerly\n"


def test_thread_budget_leaves_the_workers_cores():
    before = torch.get_num_threads()
    with thread_budget(torch.device("cpu"), workers=1):
        assert torch.get_num_threads() == max(1, min(before, len(os.sched_getaffinity(0)) - 1))
    assert torch.get_num_threads() == before
    with thread_budget(torch.device("cpu"), workers=0):
        assert torch.get_num_threads() == before


def test_a_compiled_run_of_a_model_in_training_mode_computes_as_in_eval_and_moves_no_statistic(images):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5), torch.nn.Conv2d(4, 4, 3)
    ).train()
    net[3].eval()  # a mix of modes, each given back
    before = {name: value.clone() for name, value in net.state_dict().items()}
    paths, small = list(map(str, images)), {"resize": 24, "crop": 24, "batch_size": 2}
    compiled = hookcli.extract(net, "2", paths, compile=True, **small)
    assert not [note for note in compiled.notes if "compile" in note]  # the compiled graph ran
    assert all(torch.equal(net.state_dict()[name], value) for name, value in before.items())
    assert [module.training for module in net.modules()] == [True, True, True, True, False]
    eager = hookcli.extract(net, "2", paths, **small)
    torch.testing.assert_close(compiled["2"], eager["2"], rtol=1e-5, atol=1e-6)
