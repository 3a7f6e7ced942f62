"""Crafted tar archives: nothing is read from outside the archive, no member is lost, memory stays bounded."""

import io
import json
import pathlib
import shutil
import subprocess
import tarfile

import pytest
import torch
from safetensors import safe_open

import hookcli
from hookcli.cli import main
from hookcli.errors import ImageError, InputError
from hookcli.inputs.archives import MAX_HEADER_BYTES, MAX_MEMBER_BYTES, find_member, tar_images

SMALL = ["--resize", "64", "--crop", "56", "-w", "none"]
EXTRACT = ["extract", "-m", "resnet18", "-l", "layer2", *SMALL]


def _tar(path, members):
    """A tar of ``(name, bytes)`` members (``bytes`` None: a symbolic link to ``link``, given as a third item)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data, *link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = link[0], data
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


def _rows(path):
    with safe_open(str(path), "pt") as handle:
        return handle.get_tensor("layer2"), handle.metadata()


def test_member_names_leading_outside_the_archive_are_rows_that_fail_and_are_never_opened_on_disk(
    runner, images, tmp_path
):
    (tmp_path / "p.png").write_bytes(images[2].read_bytes())  # what a traversal name would reach
    pictures = [image.read_bytes() for image in images]
    (tmp_path / "d").mkdir()
    archive = _tar(
        tmp_path / "d" / "a.tar",
        [
            ("000.png", pictures[0]),
            ("x/../../p.png", pictures[1]),
            ("/abs/p.png", pictures[1]),
            ("back\\slash.png", pictures[1]),
            ("001.png", pictures[1]),
        ],
    )
    result = runner.invoke(main, [*EXTRACT, str(archive)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"Error: archive member '{archive}::x/../../p.png' has a name hookcli does not read (a '..' part). "
        "Hint: member names are relative paths without '..'; repack the archive; or add --on-error skip to leave "
        "unreadable images out"
    )
    written = tmp_path / "kept.safetensors"
    result = runner.invoke(main, [*EXTRACT, "--on-error", "skip", str(archive), "-o", str(written)])
    assert result.exit_code == 0, result.output
    rows, metadata = _rows(written)
    assert json.loads(metadata["inputs"]) == [f"{archive}::000.png", f"{archive}::001.png"]
    assert [(s["input"], s["error"].split(" (")[1]) for s in json.loads(metadata["skipped"])] == [
        (
            f"{archive}::x/../../p.png",
            "a '..' part). Hint: member names are relative paths without '..'; repack the archive",
        ),
        (f"{archive}::/abs/p.png", "absolute). Hint: member names are relative paths without '..'; repack the archive"),
        (
            f"{archive}::back\\slash.png",
            "a backslash). Hint: member names are relative paths without '..'; repack the archive",
        ),
    ]
    # Named on stdin, the member is found in the listing (and refused), never joined to the file system.
    result = runner.invoke(main, [*EXTRACT, "-"], input=f"{archive}::x/../../p.png\n")
    assert result.output.splitlines()[-1].startswith(f"Error: archive member '{archive}::x/../../p.png' has a name")


def test_a_traversal_name_in_metadata_is_looked_up_in_the_archive_not_on_disk(runner, images, tmp_path):
    """A row name read back from a file (pictures over photos) reads the member, whatever the disk holds."""
    (tmp_path / "d").mkdir()
    archive = _tar(tmp_path / "d" / "a.tar", [("x/y.png", images[0].read_bytes())])
    written = tmp_path / "f.safetensors"
    assert runner.invoke(main, [*EXTRACT, str(archive), "-o", str(written)]).exit_code == 0
    member = find_member(f"{archive}::x/y.png")
    assert (member.name, member.problem) == ("x/y.png", None)
    assert member.read_bytes() == images[0].read_bytes()
    with pytest.raises(InputError, match="holds no image 'x/../y.png'"):
        find_member(f"{archive}::x/../y.png")  # no normalising: a name is the archive's string


def test_every_member_of_a_repeated_name_is_a_row_named_by_occurrence(runner, images, tmp_path):
    archive = _tar(
        tmp_path / "a.tar",
        [("000.png", images[0].read_bytes()), ("001.png", images[1].read_bytes()), ("000.png", images[2].read_bytes())],
    )
    written = tmp_path / "f.safetensors"
    assert runner.invoke(main, [*EXTRACT, str(archive), "-o", str(written)]).exit_code == 0
    rows, metadata = _rows(written)
    assert json.loads(metadata["inputs"]) == [f"{archive}::000.png", f"{archive}::001.png", f"{archive}::000.png#2"]
    expected = hookcli.extract("resnet18", "layer2", [str(p) for p in images], resize=64, crop=56, weights="none")
    assert torch.equal(rows, expected["layer2"])
    assert find_member(f"{archive}::000.png#2").read_bytes() == images[2].read_bytes()


def test_hard_links_read_their_target_and_symbolic_links_are_refused(runner, images, tmp_path):
    archive = _tar(
        tmp_path / "a.tar",
        [
            ("000.png", images[0].read_bytes()),
            ("001.png", "000.png", tarfile.LNKTYPE),
            ("002.png", "../../p.png", tarfile.SYMTYPE),
            ("003.png", "gone.png", tarfile.LNKTYPE),
        ],
    )
    written = tmp_path / "f.safetensors"
    result = runner.invoke(main, [*EXTRACT, "--on-error", "skip", str(archive), "-o", str(written)])
    assert result.exit_code == 0, result.output
    rows, metadata = _rows(written)
    assert json.loads(metadata["inputs"]) == [f"{archive}::000.png", f"{archive}::001.png"]
    assert torch.equal(rows[0], rows[1])
    assert [s["error"] for s in json.loads(metadata["skipped"])] == [
        f"archive member '{archive}::002.png' is a symbolic link (to '../../p.png'), which hookcli does not follow. "
        "Hint: store the image itself in the archive",
        f"archive member '{archive}::003.png' is a hard link to 'gone.png', which is no member the archive holds "
        "before it. Hint: repack the archive",
    ]


def _sparse_picture(path, side=256):
    """A PPM whose middle is a hole: GNU tar --sparse stores it as a sparse member."""
    header = f"P6\n{side} {side}\n255\n".encode()
    with open(path, "wb") as handle:
        handle.write(header + b"\x80" * 3 * side * 10)
        handle.seek(len(header) + 3 * side * (side - 10))
        handle.write(b"\x40" * 3 * side * 10)
    return path


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar to write sparse members")
@pytest.mark.parametrize("last", [True, False])
def test_sparse_members_are_refused_in_one_line(runner, images, tmp_path, last):
    folder = tmp_path / "in"
    folder.mkdir()
    _sparse_picture(folder / "000.ppm")
    shutil.copy(images[0], folder / "001.png")
    order = ["001.png", "000.ppm"] if last else ["000.ppm", "001.png"]
    subprocess.run(
        ["tar", "--sparse", "--format=gnu", "-cf", str(tmp_path / "s.tar"), "-C", str(folder), *order], check=True
    )
    archive = tmp_path / "s.tar"
    assert find_member(f"{archive}::000.ppm").problem == "sparse"
    result = runner.invoke(main, [*EXTRACT, str(archive)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"Error: archive member '{archive}::000.ppm' is stored sparse, which hookcli does not read. "
        "Hint: repack the archive without --sparse; or add --on-error skip to leave unreadable images out"
    )


def _declared(path, name: str, size: int, kind=tarfile.REGTYPE, after: bytes = b""):
    """A tar whose member ``name`` declares ``size`` bytes: the file is made that long with a hole (no disk used)."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    with open(path, "wb") as handle:
        handle.write(info.tobuf(format=tarfile.GNU_FORMAT))
        handle.seek(512 + -(-size // 512) * 512)
        handle.write(after + bytes(1024))
    return path


def test_huge_members_and_headers_are_refused_without_reading_them(runner, images, tmp_path, peak_of):
    picture = images[0].read_bytes()
    good = tarfile.TarInfo("001.png")
    good.size = len(picture)
    good_bytes = good.tobuf(format=tarfile.GNU_FORMAT) + picture + bytes(-len(picture) % 512)
    huge = _declared(tmp_path / "huge.tar", "000.png", 8 << 30, after=good_bytes)
    member = find_member(f"{huge}::000.png")
    assert (member.size, member.problem) == (8 << 30, "too large")
    written = tmp_path / "f.safetensors"
    code, peak, stderr = peak_of(*EXTRACT, "--on-error", "skip", huge, "-o", written)
    assert (code, stderr.split(" | ")[-1]) == (
        0,
        f"Skipped: archive member '{huge}::000.png' holds "
        f"8,589,934,592 bytes, more than any image hookcli decodes "
        f"({MAX_MEMBER_BYTES:,}). Hint: leave it out of the archive",
    )
    assert peak < 1.5 * 2**30, peak
    assert json.loads(_rows(written)[1]["inputs"]) == [f"{huge}::001.png"]
    # A large member that is no image is streamed to the decoder, which stops at its header.
    zeros = _declared(tmp_path / "zeros.tar", "000.png", 1 << 30)
    code, peak, stderr = peak_of(*EXTRACT, zeros)
    assert (code, stderr) == (
        1,
        f"Error: '{zeros}::000.png' is not an image Pillow can read. Hint: check the file "
        "type; text or corrupt files cannot be used; or add --on-error skip to leave unreadable images out",
    )
    assert peak < 1.5 * 2**30, peak
    bomb = _declared(tmp_path / "bomb.tar", "PaxHeader", 2 << 30, kind=tarfile.XHDTYPE)
    with pytest.raises(InputError) as caught:
        tar_images(bomb)
    assert str(caught.value) == (
        f"archive '{bomb}' has a member header near byte 512 larger than "
        f"{MAX_HEADER_BYTES:,} bytes. Hint: it is damaged or not a tar of images"
    )


def test_a_disk_file_named_like_a_member_is_a_disk_path(runner, images, tmp_path):
    archive = _tar(tmp_path / "a.tar", [("b.png", images[0].read_bytes())])
    lookalike = tmp_path / "a.tar::b.png"
    lookalike.write_bytes(images[1].read_bytes())
    given, plain = tmp_path / "given.safetensors", tmp_path / "plain.safetensors"
    assert runner.invoke(main, [*EXTRACT, str(lookalike), "-o", str(given)]).exit_code == 0
    assert runner.invoke(main, [*EXTRACT, str(images[1]), "-o", str(plain)]).exit_code == 0
    assert torch.equal(_rows(given)[0], _rows(plain)[0])  # the file's pixels, not the member's
    found = runner.invoke(main, [*EXTRACT, str(tmp_path), "-o", str(tmp_path / "found.safetensors")])
    assert found.exit_code == 0, found.output
    assert torch.equal(_rows(tmp_path / "found.safetensors")[0], _rows(plain)[0])
    # Read back from the metadata, the name is both: refused rather than guessed.
    result = runner.invoke(main, ["grid", str(given), "--overlay", "-o", str(tmp_path / "g")])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"Error: '{lookalike}' names both a file on disk and a member of the archive '{archive}'. Hint: rename the "
        "file on disk"
    )
    # Two runs over the file and over the member are two runs: the folder of one does not continue the other.
    folder = tmp_path / "shards"
    assert runner.invoke(main, [*EXTRACT, str(lookalike), "-o", f"{folder}/"]).exit_code == 0
    other = runner.invoke(main, [*EXTRACT, str(archive), "-o", f"{folder}/"])
    assert other.exit_code == 2
    assert other.output == (
        f"Error: '{folder}/' holds a different run (it differs in: inputs_sha256). Hint: run the "
        "same command to continue it, add --force to replace it, or use another folder\n"
    )
    with pytest.raises(ImageError, match="names both a file on disk"):
        hookcli.inputs.images.load_rgb(str(lookalike))


def test_a_tar_listing_is_compact(tmp_path):
    import tracemalloc

    archive = _tar(tmp_path / "many.tar", [(f"{n:06d}.jpg", b"x") for n in range(20_000)])
    tracemalloc.start()
    members = tar_images(archive)
    # Without the interpreter's table of interned strings, which pathlib grows (a resize of a few MiB that comes when
    # the process has interned enough strings, whoever made them).
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, pathlib.__file__)])
    size = sum(stat.size for stat in snapshot.statistics("filename"))
    tracemalloc.stop()
    assert len(members) == 20_000
    assert size / len(members) < 300  # bytes a member, names and offsets included (0.65 KB before)


def test_a_tar_cut_short_is_said_to_be_cut_short(runner, images, tmp_path, one_error):
    whole = _tar(tmp_path / "whole.tar", [("a.png", images[0].read_bytes()), ("b.png", images[1].read_bytes())])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[: 512 * 3 + 100])  # the first member's headers and a part of its bytes
    assert one_error(runner.invoke(main, [*EXTRACT, str(cut)])) == (
        f"Error: cannot read archive '{cut}': unexpected end of data. Hint: it ends inside a member: it was cut "
        "short, so copy or write it again"
    )
