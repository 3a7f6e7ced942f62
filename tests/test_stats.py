"""hookcli stats: each accumulator against a direct computation in float64 numpy, a run's statistics against a
brute-force pass over the features it would save, and the same file from one process, parts, torchrun and a run
killed and continued."""

import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import hookcli
from hookcli.cli import main
from hookcli.errors import CaptureError, OutputExistsError
from hookcli.events import Note
from hookcli.files import hold_output, release_output, share_output
from hookcli.run.launch import Part, cpu_threads
from hookcli.run.settings import Batch
from hookcli.statistics.channel_stats import StatsGathering
from hookcli.statistics.covariance import Covariance, principal_components
from hookcli.statistics.examples import TopExamples
from hookcli.statistics.layer import StatsChoice
from hookcli.statistics.moments import Moments
from hookcli.statistics.sketch import QuantileSketch
from hookcli.statistics.units import UnitBatch, UnitLayout
from hookcli.storage.features import Features
from hookcli.storage.fileformat import RunRecord, parts_folder
from hookcli.storage.gathering_writer import GatheringWriter
from hookcli.storage.index import read_index
from hookcli.storage.shards import open_features

MODEL = ["-m", "resnet18", "-w", "none", "--resize", "40", "--crop", "32", "-q"]


def _batches(values: np.ndarray, sizes):
    """``values`` ``[n, C, P]`` in batches of the given sizes, as unit batches of maps ``[n, C, 1, P]``."""
    start = 0
    for size in sizes:
        part = torch.from_numpy(values[start : start + size])
        layout = UnitLayout.of((values.shape[1], 1, values.shape[2]))
        yield UnitBatch(part[:, :, None, :], torch.arange(start, start + len(part)), layout)
        start += size


# -- the accumulators -------------------------------------------------------------------------------------------


def test_moments_covariance_and_components_equal_numpy_in_float64():
    rng = np.random.default_rng(0)
    # A large mean over a small spread: a running sum of squares would lose the variance to cancellation.
    values = (1e4 + rng.normal(size=(300, 6, 5)) * np.array([1, 2, 3, 0.5, 1e-3, 7])[None, :, None]).astype(np.float32)
    values[:, 3, ::2] = 0
    values[:, 2] += rng.normal(size=(300, 1)).astype(np.float32) * 3  # a channel that moves with the others
    first, second = Moments(6), Moments(6)
    covariance, later = Covariance(6), Covariance(6)
    for number, batch in enumerate(_batches(values, [7, 1, 50, 42, 100, 100])):
        (first if number < 3 else second).update(batch)
        (covariance if number < 3 else later).update(batch)
    first.merge(Moments.from_state(second.state()))
    covariance.merge(Covariance.from_state(later.state()))
    every = values.transpose(1, 0, 2).reshape(6, -1).astype(np.float64)
    assert first.count == 1500
    np.testing.assert_allclose(first.mean.numpy(), every.mean(axis=1), rtol=1e-9)
    np.testing.assert_allclose(first.std.numpy(), every.std(axis=1), rtol=1e-9)
    assert first.min.tolist() == every.min(axis=1).tolist() and first.max.tolist() == every.max(axis=1).tolist()
    assert first.zeros.tolist() == [0, 0, 0, 0.6, 0, 0]
    pooled = values.astype(np.float64).mean(axis=2)
    expected = np.cov(pooled, rowvar=False)
    np.testing.assert_allclose(covariance.matrix.numpy(), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    eigenvalues, eigenvectors = principal_components(covariance.matrix)
    reference_values, reference_vectors = np.linalg.eigh(expected)
    reference_values, reference_vectors = reference_values[::-1], reference_vectors[:, ::-1]
    kept = reference_values > 1e-6 * reference_values[0]
    np.testing.assert_allclose(eigenvalues.numpy()[kept], reference_values[kept], rtol=1e-7)
    dots = np.abs(np.sum(eigenvectors.numpy()[:, kept] * reference_vectors[:, kept], axis=0))
    np.testing.assert_allclose(dots, 1, atol=1e-7)
    assert (eigenvalues[:-1] >= eigenvalues[1:]).all()
    largest = eigenvectors.abs().argmax(dim=0)
    assert (eigenvectors.gather(0, largest[None]) > 0).all()  # each vector signed by its largest component


def test_components_of_fewer_inputs_than_channels_come_from_the_rows_and_equal_the_eigendecomposition():
    rng = np.random.default_rng(4)
    channels = 48  # rows are kept up to a third of that: 16
    values = (rng.normal(size=(17, channels, 3)) * np.linspace(0.5, 3, channels)[None, :, None]).astype(np.float32)
    values[:, 7] = 1.5  # a constant channel: a direction of no variance
    first, second = Covariance(channels), Covariance(channels)
    for number, batch in enumerate(_batches(values[:12], [5, 3, 4])):
        (first if number < 2 else second).update(batch)
    first.merge(Covariance.from_state(second.state()))
    assert first.rows is not None and first.rows.shape == (12, channels) and sorted(first.state()) == ["count", "rows"]
    np.testing.assert_allclose(first.matrix.numpy(), np.cov(values[:12].astype(np.float64).mean(axis=2), rowvar=False),
                               rtol=1e-9, atol=1e-12)  # fmt: skip
    pooled = values[:12].astype(np.float64).mean(axis=2)
    expected = np.cov(pooled, rowvar=False)
    eigenvalues, eigenvectors = first.components()
    reference_values, reference_vectors = np.linalg.eigh(expected)
    reference_values, reference_vectors = reference_values[::-1], reference_vectors[:, ::-1]
    kept = reference_values > 1e-6 * reference_values[0]
    assert kept.sum() == 11  # 12 rows about their mean
    np.testing.assert_allclose(eigenvalues.numpy()[kept], reference_values[kept], rtol=1e-7)
    dots = np.abs(np.sum(eigenvectors.numpy()[:, kept] * reference_vectors[:, kept], axis=0))
    np.testing.assert_allclose(dots, 1, atol=1e-7)
    assert (eigenvalues[12:] == 0).all() and (eigenvalues[:-1] >= eigenvalues[1:]).all()
    np.testing.assert_allclose(eigenvectors.T @ eigenvectors, np.eye(channels), atol=1e-12)  # completed: a basis
    largest = eigenvectors.abs().argmax(dim=0)
    assert (eigenvectors.gather(0, largest[None]) > 0).all()
    # Past a third of the channels the rows go, and the components come from the matrix.
    for batch in _batches(values[12:], [5]):
        first.update(batch)
    assert first.rows is None and sorted(first.state()) == ["comoment", "count", "mean"] and first.count == 17
    assert Covariance.from_state(first.state()).rows is None
    whole = np.cov(values.astype(np.float64).mean(axis=2), rowvar=False)
    np.testing.assert_allclose(first.matrix.numpy(), whole, rtol=1e-9, atol=1e-12)
    values_then, _ = first.components()
    np.testing.assert_allclose(values_then[:16].numpy(), np.linalg.eigvalsh(first.matrix.numpy())[::-1][:16], rtol=1e-9)


def test_components_of_values_with_nan_are_nan_rather_than_an_error():
    rows = torch.randn(6, 8, dtype=torch.float64)
    rows[1, 3] = float("nan")
    for count in (2, 6):  # from the rows kept, and from the matrix
        covariance = Covariance(8)
        covariance.update(UnitBatch(rows[:count], torch.arange(count), UnitLayout.of((8,))))
        values, vectors = covariance.components()
        assert values.isnan().all() and vectors.isnan().all() and vectors.shape == (8, 8)


def test_quantiles_place_nan_last_and_infinities_at_the_ends():
    values = np.array(
        [
            [np.nan, 3, 1, np.nan, 2, 5, 4, 0, 6, 7],
            [np.inf, -np.inf, 0, 1, 2, 3, 4, 5, 6, -0.0],
            [np.nan] * 10,
            [0, 0, 0, 0, 0, 0, 1, 2, 3, 4],  # a ReLU's: its median is zero, and plus zero
        ],
        dtype=np.float32,
    )
    sketch = QuantileSketch(4)
    sketch.update(next(_batches(values.T[:, :, None], [10])))
    found = sketch.quantiles([0.05, 0.3, 0.8, 0.81, 1.0])
    assert found[0].tolist()[:3] == [0.0, 2.0, 7.0] and found[0, 3:].isnan().all()
    assert found[1].tolist() == [-np.inf, 0.0, 5.0, 6.0, np.inf]  # the smallest value whose rank reaches the level
    assert found[2].isnan().all()
    assert found[3].tolist() == [0.0, 0.0, 2.0, 3.0, 4.0] and str(found[3, 1].item()) == "0.0"


def _rank_error(values: np.ndarray, found: float, level: float) -> float:
    """How far ``found``'s ranks lie from ``level × n``, as a share of ``n`` (0 when a rank of it is there)."""
    below, at_most = np.count_nonzero(values < found), np.count_nonzero(values <= found)
    wanted = level * len(values)
    return max(0.0, below - wanted, wanted - at_most) / len(values)


LEVELS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.995, 0.999, 1.0]


