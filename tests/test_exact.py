"""Exact float32 wherever a run computes, and the caller's model given back as it was: what a GPU run relies on,
checked here on the CPU (torch's settings are read inside a hook; CUDA's only as settings)."""

import contextlib
import os

import pytest
import torch

import hookcli
from hookcli.errors import UsageProblem
from hookcli.inputs.images import load_rgb
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.transforms import to_tensor_steps, to_transform
from hookcli.models.loading import load_model
from hookcli.run.batches import _Images
from hookcli.run.device import resolve_device
from hookcli.run.speed import _backend, check_precision, float32_math
from hookcli.statistics.layer import LayerStats, StatsChoice
from hookcli.statistics.units import UnitLayout

_PRECISIONS = ("cudnn.conv", "cudnn.rnn", "cuda.matmul", "mkldnn.matmul")


def _per_backend() -> dict:
    """torch's per-backend float32 settings (torch 2.9 on), which hookcli puts back as they were."""
    return {path: _backend(path).fp32_precision for path in _PRECISIONS}


def _in_force() -> dict:
    """What float32 math a forward gets, read through the switches torch.compile and most code read."""
    backends = torch.backends
    return {
        "conv tf32": backends.cudnn.allow_tf32,
        "matmul": torch.get_float32_matmul_precision(),
        "deterministic": backends.cudnn.deterministic,
        "benchmark": backends.cudnn.benchmark,
    }


@pytest.fixture
def loose_settings():
    """torch set as a speed-minded caller sets it, mixing the per-backend settings (TF32 for convolutions, not
    for cuDNN's RNNs, bf16 for the CPU's matrix products) and benchmarking cuDNN; put back afterwards."""
    before, benchmark = _per_backend(), torch.backends.cudnn.benchmark
    mixed = {"cudnn.conv": "tf32", "cudnn.rnn": "ieee", "cuda.matmul": "tf32", "mkldnn.matmul": "bf16"}
    for path, value in mixed.items():
        _backend(path).fp32_precision = value
    torch.backends.cudnn.benchmark = True
    yield mixed
    for path, value in before.items():
        _backend(path).fp32_precision = value
    torch.backends.cudnn.benchmark = benchmark


def test_fp32_runs_without_tf32_and_deterministically_then_puts_torch_back(loose_settings, photo):
    loaded = load_model("resnet18", "none")
    seen = []
    handle = loaded.module.layer1.register_forward_hook(lambda *args: seen.append(_in_force()))
    hookcli.extract(loaded, "layer2", [photo], precision="fp32")
    handle.remove()
    assert seen == [{"conv tf32": False, "matmul": "highest", "deterministic": True, "benchmark": False}]
    assert _per_backend() == loose_settings and torch.backends.cudnn.benchmark


