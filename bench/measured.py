"""What the benchmarks of gathering runs share: photos to run over, and a hookcli command run in a fresh process
with its wall time and peak memory (the process's resident high-water mark).

Run from the repository root as part of ``bench/stats_bench.py``, ``bench/compare_bench.py`` and
``bench/ragged_bench.py``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image, ImageOps

_RUN = """
import sys
from hookcli.cli import main
try:
    main(sys.argv[1:], prog_name="hookcli")
except SystemExit as end:
    assert not end.code, end.code
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) // 1024)
"""


def photos(folder: Path, count: int) -> list[str]:
    """``count`` different crops of the sample photo of Grace Hopper (each a window of its own, every other one
    mirrored), 320 x 240 JPEGs in ``folder``."""
    photo = Image.open(__import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    photo = photo.convert("RGB")
    chosen = random.Random(0)
    folder.mkdir()
    paths = []
    for number in range(count):
        width = chosen.randint(200, photo.width)
        height = width * 3 // 4
        left, top = chosen.randint(0, photo.width - width), chosen.randint(0, max(0, photo.height - height))
        crop = photo.crop((left, top, left + width, top + height)).resize((320, 240))
        if number % 2:
            crop = ImageOps.mirror(crop)
        path = folder / f"{number:04d}.jpg"
        crop.save(path, quality=90)
        paths.append(str(path))
    return paths


def measured(command: list[str], tree: Path | None = None) -> tuple[float, int]:
    """``(wall seconds, peak MiB)`` of one hookcli command in a fresh process: this repository's, or ``tree``'s
    (another revision checked out: run from its folder, which ``-c`` puts first on the module path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *command], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])}… failed:\n{done.stderr}")
    return wall, int(done.stdout.strip().splitlines()[-1])