def test_the_quantile_sketch_stays_within_its_rank_error_on_adversarial_channels():
    rng = np.random.default_rng(1)
    count = 400_000
    normal = rng.normal(size=count)
    outlier = rng.normal(size=count)
    outlier[count // 3] = 1e30
    relu = np.maximum(rng.normal(size=count), 0)
    channels = np.stack(
        [
            normal,
            np.sort(normal),  # sorted: the worst case for a compactor that always keeps the same half
            np.sort(normal)[::-1],
            np.full(count, 2.5),  # constant
            np.zeros(count),
            rng.integers(0, 5, size=count).astype(np.float64),  # heavy ties
            outlier,
            relu,  # half exact zeros
        ]
    ).astype(np.float32)
    sketch = QuantileSketch(len(channels), seed=7)
    for start in range(0, count, 3136):  # 16 images of 14 x 14 positions a batch
        piece = torch.from_numpy(channels[:, start : start + 3136]).T[:, :, None, None]
        sketch.update(UnitBatch(piece, torch.zeros(len(piece)), UnitLayout.of((len(channels), 1, 1))))
    assert sketch.count == count and sketch.size <= 3 * sketch.k + 2 * 16
    found = sketch.quantiles(LEVELS)
    errors = [
        _rank_error(channels[c], float(found[c, q]), level)
        for c in range(len(channels))
        for q, level in enumerate(LEVELS)
    ]
    assert max(errors) <= 1e-3, max(errors)
    assert found[3].tolist() == [2.5] * len(LEVELS) and found[4].tolist() == [0.0] * len(LEVELS)


def test_the_sketch_is_exact_until_it_compacts_and_the_same_for_the_same_batches():
    values = np.arange(1000, dtype=np.float32)[::-1].copy().reshape(1, 1, 1000)
    one, two = QuantileSketch(1, seed=3), QuantileSketch(1, seed=3)
    for sketch in (one, two):
        for batch in _batches(values.repeat(50, axis=0), [20, 30]):  # 50,000 values: several compactions
            sketch.update(batch)
    assert all(np.array_equal(a, b) for a, b in zip(one.levels, two.levels)) and one.compactions > 0
    small = QuantileSketch(1)
    small.update(next(_batches(values, [1])))
    assert small.quantiles([0.0, 0.5, 0.999, 1.0]).tolist() == [[0.0, 499.0, 998.0, 999.0]]


@pytest.mark.parametrize("by", ["max", "mean"])
def test_top_examples_equal_a_sort_of_every_input_with_ties_to_the_lower_input(by):
    rng = np.random.default_rng(2)
    maps = rng.integers(0, 4, size=(40, 3, 2, 3)).astype(np.float32)  # few values: many ties
    top = TopExamples(3, 5, positions=6, by=by)
    for start, size in [(0, 7), (7, 13), (20, 20)]:
        part = torch.from_numpy(maps[start : start + size])
        top.update(UnitBatch(part, torch.arange(start, start + size), UnitLayout.of((3, 2, 3))))
    flat = maps.reshape(40, 3, 6)
    scores = flat.max(axis=2) if by == "max" else flat.astype(np.float64).mean(axis=2).astype(np.float32)
    for channel in range(3):
        order = np.lexsort((np.arange(40), -scores[:, channel]))[:5]
        assert top.rows[channel].tolist() == order.tolist()
        assert top.values[channel].tolist() == scores[order, channel].tolist()
        assert top.at[channel].tolist() == flat[order, channel].argmax(axis=1).tolist()
        assert np.array_equal(top.maps[channel].numpy(), flat[order, channel])


def test_units_of_tokens_vectors_channels_last_and_clips():
    assert UnitLayout.of((197, 768), prefix_tokens=1).spatial == (196,)
    assert UnitLayout.of((5 + 49, 32), prefix_tokens=5).skip == 5
    assert UnitLayout.of((50, 8)).skip == 1  # no count given: a class token before a square of patches
    assert (UnitLayout.of((11, 8)).skip, UnitLayout.of((11, 8)).spatial) == (0, (11,))  # no square: every token
    # The model's own count decides, whatever the shape suggests: a class token before 4x6 patches (25 tokens, a
    # square), 17 patches of a model without one, a class token and 4 registers before 12 patches.
    assert [UnitLayout.of((tokens, 8), prefix_tokens=said).skip for tokens, said in [(25, 1), (17, 0), (17, 5)]] == [
        1,
        0,
        5,
    ]
    assert UnitLayout.of((17, 8), prefix_tokens=17).skip == 1  # not the model's tokens: read by their shape
    rows = torch.arange(2 * 4 * 4 * 3, dtype=torch.float32).reshape(2, 4, 4, 3)
    last = UnitLayout.of((4, 4, 3), channels_last=True)
    assert last.kind == "channels_last" and torch.equal(last.units(rows)[1, 2], rows[1, :, :, 2].reshape(-1))
    assert UnitLayout.of((4, 4, 3)).channels == 4  # without square inputs, channels come first
    assert UnitLayout.of((8, 4, 7, 7)).spatial == (4, 7, 7) and UnitLayout.of((1000,)).positions == 1
    with pytest.raises(CaptureError, match=r"'x' has rows of shape \[2, 3, 4, 5, 6\]: statistics need channels"):
        UnitLayout.of((2, 3, 4, 5, 6), key="x")


def _in_memory(inputs: list[str], choice: StatsChoice, notes: list[str] | None = None) -> GatheringWriter:
    """A statistics writer in memory over ``inputs``, begun, for batches of key ``x``."""
    record = RunRecord(
        model="m", weights={}, layers={"x": "x"}, layer_types={"x": "Conv2d"}, capture="output", preprocess={},
        pool="none", dtype="float32", precision="fp32", memory_format="contiguous", fuse=False, device="cpu",
        on_error="fail", shard_size=None, inputs=tuple(inputs), command={},
    )  # fmt: skip
    on_note = notes.append if notes is not None else None
    writer = GatheringWriter(record, inputs, None, StatsGathering(choice), on_note=on_note)
    list(writer.begin(len(inputs)))
    return writer


def test_rows_of_their_own_shapes_are_refused_with_one_line():
    writer = _in_memory(["a", "b"], StatsChoice())
    batch = Batch([0, 1], {"x": [torch.zeros(3, 4, 4), torch.zeros(3, 5, 4)]}, [], None, None)
    writer.add(batch)  # gathered on a thread of its own: what fails there is raised by the next call
    with pytest.raises(CaptureError, match="'x' has rows of their own shapes"):
        writer.finish()


def test_examples_tied_at_a_ceiling_are_named_in_a_note():
    rows = torch.arange(3 * 3 * 4.0).reshape(3, 3, 2, 2)
    rows[:, 0] = rows[:, 0].clamp(max=6)  # channel 0: inputs 1 and 2 reach 6 (a ReLU6), 2 over less of its map
    rows[2, 0, 1] = 5
    rows[:, 1] = 0  # a channel with nothing but zeros ties too, and is no ceiling
    said: dict[str, list[str]] = {}
    for top_by in ("max", "mean"):
        writer = _in_memory(["a", "b", "c"], StatsChoice(top=2, top_by=top_by), said.setdefault(top_by, []))
        writer.add(Batch([0, 1, 2], {"x": rows}, [], None, None))
        assert writer.finish()["x@top_rows"][0].tolist() == [1, 2]
    assert said == {
        "max": [
            "'x': the 2 examples of 1 of its 3 channels tie at their largest value (an activation's ceiling, as "
            "ReLU6's): they are the first inputs to reach it; --top-by mean ranks them by their maps' means"
        ],
        "mean": [],
    }
    gradients: list[str] = []  # a gradient ties at its largest value too, and has no ceiling to blame
    writer = _in_memory(["a", "b", "c"], StatsChoice(top=2), gradients)
    writer.add(Batch([0, 1, 2], {"x@grad": rows}, [], None, None))
    writer.finish()
    assert gradients == [
        "'x@grad': the 2 examples of 1 of its 3 channels tie at their largest value: they are the first inputs to "
        "reach it; --top-by mean ranks them by their maps' means"
    ]


# -- runs ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path, make_image):
    folder = tmp_path / "imgs"
    folder.mkdir()
    return [str(make_image(folder / f"{i:02d}.png", size=(44, 40), seed=i)) for i in range(10)]


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_the_parts_of_a_gpu_run_merge_on_its_gpu_where_the_gathering_keeps_sums_there(tmp_path, inputs, monkeypatch):
    from hookcli.storage import gathering_writer, parts

    cpu, gpu, stats = torch.device("cpu"), torch.device("cuda:1"), StatsGathering(StatsChoice())
    assert [parts.merge_device(device, stats) for device in (None, cpu, torch.device("mps"))] == [cpu, cpu, cpu]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parts.merge_device(gpu, stats) == cpu  # a file's parts merged where there is no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parts.merge_device(gpu, stats) == gpu  # the run's own GPU, not the first
    asked, read_part = [], parts._read_part

    def reading(name, number, size, count, gathering, device):  # a GPU's merge, done on the CPU here
        asked.append(device.type)
        return read_part(name, number, size, count, gathering, cpu)

    monkeypatch.setattr(parts, "_read_part", reading)
    monkeypatch.setattr(gathering_writer, "merge_device", lambda _, gathering: parts.merge_device(gpu, gathering))
    # The last block of shards first: this process's parts are not made in order, so they are read back to merge.
    options = {"weights": "none", "resize": 40, "crop": 32, "batch_size": 4, "shard_size": 4, "device": "cpu",
               "part": "3/3"}  # fmt: skip
    hookcli.stats("resnet18", "layer4", inputs, output=tmp_path / "s.safetensors", **options)
    hookcli.compare("resnet18", "layer4", inputs, output=tmp_path / "c.safetensors", **options)
    hookcli.compare("resnet18", "layer4", inputs, output=tmp_path / "r.safetensors", method="rsa", **options)
    assert asked == ["cuda"] * 3 + ["cuda"] * 3 + ["cpu"] * 3  # 10 inputs, 3 shards each; RSA keeps rows on the CPU

    def short_of_memory(name, number, size, count, gathering, device):
        if device.type == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        return read_part(name, number, size, count, gathering, device)

    monkeypatch.setattr(parts, "_read_part", short_of_memory)
    notes = []
    out = tmp_path / "again.safetensors"
    hookcli.stats("resnet18", "layer4", inputs, output=out, progress=lambda event: notes.append(event), **options)
    said = [event.text for event in notes if isinstance(event, Note)]
    assert said == [f"cuda:1 ran out of memory merging the parts of '{out}': they merged on the CPU"]
    assert _digest(out) == _digest(tmp_path / "s.safetensors")  # whole parts, merged all the same


@pytest.mark.parametrize("method", [None, "linear-cka", "rsa"])
def test_a_process_that_made_every_part_in_order_merges_them_as_written(tmp_path, inputs, monkeypatch, method):
    from hookcli.storage import gathering_writer, parts

    monkeypatch.setattr(gathering_writer, "room_to_fold", lambda state, device: True)  # as on a GPU with room
    read = []
    read_part = parts._read_part
    monkeypatch.setattr(parts, "_read_part", lambda name, *rest: read.append(name.name) or read_part(name, *rest))
    options = {"weights": "none", "resize": 40, "crop": 32, "batch_size": 4, "shard_size": 4, "device": "cpu"}
    run = hookcli.stats if method is None else functools.partial(hookcli.compare, method=method)
    run("resnet18", "layer4", inputs, output=tmp_path / "whole.safetensors", **options)
    assert read == []  # merged in memory as each part was written
    for part in ("1/3", "2/3"):  # a run shared with others (here, never started), in order or not: read back
        read.clear()
        run("resnet18", "layer4", inputs, output=tmp_path / f"{part[0]}.safetensors", part=part, **options)
        assert len(read) == 3
        assert _digest(tmp_path / "whole.safetensors") == _digest(tmp_path / f"{part[0]}.safetensors")


def test_parts_that_run_out_of_memory_merging_as_written_are_read_back_instead(tmp_path, inputs, monkeypatch):
    from hookcli.storage import gathering_writer, parts

    read, made = [], []
    read_part, part_of = parts._read_part, gathering_writer.part_of
    monkeypatch.setattr(parts, "_read_part", lambda name, *rest: read.append(name.name) or read_part(name, *rest))

    def short_of_memory(number, *rest):
        made.append(number)
        if number == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        return part_of(number, *rest)

    monkeypatch.setattr(gathering_writer, "part_of", short_of_memory)
    monkeypatch.setattr(gathering_writer, "room_to_fold", lambda state, device: True)  # as on a GPU with room
    options = {"weights": "none", "resize": 40, "crop": 32, "batch_size": 4, "shard_size": 4, "device": "cpu"}
    hookcli.stats("resnet18", "layer4", inputs, output=tmp_path / "s.safetensors", **options)
    assert made == [0, 1] and len(read) == 3  # the merge in memory given up at the second part: all read back
    monkeypatch.undo()
    hookcli.stats("resnet18", "layer4", inputs, output=tmp_path / "again.safetensors", **options)
    assert _digest(tmp_path / "s.safetensors") == _digest(tmp_path / "again.safetensors")


def test_parts_merge_as_written_only_on_a_gpu_that_has_room_for_them(monkeypatch):
    from hookcli.storage.gathering_writer import room_to_fold

    state = {"comoment": torch.zeros(1024, 1024, dtype=torch.float64), "count": torch.tensor(3)}  # 8 MiB and 8 bytes
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (64 * 2**20 + 64, 80 * 2**30))
    assert room_to_fold(state, torch.device("cuda:0"))  # twice 8 MiB in a quarter of 64 MiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (64 * 2**20, 80 * 2**30))
    assert not room_to_fold(state, torch.device("cuda:0"))
    assert not room_to_fold(state, torch.device("cpu"))  # read back there, for the run's peak memory


