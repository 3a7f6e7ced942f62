"""Atomic, no-clobber writes."""

import gc
import os
import threading
import weakref

import pytest
import torch
from safetensors import safe_open

from hookcli.errors import OutputExistsError, UsageProblem
from hookcli.files import atomic_path
from hookcli.storage.background import Background
from hookcli.storage.saving import write_safetensors


def test_written_file_has_tensors_metadata_and_normal_permissions(tmp_path):
    out = tmp_path / "o.safetensors"
    write_safetensors({"a": torch.arange(6.0).reshape(2, 3).t()}, {"format": "1"}, out)
    with safe_open(str(out), "pt") as handle:
        assert torch.equal(handle.get_tensor("a"), torch.arange(6.0).reshape(2, 3).t())
        assert handle.metadata() == {"format": "1"}
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["o.safetensors"]


@pytest.mark.parametrize("error", [RuntimeError("disk"), KeyboardInterrupt()])
def test_an_interrupted_write_leaves_nothing(tmp_path, error):
    with pytest.raises(type(error)):
        with atomic_path(tmp_path / "o.bin") as temporary:
            temporary.write_bytes(b"half")
            raise error
    assert os.listdir(tmp_path) == []


def test_no_clobber_even_if_the_target_appears_during_the_run(tmp_path):
    target = tmp_path / "o.bin"
    with pytest.raises(OutputExistsError, match="already exists"):
        with atomic_path(target) as temporary:
            temporary.write_bytes(b"new")
            target.write_bytes(b"someone else's")
    assert target.read_bytes() == b"someone else's"
    assert os.listdir(tmp_path) == ["o.bin"]
    with atomic_path(target, force=True) as temporary:
        temporary.write_bytes(b"new")
    assert target.read_bytes() == b"new"


def test_refuses_a_folder_or_a_missing_parent(tmp_path):
    with pytest.raises(OutputExistsError, match="is a folder"):
        with atomic_path(tmp_path):
            pass
    with pytest.raises(UsageProblem, match="does not exist. Hint: create it first"):
        with atomic_path(tmp_path / "nope" / "o.bin"):
            pass


def test_rows_read_in_one_go_match_row_by_row_reads(tmp_path, monkeypatch):
    from hookcli.pictures import summary
    from hookcli.storage.features import FeatureFile, Features

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "half": torch.randn(9, 4, 3, generator=generator).bfloat16(),
        "ints": torch.arange(27, dtype=torch.int16).reshape(9, 3),
    }
    write_safetensors(tensors, {"format": "1"}, tmp_path / "f.safetensors")
    arrays = {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in tensors.items()}
    with FeatureFile(tmp_path / "f.safetensors") as stored, Features(arrays, {}) as memory:
        for features in (stored, memory):
            for key in tensors:
                whole = features.read(key)
                for start, stop in [(0, 9), (2, 5), (8, 20), (-4, -1), (3, 3)]:
                    rows = features.read_rows(key, start, stop)
                    assert rows.dtype == whole.dtype and (rows == whole[start:stop]).all(), (key, start, stop)
        assert stored.read_rows("half", 2, 5).dtype == "float32"
        whole_stats = summary.tensor_stats(stored, "half")
        monkeypatch.setattr(summary, "_WHOLE_TENSOR_BYTES", 50)  # 2 rows (24 bf16 values each) per read
        assert summary.tensor_stats(stored, "half") == pytest.approx(whole_stats)


def test_every_stored_dtype_has_one_name_in_memory_and_in_a_file(tmp_path):
    from hookcli.storage.features import FeatureFile, Features

    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16]
    dtypes += [torch.int8, torch.uint64, torch.uint32, torch.uint16, torch.uint8, torch.bool]
    tensors = {str(dtype).removeprefix("torch."): torch.zeros(2, 3, dtype=dtype) for dtype in dtypes}
    write_safetensors(tensors, {"format": "1"}, tmp_path / "f.safetensors")
    with FeatureFile(tmp_path / "f.safetensors") as stored, Features(tensors, {}) as memory:
        names = [(stored.dtype(key), memory.dtype(key)) for key in tensors]
    expected = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"]
    assert names == [(name, name) for name in expected]


@pytest.mark.parametrize(
    "part", [slice(None, None, -1), slice(5, 1, -2), slice(None, None, 3), slice(-2, None), slice(4, 2)]
)
def test_a_part_of_a_row_is_what_numpy_slices_backwards_too(tmp_path, part):
    from hookcli.storage.features import FeatureFile, Features

    tensors = {"x": torch.arange(2 * 7 * 3, dtype=torch.float32).reshape(2, 7, 3)}
    write_safetensors(tensors, {"format": "1"}, tmp_path / "f.safetensors")
    expected = tensors["x"].numpy()[1][part]
    with FeatureFile(tmp_path / "f.safetensors") as stored, Features(tensors, {}) as memory:
        for features in (stored, memory):
            got = features.read("x", 1, part)
            assert got.shape == expected.shape and (got == expected).all()


def test_the_background_writer_lets_go_of_an_item_once_it_is_done():
    class Shard:  # a finished shard's tensors, say: memory the writer must not keep once written
        pass

    written = threading.Event()
    worker = Background(lambda item: written.set(), name="test")
    shard = Shard()
    held = weakref.ref(shard)
    worker.submit(shard)
    del shard
    assert written.wait(10)
    for _ in range(100):  # the thread drops it right after the work returns
        gc.collect()
        if held() is None:
            break
        threading.Event().wait(0.01)
    assert held() is None
    worker.close()
