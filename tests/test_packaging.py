"""What an installed copy carries: every module of the package, and the shipped presets inside the wheel."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_every_module_and_the_presets(tmp_path):
    pytest.importorskip("setuptools", minversion="77")  # what pyproject.toml builds with
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("hookcli", "configs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("hookcli-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        carried = {name: archive.read(name) for name in names if name.startswith("hookcli/presets/")}
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hookcli").rglob("*.py")}
    assert {name for name in names if name.endswith(".py")} == modules
    shipped = {f"hookcli/presets/{p.name}": p.read_bytes() for p in (ROOT / "configs").glob("*.toml")}
    assert len(shipped) == 3
    assert carried == shipped


def test_dir_lists_the_public_names_and_nothing_of_the_imports():
    import hookcli

    assert dir(hookcli) == sorted(hookcli.__all__)
    assert "report" in dir(hookcli) and "version" not in dir(hookcli) and "import_module" not in dir(hookcli)