def test_a_run_equals_brute_force_over_the_features_it_would_save(runner, tmp_path, inputs):
    common = [*MODEL, "-b", "3", "--shard-size", "4", "--device", "cpu"]  # a GPU's sums agree to rounding only
    done = runner.invoke(main, ["extract", *common, "-l", "layer3", "-l", "fc", "-o", f"{tmp_path}/feats/", *inputs])
    assert done.exit_code == 0, done.output
    out = tmp_path / "s.safetensors"
    asked = [*common, "-l", "layer3", "-l", "fc", "--top", "4", "--quantiles", "0,0.5,0.99,1"]
    done = runner.invoke(main, ["stats", *asked, "-o", str(out), *inputs])
    assert done.exit_code == 0, done.output
    assert done.output == f"{out}\n" and not parts_folder(out).exists()
    with open_features(tmp_path / "feats") as saved, open_features(out) as found:
        assert json.loads(found.metadata["inputs"]) == saved.inputs
        assert json.loads(found.metadata["stats"]) == {
            "top": 4,
            "top_by": "max",
            "quantiles": [0, 0.5, 0.99, 1],
            "pca": True,
        }
        for key in ("layer3", "fc"):
            rows = saved[key].astype(np.float64)
            flat = rows.reshape(len(rows), rows.shape[1], -1)  # [N, C, P]
            every = flat.transpose(1, 0, 2).reshape(flat.shape[1], -1)
            assert int(found[f"{key}@count"]) == every.shape[1]
            np.testing.assert_allclose(found[f"{key}@mean"], every.mean(axis=1), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(found[f"{key}@std"], every.std(axis=1), rtol=1e-9, atol=1e-12)
            assert np.array_equal(found[f"{key}@min"], every.min(axis=1))
            assert np.array_equal(found[f"{key}@max"], every.max(axis=1))
            assert np.array_equal(found[f"{key}@zeros"], (every == 0).mean(axis=1))
            # Fewer values than the sketch holds: each quantile is the smallest value with enough of them below.
            ordered = np.sort(every, axis=1)
            ranks = np.ceil(np.array([0, 0.5, 0.99, 1]) * every.shape[1]).astype(int).clip(1) - 1
            assert np.array_equal(found[f"{key}@quantiles"], ordered[:, ranks])
            peaks = flat.max(axis=2).astype(np.float32)
            order = np.stack([np.lexsort((np.arange(len(rows)), -peaks[:, c]))[:4] for c in range(flat.shape[1])])
            assert np.array_equal(found[f"{key}@top_rows"], order)
            assert np.array_equal(found[f"{key}@top_values"], np.take_along_axis(peaks.T, order, axis=1))
            maps = flat.transpose(1, 0, 2)[np.arange(flat.shape[1])[:, None], order]  # [C, K, P]
            assert np.array_equal(found[f"{key}@top_maps"].reshape(maps.shape), maps.astype(np.float32))
            pooled = flat.mean(axis=2)
            np.testing.assert_allclose(found[f"{key}@cov"], np.cov(pooled, rowvar=False), rtol=1e-9, atol=1e-12)
        assert found.shape("layer3@top_at") == [256, 4, 2]
        at = found["layer3@top_at"]
        maps = found["layer3@top_maps"]
        assert all(maps[0, k, at[0, k, 0], at[0, k, 1]] == found["layer3@top_values"][0, k] for k in range(4))
        assert "fc@top_at" not in found.keys() and found.shape("fc@top_maps") == [1000, 4]
    # The same statistics from the saved folder, with the same batches and shards: the same to the bit.
    again = tmp_path / "again.safetensors"
    done = runner.invoke(main, ["stats", f"{tmp_path}/feats/", "-b", "3", "--shard-size", "4", "--top", "4",
                                "--quantiles", "0,0.5,0.99,1", "-q", "-o", str(again)])  # fmt: skip
    assert done.exit_code == 0, done.output
    with open_features(out) as forward, open_features(again) as saved:
        assert sorted(forward.keys()) == sorted(saved.keys())
        assert all(np.array_equal(forward[key], saved[key]) for key in forward.keys())


def _environment(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    return {**env, **extra}


ARGS = [*MODEL, "-l", "layer4", "-l", "avgpool", "-b", "2", "--shard-size", "2", "--top", "3"]


def _one_process(path, inputs, threads=None, args=ARGS):
    """The file one fresh process writes (of ``threads`` threads: threads sum in another order, so processes sharing
    the cores are compared with one of as many threads as each has)."""
    extra = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    done = subprocess.run(
        [sys.executable, "-m", "hookcli", "stats", *args, "-o", str(path), *inputs],
        capture_output=True, text=True, timeout=300, env=_environment(**extra),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return _digest(path)


def test_parts_and_torchrun_write_the_file_one_process_writes(runner, tmp_path, inputs):
    expected = _one_process(tmp_path / "one.safetensors", inputs)
    three = tmp_path / "three.safetensors"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "hookcli", "stats", *ARGS, "--part", f"{k}/3", "-o", str(three), *inputs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
        )
        for k in (1, 2, 3)
    ]
    results = [(run.wait(timeout=300), run.stdout.read(), run.stderr.read()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    assert "".join(out for _, out, _ in results) == f"{three}\n"  # said once, by the process that wrote it
    left = (  # what each of the others says of it, by when it stopped
        f"Note: every part of '{three}' is done: the process that finished the last merges them (should it stop "
        "first, run the same command again to merge them)\n",
        f"Note: '{three}' is complete: another process of this run wrote it\n",
        f"Note: '{three}.parts/' holds ",
    )
    assert all(out or any(text in err for text in left) for _, out, err in results), results
    assert _digest(three) == expected and not parts_folder(three).exists()
    written = three.stat().st_mtime_ns
    late = runner.invoke(main, ["stats", *ARGS, "--part", "2/3", "--force", "-o", str(three), *inputs])
    assert (late.exit_code, late.stdout) == (0, "")  # a late task of the run, --force or not: nothing to redo
    assert late.stderr == (
        f"Note: '{three}' is complete: another process of this run wrote it (--force redoes none of it: delete the "
        "file to compute it again)\n"
    )
    assert three.stat().st_mtime_ns == written

    threads = cpu_threads(Part(0, 2, 0, 2))  # each of torchrun's two processes': one process of as many threads
    if threads != torch.get_num_threads():  # a fresh process has this one's threads (a worker's share of the cores)
        expected = _one_process(tmp_path / "one-thread.safetensors", inputs, threads=threads)
    two = tmp_path / "two.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hookcli",
         "stats", *ARGS, "-o", str(two), *inputs],
        capture_output=True, text=True, timeout=300, env=_environment(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{two}\n" and "Error" not in done.stderr, done.stderr
    assert _digest(two) == expected


def test_a_process_starting_while_the_parts_are_merged_waits_and_leaves_the_file_to_the_merger(
    tmp_path, inputs, next_line
):
    out = tmp_path / "s.safetensors"
    merging = hold_output(out)  # what the process that merges the parts holds while it writes the file
    parts_folder(out).mkdir()  # the parts it merges, left in place until the file is written
    late = subprocess.Popen(
        [sys.executable, "-m", "hookcli", "stats", *ARGS, "--part", "1/3", "-o", str(out), *inputs],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environment(),
    )  # fmt: skip
    try:
        expected = _one_process(tmp_path / "one.safetensors", inputs)
        waiting = next_line(late.stderr, 240)  # said after a few seconds of waiting (or whatever stopped it)
        assert waiting == f"Note: waiting for another hookcli process writing '{out}'\n"
        assert late.poll() is None and not (parts_folder(out) / "index.jsonl").exists()
        os.replace(tmp_path / "one.safetensors", out)
        parts_folder(out).rmdir()
    finally:
        release_output(out, merging)
    code, said, told = late.wait(timeout=300), late.stdout.read(), late.stderr.read()
    assert code == 0 and said == "", told
    assert told == f"Note: '{out}' is complete: another process of this run wrote it\n"
    assert _digest(out) == expected
    assert sorted(os.listdir(tmp_path)) == ["imgs", "s.safetensors"]  # no lock file left

    again = subprocess.run(  # one process of the same command, once more: a file that exists, as for any output
        [sys.executable, "-m", "hookcli", "stats", *ARGS, "-o", str(out), *inputs],
        capture_output=True, text=True, timeout=300, env=_environment(),
    )  # fmt: skip
    assert (again.returncode, again.stderr) == (
        2,
        f"Error: output '{out}' already exists. Hint: add --force to overwrite it\n",
    )


def test_a_file_another_command_writes_is_refused_at_once_not_waited_for(tmp_path, inputs, one_error, runner):
    out = tmp_path / "s.safetensors"
    writing = hold_output(out)  # what an extract to the same file holds while it works
    try:
        result = runner.invoke(main, ["stats", *ARGS, "-o", str(out), *inputs])
    finally:
        release_output(out, writing)
    assert one_error(result) == (
        f"Error: another hookcli process is writing '{out}'. Hint: wait for it to finish, or write to another file"
    )
    assert sorted(os.listdir(tmp_path)) == ["imgs"]


def test_the_merger_waits_for_the_processes_still_in_the_parts_folder(tmp_path, inputs, next_line):
    out = tmp_path / "s.safetensors"
    expected = _one_process(tmp_path / "one.safetensors", inputs)
    inside = share_output(out)  # what another process of the run holds while it uses the parts folder
    run = subprocess.Popen(
        [sys.executable, "-m", "hookcli", "stats", *ARGS, "-o", str(out), *inputs],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environment(),
    )  # fmt: skip
    try:
        index = parts_folder(out) / "index.jsonl"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(read_index(index.parent)[1] if index.exists() else []) < 5:
            assert run.poll() is None, run.stderr.read()
            time.sleep(0.05)
        waiting = next_line(run.stderr, 240)  # said after a few seconds of waiting (or whatever stopped it)
        assert waiting == f"Note: waiting for the other hookcli processes of this run to finish with '{out}'\n"
        assert run.poll() is None and not out.exists() and len(read_index(index.parent)[1]) == 5
    finally:
        release_output(out, inside)
    code, said, told = run.wait(timeout=300), run.stdout.read(), run.stderr.read()
    assert code == 0 and said == f"{out}\n", told
    assert _digest(out) == expected and not parts_folder(out).exists()


def test_a_killed_run_continues_to_the_file_an_uninterrupted_one_writes(runner, tmp_path, inputs, make_image):
    inputs = inputs + [
        str(make_image(tmp_path / "imgs" / f"x{i:02d}.png", size=(44, 40), seed=50 + i)) for i in range(10)
    ]
    slow = [*MODEL, "-l", "layer4", "-b", "1", "--shard-size", "2", "--top", "3"]
    out = tmp_path / "s.safetensors"
    first = subprocess.Popen(
        [sys.executable, "-m", "hookcli", "stats", *slow, "-o", str(out), *inputs],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_environment(),
    )  # fmt: skip
    index = parts_folder(out) / "index.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(read_index(index.parent)[1] if index.exists() else []) < 2:
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert not out.exists() and 2 <= len(read_index(index.parent)[1]) < 10
    shown = runner.invoke(main, ["info", str(parts_folder(out))])  # not a folder of features: said as such
    assert (shown.exit_code, shown.stderr) == (
        2,
        f"Error: '{parts_folder(out)}' holds the parts of a stats run, which merge into one file when it completes. "
        "Hint: run the same stats command again to complete it, and read the file it writes\n",
    )
    other = subprocess.run(  # another command on the same file: its parts are not this one's to continue
        [sys.executable, "-m", "hookcli", "stats", *slow, "-l", "avgpool", "-o", str(out), *inputs],
        capture_output=True, text=True, timeout=300, env=_environment(),
    )  # fmt: skip
    assert (other.returncode, other.stderr) == (
        2,
        f"Error: '{out}.parts/' holds the parts of a different run (it differs in: layers (this command's "
        "alone: avgpool)). Hint: run the same command to continue it, add --force to replace it, or use another file\n",
    )
    done = subprocess.run(
        [sys.executable, "-m", "hookcli", "stats", *slow, "-o", str(out), *inputs],
        capture_output=True, text=True, timeout=300, env=_environment(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    continuing = done.stderr.splitlines()[0]  # then a note of the claim the killed run left
    assert re.fullmatch(rf"Continuing: \d+ of 20 inputs are already in {re.escape(str(out))}\.parts/", continuing)
    assert done.stdout == f"{out}\n"
    assert _digest(out) == _one_process(tmp_path / "whole.safetensors", inputs, args=slow)


def test_what_stats_refuses_before_any_work(runner, tmp_path, inputs):
    cases = [
        (["stats", *MODEL, *inputs], "Error: --layer is needed with --model (repeat it for more layers)"),
        (["stats", *MODEL, "-l", "fc", "-k", "x", *inputs], "Error: -k chooses tensors of saved features"),
        (["stats", *MODEL, "-l", "fc", "-o", "-", *inputs], "Error: stats writes a file (its parts are kept beside"),
        (
            ["stats", *MODEL, "-l", "fc", "-o", f"{tmp_path}/", *inputs],
            f"Error: stats writes one file, and '{tmp_path}/'",
        ),
        (["stats", *MODEL, "-l", "fc", "--quantiles", "0.5,2", *inputs], "quantile level 2.0 is not between 0 and 1"),
        (["stats", *MODEL, "-l", "fc", "--top", "0", *inputs], "Error: Invalid value for '--top'"),
        (["stats", inputs[0], "--resize", "30"], "Error: --resize applies when --model runs a model; saved features"),
        (["stats", inputs[0], inputs[1]], "Error: give one source of saved features (a file, a folder or -), not 2"),
    ]
    for args, message in cases:
        done = runner.invoke(main, args)
        assert done.exit_code == 2 and message in done.output and "Traceback" not in done.output, (args, done.output)


def test_the_python_api_reads_features_in_memory_and_refuses_mixed_calls(inputs):
    features = hookcli.extract("resnet18", "avgpool", inputs[:3], weights="none", resize=40, crop=32)
    found = hookcli.stats(features=features, top=2, quantiles=[0.5])
    assert found["avgpool@top_maps"].shape == (512, 2, 1, 1) and found.metadata["kind"] == "stats"
    assert found.inputs == features.inputs
    with pytest.raises(hookcli.HookcliError, match="stats reads saved features or runs a model, not both"):
        hookcli.stats("resnet18", features=features)
    with pytest.raises(TypeError, match="stats\\(\\) got an unexpected keyword argument 'resize'"):
        hookcli.stats(features=features, resize=30)


def test_a_channel_that_takes_a_nan_has_no_minimum_as_numpy_says():
    values = torch.tensor([[[[1.0, float("nan"), -2.0]], [[3.0, 4.0, 5.0]]]])  # two channels, three positions
    moments = Moments(2)
    moments.update(UnitBatch(values, torch.tensor([0]), UnitLayout.of((2, 1, 3))))
    numpy_says = [np.min(row) for row in values[0, :, 0].numpy()], [np.max(row) for row in values[0, :, 0].numpy()]
    assert [np.isnan(v) for v in numpy_says[0]] == [True, False]
    assert moments.min.isnan().tolist() == [True, False] and moments.max.isnan().tolist() == [True, False]
    assert moments.min[1].item() == 3.0 and moments.max[1].item() == 5.0 and moments.mean[0].isnan()


@pytest.mark.parametrize(
    ("craft", "message"),
    [
        (
            lambda state, described: state.update({"x@moments.count": torch.tensor(-12)}),
            "its moments count -12 values, and its 3 inputs have 12",
        ),
        (
            lambda state, described: state.update({"x@examples.rows": torch.full((2, 2), 9)}),
            "its dataset examples name inputs it has no rows of",
        ),
        (
            lambda state, described: state.update({"x@sketch.level0": torch.zeros(5, 12)}),
            "its quantile sketch has levels that are not of 2 channels",
        ),
        (
            lambda state, described: state.update({"x@examples.maps": torch.zeros(2, 2, 7)}),
            "its examples.maps is not of shape [2, 2, 4]",
        ),
        (
            lambda state, described: described["x"].update(row_shape="[2, 2, 2]"),
            "its description of 'x' has no row shape",
        ),
        (
            lambda state, described: state.update({"x@examples.info": torch.tensor([5, 0])}),
            "its dataset examples are not the run's (--top 2 by max)",
        ),
    ],
    ids=["count", "example rows", "sketch", "maps", "row shape", "top"],
)
def test_a_crafted_statistics_part_is_refused_saying_what_its_rows_could_not_have_made(craft, message):
    gathering = StatsGathering(StatsChoice(top=2, quantiles=(0.5,), pca=True))
    shard = gathering.start(0)
    shard.update({"x": torch.arange(24.0).reshape(3, 2, 2, 2)}, torch.tensor([0, 1, 2]))
    state, described = shard.state(), json.loads(json.dumps(shard.describe()))
    assert sorted(gathering.read(dict(state), described, [0, 1, 2]).state()) == sorted(state)  # as written: taken
    craft(state, described)
    with pytest.raises(ValueError) as refused:
        gathering.read(state, described, [0, 1, 2])
    assert str(refused.value) == message


def test_a_part_whose_sketch_has_more_than_ten_levels_is_taken():
    from hookcli.statistics.layer import LayerStats

    layer = LayerStats(UnitLayout.of((1, 512, 512)), StatsChoice(top=2, quantiles=(0.5,), pca=False))
    rows = torch.rand(12, 1, 512, 512, generator=torch.Generator().manual_seed(0))
    layer.update(rows, torch.arange(12))
    assert len(layer.sketch.levels) >= 11  # level10 sorts before level2 as text
    layer.check_part(list(range(12)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_a_channel_that_takes_a_nan_has_nan_moments_and_quantiles_whatever_the_dtype(dtype):
    from hookcli.storage.features import Features

    maps = torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    maps[1, 0, 1, 1] = float("nan")
    features = Features({"maps": maps}, {"inputs": json.dumps([f"/photos/{n}.jpg" for n in range(4)])})
    found = hookcli.stats(features=features, top=4, quantiles=(0.0, 0.5, 0.99, 1.0))
    tainted = [found[f"maps@{field}"][0] for field in ("mean", "std", "min", "max", "quantiles")]
    assert all(value.isnan().all() for value in tainted)
    clean = maps[:, 1].to(torch.float64)
    assert found["maps@min"][1].item() == clean.min().item() and found["maps@max"][1].item() == clean.max().item()
    assert not found["maps@quantiles"][1].isnan().any()
    assert found["maps@top_rows"][0].tolist()[-1] == 1  # the input whose map has the NaN ranks last


def test_an_interrupted_run_says_where_its_shards_wait_and_a_refused_one_leaves_none(tmp_path, inputs):
    from hookcli.events import Advanced, Note

    out, heard = tmp_path / "s.safetensors", []
    small = {"weights": "none", "resize": 40, "crop": 32, "batch_size": 2, "shard_size": 2, "top": 2}

    def interrupt(event):
        heard.append(event)
        if isinstance(event, Advanced) and sum(isinstance(e, Advanced) for e in heard) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the third batch: two shards are done

    with pytest.raises(KeyboardInterrupt):
        hookcli.stats("resnet18", "avgpool", inputs, output=out, progress=interrupt, **small)
    assert [e.text for e in heard if isinstance(e, Note)] == [
        f"'{parts_folder(out)}/' keeps the shards done so far: run the same command again to continue"
    ]
    assert parts_folder(out).is_dir() and not out.exists()
    assert hookcli.stats("resnet18", "avgpool", inputs, output=out, **small) == out  # continued, then merged
    assert not parts_folder(out).exists()


@pytest.mark.parametrize("other", [{"seed": 1}, {"quantiles": [0.1, 0.9]}, {"layers": "layer4"}])
def test_a_part_another_run_made_is_computed_again_not_merged(tmp_path, inputs, make_image, other):
    from hookcli.errors import ImageError
    from hookcli.events import Started
    from hookcli.storage.fileformat import INDEX_NAME

    broken = tmp_path / "late.png"
    broken.write_text("not a picture\n")  # the runs stop here, their first parts kept
    paths, options = [*inputs[:6], str(broken)], {"weights": "none", "resize": 32, "crop": 32, "shard_size": 2,
                                                  "top": 2, "batch_size": 2}  # fmt: skip
    out, donor = tmp_path / "s.safetensors", tmp_path / "d.safetensors"
    for path, changes in ((out, {}), (donor, other)):
        asked = {"layers": "layer3", **options, **changes}
        with pytest.raises(ImageError):
            hookcli.stats("resnet18", inputs=paths, output=path, **asked)
    mine, theirs = parts_folder(out), parts_folder(donor)
    (mine / "features-00001.safetensors").write_bytes((theirs / "features-00001.safetensors").read_bytes())
    lines, first = (mine / INDEX_NAME).read_text().splitlines(), '{"shard": 1,'
    donated = next(line for line in (theirs / INDEX_NAME).read_text().splitlines() if line.startswith(first))
    (mine / INDEX_NAME).write_text("\n".join(donated if line.startswith(first) else line for line in lines) + "\n")
    make_image(broken, size=(44, 40), seed=99)
    clean = hookcli.stats("resnet18", "layer3", paths, output=tmp_path / "clean.safetensors", **options)
    heard: list = []
    hookcli.stats("resnet18", "layer3", paths, output=out, progress=heard.append, **options)
    assert _digest(out) == _digest(clean)
    started = next(event for event in heard if isinstance(event, Started))
    assert (started.total, started.done) == (7, 4)  # shards 0 and 2 kept; 1, the other run's, computed again


def test_a_parts_folder_holding_what_hookcli_never_puts_there_is_refused_and_kept(tmp_path, inputs):
    out = tmp_path / "s.safetensors"
    notes = parts_folder(out) / "sub" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("precious\n")
    with pytest.raises(OutputExistsError) as caught:
        hookcli.stats("resnet18", "layer3", inputs, weights="none", resize=32, crop=32, top=2, output=out)
    assert str(caught.value) == (
        f"'{out}.parts/' holds 'sub', which hookcli never puts there: it keeps a file's parts in that folder and "
        "removes it whole when the file is written. Hint: move what it holds elsewhere, or give another -o"
    )
    assert notes.read_text() == "precious\n" and not out.exists()


def test_principal_components_are_the_same_bytes_whatever_the_threads_of_the_process():
    import types

    from threadpoolctl import threadpool_limits

    from hookcli.statistics.covariance import Covariance, principal_components

    rows = torch.from_numpy(np.random.default_rng(0).standard_normal((100, 700)))
    matrix = rows.T @ rows / 99  # of rank 100: the null space's vectors are LAPACK's to choose
    found, threads = [], torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with threadpool_limits(limits=count):
                kept = Covariance(700)
                kept.update(types.SimpleNamespace(pooled=rows))  # rows kept: the SVD of the rows finds them
                found.append((*principal_components(matrix), *kept.components()))
                assert torch.get_num_threads() == count  # given back as it was
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one, other) for one, other in zip(*found))


@pytest.mark.parametrize("batch", [1, 4, 15])
def test_a_channel_with_an_infinite_value_has_numpys_mean_whatever_the_batches(batch):
    values = np.random.default_rng(12).standard_normal((15, 4, 2, 2))
    values[7, 0, 0, 0], values[9, 1, 1, 1], values[3, 2, 0, 1], values[4, 2, 1, 0] = np.inf, -np.inf, np.inf, -np.inf
    values[2, 3, 0, 0] = np.nan
    inputs = json.dumps([f"/photos/{n}.jpg" for n in range(15)])
    found = hookcli.stats(features=Features({"x": torch.from_numpy(values)}, {"inputs": inputs}), batch_size=batch)
    with np.errstate(invalid="ignore"):  # inf + -inf: NaN, as numpy says
        expected = values.mean(axis=(0, 2, 3))
    np.testing.assert_array_equal(found["x@mean"].numpy(), expected)  # inf, -inf, nan, nan


def test_a_shard_size_that_leaves_a_last_shard_too_small_is_refused_with_one_that_fits():
    from hookcli.errors import UsageProblem
    from hookcli.storage.gathering import checked_shard_size

    with pytest.raises(UsageProblem) as caught:
        checked_shard_size(13, 120, 20, 4)
    assert str(caught.value) == (
        "--shard-size 13 leaves the last shard 3 of 120 inputs, and this run needs 4 a shard at least. Hint: give "
        "--shard-size 120, or leave it out"
    )
    assert checked_shard_size(None, 120, 20, 4) >= 120 and checked_shard_size(12, 120, 20, 4) == 12


def test_a_layers_quantiles_are_the_same_whichever_layers_are_gathered_with_it():
    rng = np.random.default_rng(0)
    maps = {key: torch.from_numpy(rng.standard_normal((20, 4, 16, 16)).astype(np.float32)) for key in ("a", "b")}
    saved = Features(maps, {"inputs": json.dumps([f"/photos/{n}.jpg" for n in range(20)])})
    alone = hookcli.stats(features=saved, keys=["b"], top=1)
    beside = hookcli.stats(features=saved, keys=["a", "b"], top=1)
    # 5,120 values a channel: past the sketch's first level, so its random choices are drawn (the key's own)
    assert torch.equal(alone["b@quantiles"], beside["b@quantiles"])
    levels = np.sort(maps["b"].numpy().transpose(1, 0, 2, 3).reshape(4, -1), axis=1)
    for channel, value in enumerate(alone["b@quantiles"][:, 1].tolist()):  # level 0.99: a rank within 0.1%
        rank = np.searchsorted(levels[channel], value, side="right")
        assert abs(rank - 0.99 * 5120) <= 0.001 * 5120 + 1