def test_cuda_fp32_takes_deterministic_algorithms_for_the_run_only(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    with float32_math("fp32", torch.device("cuda")):
        inside = torch.are_deterministic_algorithms_enabled(), os.environ["CUBLAS_WORKSPACE_CONFIG"]
    assert inside == (True, ":4096:8")
    assert not torch.are_deterministic_algorithms_enabled()
    with float32_math("fp32", torch.device("cpu")):  # the CPU's kernels are deterministic as they are
        assert not torch.are_deterministic_algorithms_enabled()


def _attention_kernels() -> tuple[bool, bool, bool]:
    cuda = torch.backends.cuda
    return cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()


def test_cuda_fp32_gradients_take_attentions_math_kernel_whose_backward_is_deterministic():
    before = _attention_kernels()
    assert before == (True, True, True)
    with float32_math("fp32", torch.device("cuda"), backward=True):
        assert _attention_kernels() == (False, False, True)
    for fused_kept in (
        float32_math("fp32", torch.device("cuda")),  # a forward alone: the fused kernels' forwards are deterministic
        float32_math("tf32", torch.device("cuda"), backward=True),
        float32_math("fp32", torch.device("cpu"), backward=True),
    ):
        with fused_kept:
            assert _attention_kernels() == before
    assert _attention_kernels() == before


def test_the_gradient_commands_forward_asks_for_the_math_of_a_backward(monkeypatch, photo):
    from hookcli.run import gradients

    asked = []

    def recorded(precision, device, **keywords):
        asked.append((precision, device.type, keywords))
        return contextlib.nullcontext()

    monkeypatch.setattr(gradients, "compute_precision", recorded)
    hookcli.grad(load_model("resnet18", "none"), "layer4", [photo])
    assert asked == [("fp32", "cpu", {"backward": True})]


def test_tf32_is_asked_for_and_only_on_nvidia_gpus(loose_settings):
    with float32_math("tf32", torch.device("cuda")):
        inside = _in_force()
    assert inside == {"conv tf32": True, "matmul": "high", "deterministic": False, "benchmark": True}
    assert _per_backend() == loose_settings
    with pytest.raises(UsageProblem) as refused:
        check_precision("tf32", torch.device("cpu"))
    assert (refused.value.message, refused.value.hint) == (
        "tf32 is the tensor cores' float32 of NVIDIA GPUs, and this run computes on cpu",
        "use --precision fp32 (exact) or bf16",
    )


def test_the_callers_model_comes_back_as_it_was_given(photo):
    loaded = load_model("resnet18", "none")
    module = loaded.module.train()
    module.layer1.requires_grad_(False)
    module.unused = torch.nn.Linear(2, 2, dtype=torch.float64)  # a dtype of the caller's own, which .to() keeps
    calls = []
    module.layer2.register_forward_hook(lambda *args: calls.append(1))
    pointers = {name: tensor.data_ptr() for name, tensor in module.state_dict(keep_vars=True).items()}
    hookcli.extract(loaded, "layer1", [photo], memory_format="channels_last")
    assert {name: tensor.data_ptr() for name, tensor in module.state_dict(keep_vars=True).items()} == pointers
    assert module.conv1.weight.is_contiguous() and not module.conv1.weight.is_contiguous(
        memory_format=torch.channels_last
    )
    assert module.training and module.layer1[0].bn1.training
    assert not module.layer1[0].conv1.weight.requires_grad and module.conv1.weight.requires_grad
    assert module.unused.weight.dtype == torch.float64
    assert len(module.layer2._forward_hooks) == 1 and not module.layer1._forward_hooks
    assert calls == [1], "the caller's hook ran (the first forward runs whole), and is still there"


def test_auto_runs_a_callers_model_where_it_sits():
    on_meta = torch.nn.Linear(2, 2, device="meta")
    assert resolve_device("auto", on_meta) == torch.device("meta")
    best = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("auto", torch.nn.Linear(2, 2)) == best  # a model on the CPU goes where auto goes
    assert resolve_device("cpu", on_meta) == torch.device("cpu")


@pytest.mark.parametrize(
    "preprocess",
    [
        Preprocess(resize=40, crop=32),
        Preprocess(resize=36, crop=None, kind="segmentation", interpolation="bicubic"),
        Preprocess(resize=None, crop=None, mean=None, std=None, kind="detection"),
    ],
    ids=["classification", "segmentation", "detection"],
)
def test_uint8_rows_scaled_on_the_device_are_the_presets_floats(preprocess, photo, make_image, tmp_path):
    paths = [photo, make_image(tmp_path / "noise.png", size=(50, 41))]
    images = _Images(paths, preprocess, uint8=True)
    steps, whole = to_tensor_steps(preprocess), to_transform(preprocess)
    for index, path in enumerate(paths):
        _, row, failure, _ = images[index]
        assert failure is None and row.dtype == torch.uint8
        assert torch.equal(steps.scaled(row[None])[0], whole(load_rgb(path)))


def test_a_run_whose_workers_hand_over_uint8_writes_what_a_cpu_run_writes(monkeypatch, photo, make_image, tmp_path):
    paths = [photo, *(make_image(tmp_path / f"{i}.png", size=(60, 50), seed=i) for i in range(3))]
    options = {"weights": "none", "batch_size": 2, "workers": 1, "device": "cpu"}
    plain = hookcli.extract("resnet18", ["layer1", "fc"], paths, **options)
    asked = []
    monkeypatch.setattr("hookcli.run.batches.scaled_on_device", lambda settings: not asked.append(1))  # as on a GPU
    shipped = hookcli.extract("resnet18", ["layer1", "fc"], paths, **options)
    assert len(asked) == 2  # the loader's dataset and the batches' finishing
    assert all(torch.equal(shipped[key], plain[key]) for key in ("layer1", "fc"))


def _layer_after(batches, layout) -> dict:
    stats = LayerStats(layout, StatsChoice(top=3, top_by="max", quantiles=(0.1, 0.5, 0.99), pca=True), seed=7)
    for number, rows in enumerate(batches):
        stats.update(rows, torch.arange(number * len(rows), (number + 1) * len(rows)))
    return {**stats.state(), **{f"result.{k}": v for k, v in stats.result(torch.arange(100)).items()}}


def test_torchs_sort_path_of_the_statistics_equals_numpys_on_the_cpu(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 6, 32, 32, generator=generator).relu_() for _ in range(6)]  # zeros, ties
    batches[2][0, 1, 2, 2] = float("nan")
    batches[3][:, 4] = 1.5  # a constant channel
    layout = UnitLayout.of((6, 32, 32))
    by_numpy = _layer_after(batches, layout)
    monkeypatch.setattr("hookcli.statistics.units.numpy_sorts", lambda: False)  # as on a GPU
    by_torch = _layer_after(batches, layout)
    assert by_numpy.keys() == by_torch.keys() and "sketch.level1" in by_numpy  # compacted at least once
    different = [key for key in by_numpy if not torch.equal(by_numpy[key].nan_to_num(-9), by_torch[key].nan_to_num(-9))]
    assert different == []


