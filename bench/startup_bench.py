"""Start-up: whole-process wall time of commands that need no model, with the registry cache warm and without it.

Run from the repository root:  python bench/startup_bench.py  [--repeat 5]

Each command is a fresh ``python -m hookcli`` process, run --repeat times in
rounds that alternate the settings; the median is kept:

- warm: the model registry cache (hookcli.models.registry) is in place;
- cold: a fresh, empty cache folder each time (a first run: torchvision is
  imported, then the cache is written);
- no cache: the cache folder cannot be made, so every run imports
  torchvision (what every run did before the cache).

Commands: ``hookcli models``, an unknown model refused
(``extract -m resnet5 -l layer1 x.jpg``, x.jpg a real image) and
``hookcli --help``. Goal: warm under 1 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "hookcli models": ["models"],
    "unknown model refused": ["extract", "-m", "resnet5", "-l", "layer1", "x.jpg"],
    "hookcli --help": ["--help"],
}
EXPECTED_EXIT = {"hookcli models": 0, "unknown model refused": 2, "hookcli --help": 0}


def timed(args: list[str], cache: Path, folder: Path, expected: int) -> float:
    env = {**os.environ, "HOOKCLI_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hookcli", *args], cwd=folder, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"hookcli {' '.join(args)} exited {done.returncode}, not {expected}: {done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory(prefix="hookcli-startup-") as scratch:
        folder = Path(scratch)
        from PIL import Image

        Image.new("RGB", (64, 48), (120, 80, 40)).save(folder / "x.jpg")
        warm = folder / "warm"
        timed(["models"], warm, folder, 0)  # fills it
        (folder / "blocker").write_text("a file where the cache folder's parent would be")
        settings = {
            "warm": lambda tag: warm,
            "cold": lambda tag: folder / f"cold-{tag}",
            "no cache": lambda tag: folder / "blocker" / "cache",
        }
        times: dict[tuple[str, str], list[float]] = {}
        for turn in range(repeat):
            for label, args in COMMANDS.items():
                for setting, cache in settings.items():
                    if label == "hookcli --help" and setting != "warm":
                        continue  # --help reads no registry
                    where = cache(f"{label}-{turn}".replace(" ", "_"))
                    times.setdefault((label, setting), []).append(timed(args, where, folder, EXPECTED_EXIT[label]))
    median = {key: statistics.median(values) for key, values in times.items()}
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"median of {repeat} whole processes, seconds"
    )
    print(f"{'command':<24}{'warm':>8}{'cold':>8}{'no cache':>10}{'no cache / warm':>17}")
    for label in COMMANDS:
        row = [median.get((label, setting)) for setting in settings]
        cells = "".join(f"{'-' if value is None else f'{value:.2f}':>{width}}" for value, width in zip(row, (8, 8, 10)))
        ratio = f"{row[2] / row[0]:.1f}x" if row[2] is not None else "-"
        print(f"{label:<24}{cells}{ratio:>17}")
    slowest_warm = max(median[(label, "warm")] for label in COMMANDS)
    print(f"goal: warm under 1 s: {'met' if slowest_warm < 1 else 'missed'} (slowest {slowest_warm:.2f} s)")


if __name__ == "__main__":
    main()
