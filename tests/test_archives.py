"""Images read out of .tar files (webdataset shards) give exactly what the same images give unpacked."""

import io
import json
import tarfile

import pytest
import torch
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.inputs.archives import find_member, tar_images

SMALL = ["--resize", "64", "--crop", "56", "-w", "none"]


@pytest.fixture
def shard(images, tmp_path):
    """``shard.tar`` holding images a, b, c as webdataset samples (``000.png`` with a ``000.json`` beside it)."""
    path = tmp_path / "shard.tar"
    with tarfile.open(path, "w") as archive:
        for number, image in enumerate(images):
            archive.add(image, arcname=f"{number:03d}.png")
            data = json.dumps({"caption": image.stem}).encode()
            info = tarfile.TarInfo(f"{number:03d}.json")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _tensor(path, key):
    with safe_open(str(path), "pt") as handle:
        return handle.get_tensor(key), handle.metadata()


def test_a_tar_gives_exactly_the_rows_of_its_images_unpacked(runner, shard, images, tmp_path):
    packed, unpacked = tmp_path / "packed.safetensors", tmp_path / "unpacked.safetensors"
    assert (
        runner.invoke(
            main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, str(shard), "-o", str(packed)]
        ).exit_code
        == 0
    )
    assert (
        runner.invoke(
            main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, *map(str, images), "-o", str(unpacked)]
        ).exit_code
        == 0
    )
    (rows, metadata), (expected, _) = _tensor(packed, "layer2"), _tensor(unpacked, "layer2")
    assert torch.equal(rows, expected)
    assert json.loads(metadata["inputs"]) == [f"{shard}::000.png", f"{shard}::001.png", f"{shard}::002.png"]


def test_members_are_named_on_stdin_and_read_by_workers(runner, shard, tmp_path):
    written = tmp_path / "two.safetensors"
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "resnet18",
            "-l",
            "layer2",
            *SMALL,
            "--workers",
            "1",
            "--batch-size",
            "1",
            "-",
            "-o",
            str(written),
        ],
        input=f"{shard}::002.png\n{shard}::000.png\n",
    )
    assert result.exit_code == 0, result.output
    rows, metadata = _tensor(written, "layer2")
    whole = hookcli.extract("resnet18", "layer2", str(shard), resize=64, crop=56, weights="none")
    torch.testing.assert_close(rows, whole["layer2"][[2, 0]], rtol=1e-5, atol=1e-5)  # batches of 1 and of 3
    assert json.loads(metadata["inputs"]) == [f"{shard}::002.png", f"{shard}::000.png"]


def test_pictures_over_photos_read_them_from_the_tar(runner, shard, tmp_path):
    written = tmp_path / "f.safetensors"
    runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, str(shard), "-o", str(written)])
    result = runner.invoke(main, ["grid", str(written), "--overlay", "-i", "1", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "g" / "layer2__00001_shard.tar_001.overlay.png")
    cams = runner.invoke(main, ["cam", "-m", "resnet18", *SMALL, f"{shard}::001.png", "-o", str(tmp_path / "c")])
    assert cams.exit_code == 0, cams.output
    assert cams.output.splitlines()[-1] == str(tmp_path / "c" / "00000_shard.tar_001.png")


def test_archives_that_cannot_be_read_are_one_line(runner, shard, tmp_path):
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, f"{shard}::009.png"])
    assert result.exit_code == 2
    assert result.output == f"Error: archive '{shard}' holds no image '009.png'. Hint: list it with: tar tf ARCHIVE\n"
    squeezed = tmp_path / "shard.tar.gz"
    squeezed.write_bytes(b"\x1f\x8b")
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, str(squeezed)])
    assert result.output == (
        f"Error: '{squeezed}' is a compressed tar, whose members cannot be read one at a time. "
        "Hint: unpack it to a plain .tar (gzip -d, zstd -d), as webdataset shards are\n"
    )
    bogus = tmp_path / "bogus.tar"
    bogus.write_text("not a tar at all")
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, str(bogus)])
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: cannot read archive '{bogus}': ")
    empty = tmp_path / "captions.tar"
    with tarfile.open(empty, "w") as archive:
        info = tarfile.TarInfo("000.txt")
        archive.addfile(info, io.BytesIO(b""))
    result = runner.invoke(main, ["extract", "-m", "resnet18", "-l", "layer2", *SMALL, str(empty)])
    assert result.output.startswith(f"Error: no images found in archive '{empty}'. Hint: image members end in")


def test_a_truncated_archive_member_is_an_image_error(shard, tmp_path):
    members = tar_images(shard)
    assert [m.name for m in members] == ["000.png", "001.png", "002.png"]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes())
    member = find_member(f"{cut}::002.png")
    with open(cut, "r+b") as handle:
        handle.truncate(member.offset + 10)
    from hookcli.errors import ImageError

    with pytest.raises(ImageError, match=r"'.*cut.tar::002.png' is cut short"):
        member.read_bytes()


def test_an_empty_archive_member_is_said_to_be_empty(runner, images, tmp_path):
    path = tmp_path / "empty.tar"
    with tarfile.open(path, "w") as archive:
        archive.add(images[0], arcname="000.png")
        archive.addfile(tarfile.TarInfo("001.png"), io.BytesIO(b""))
    result = runner.invoke(
        main,
        [
            "extract",
            "-m",
            "resnet18",
            *SMALL,
            "-l",
            "layer1",
            "--on-error",
            "skip",
            "-o",
            str(tmp_path / "o.safetensors"),
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        f"Skipped: image '{path}::001.png' is empty (0 bytes). Hint: the file may not have been written"
    )