def test_fast_decode_resizes_the_window_the_crop_keeps_within_a_level(tmp_path):
    from PIL import Image

    photos = []
    for number, size in enumerate([(500, 375), (375, 500), (333, 500), (640, 427)]):
        noise = torch.Generator().manual_seed(number)
        pixels = torch.randint(0, 256, (size[1] // 8, size[0] // 8, 3), generator=noise, dtype=torch.uint8)
        path = tmp_path / f"{number}.jpg"
        Image.fromarray(pixels.numpy()).resize(size, Image.Resampling.BICUBIC).save(path, quality=90)
        photos.append(path)
    for interpolation in ("bilinear", "bicubic"):
        exact = Preprocess(resize=232, crop=224, interpolation=interpolation)
        fast = to_transform(exact.replace(fast_decode=True))
        for path in photos:
            image = load_rgb(path)
            levels = (fast(image) - to_transform(exact)(image)).mul(torch.tensor(exact.std).view(3, 1, 1)).mul(255)
            assert levels.shape == (3, 224, 224)
            assert levels.abs().max() <= 1.0001 and levels.abs().gt(0.5).float().mean() < 0.005


def test_a_gpu_run_decodes_with_a_worker_for_each_spare_core_it_may_use(monkeypatch):
    from hookcli.run.settings import GPU_WORKERS, default_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))  # a Slurm task given 6 of 64 cores
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    cuda = torch.device("cuda")
    assert (default_workers(cuda, 1000, 256), default_workers(cuda, 256, 256)) == (5, 0)
    assert default_workers(torch.device("cpu"), 1000, 256) == 1  # the task's 6 cores, not the machine's 64
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    assert default_workers(torch.device("cpu"), 1000, 256) == 0  # the model's threads take the 4 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert default_workers(cuda, 1000, 256) == GPU_WORKERS == 16
    assert default_workers(torch.device("cpu"), 1000, 256) == 4  # a quarter of the cores, at most 4


def test_a_model_run_twice_at_once_comes_back_once_with_its_gradients():
    from hookcli.run.forwards import given_back

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2)).train()
    net[0].weight.grad = torch.ones_like(net[0].weight)
    grad, weight = net[0].weight.grad, net[0].weight.data_ptr()
    first, second = given_back(net), given_back(net)  # two sides of one comparison, the first ending first
    first.__enter__()
    net.to(torch.float64).eval()
    second.__enter__()
    first.__exit__(None, None, None)
    assert net[0].weight.dtype == torch.float64 and not net.training  # the second still runs it as moved
    second.__exit__(None, None, None)
    assert net[0].weight.data_ptr() == weight and net[0].weight.dtype == torch.float32 and net.training
    assert net[0].weight.grad is grad and grad.dtype == torch.float32 and bool((grad == 1).all())
    with given_back(net):  # a lazy layer is made by the run, and stays made
        net.float()(torch.zeros(1, 3, 5, 5))
    assert net[2].weight.shape == (2, 36) and net(torch.zeros(1, 3, 5, 5)).shape == (1, 2)


def test_only_a_model_handed_in_is_given_back(photo):
    from hookcli.api import plan

    built = plan("extract", "resnet18", "layer1", [str(photo)], weights="none")
    handed = plan("extract", load_model("resnet18", "none"), "layer1", [str(photo)])
    assert (built.loaded.handed_in, handed.loaded.handed_in) == (False, True)


def test_a_batch_shared_memory_has_no_room_for_is_refused_in_one_line_not_waited_for(monkeypatch):
    from hookcli.errors import MemoryLimitError
    from hookcli.inputs.preprocess import Preprocess
    from hookcli.run import batches
    from hookcli.run.settings import RunSettings

    rows = [(0, torch.zeros(3, 4, 4), None, None), (1, torch.ones(3, 4, 4), None, None)]
    assert torch.equal(batches._collate(rows)[1], torch.stack([rows[0][1], rows[1][1]]))  # in this process: as it was
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # in a decode worker
    indices, batch, _, _ = batches._collate(rows)
    assert indices == [0, 1] and batch.is_shared()

    def full(self):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_9_1>: No space left on device (28)")

    monkeypatch.setattr(torch.Tensor, "share_memory_", full)
    indices, batch, _, _ = batches._collate(rows)
    assert batch == batches.NoSharedMemory(
        "unable to allocate shared memory(shm) for file </torch_9_1>: No space left on device (28)"
    )
    settings = RunSettings(preprocess=Preprocess(resize=4, crop=4), device=torch.device("cpu"), batch_size=2)
    with pytest.raises(MemoryLimitError) as refused:
        next(batches.Decoded(iter([(indices, batch, [], {})]), settings, None))
    assert str(refused.value) == (
        "a decode worker could not hand a batch over: shared memory is full (unable to allocate shared memory(shm) "
        "for file </torch_9_1>: No space left on device (28)). Hint: give fewer --workers or a smaller --batch-size, "
        "or /dev/shm more room (a container's --shm-size)"
    )


def test_a_move_that_fails_part_way_gives_every_buffer_back_as_it_was():
    from hookcli.run.forwards import given_back

    net = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3))
    means = [net[0].running_mean, net[1].running_mean]

    def place(module):
        module[0].double()  # the first layer moved, then the move fails
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"), given_back(net, place):
        pass
    assert net[0].running_mean is means[0] and net[1].running_mean is means[1]  # the tensors themselves
    assert net[0].running_mean.dtype == torch.float32 and net[0].weight.dtype == torch.float32
    counter = _Counting()
    count = counter.count
    with given_back(counter, lambda module: module.double()) as placed:  # a move, then a forward writing its buffer
        placed(torch.ones(1))
    assert counter.count is count and count.dtype == torch.float32 and count.tolist() == [1.0]  # what it wrote


class _Counting(torch.nn.Module):
    """Counts its calls in a buffer, written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x
