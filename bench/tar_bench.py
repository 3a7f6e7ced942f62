"""What listing a tar costs: memory a member and time, hookcli's listing beside tarfile's own, side by side.

Run from the repository root:  python bench/tar_bench.py  [--members 200000]

A tar of ``--members`` tiny ``.jpg`` members (webdataset names, a ``.json``
beside every tenth) is written once. Then, in one process each so that
neither sees the other's memory:

- ``tarfile``: the archive's members as ``tarfile`` keeps them
  (``TarFile.getmembers()``, the way hookcli listed archives before);
- ``hookcli``: :func:`hookcli.inputs.archives.tar_images`, the listing a run keeps.

Memory is what ``tracemalloc`` counts as still allocated once the listing is
made, divided by the image members; time is the wall time of making it.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

_MEASURE = """
import sys, time, tracemalloc
path, how = sys.argv[1], sys.argv[2]
if how == "hookcli":
    from hookcli.inputs.archives import tar_images
    make = lambda: tar_images(path)
else:
    import tarfile
    def make():
        with tarfile.open(path) as archive:
            return [m for m in archive.getmembers() if m.name.endswith(".jpg")]
tracemalloc.start()
start = time.perf_counter()
kept = make()
seconds = time.perf_counter() - start
print(len(kept), tracemalloc.get_traced_memory()[0], seconds)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-tar-") as folder:
        path = Path(folder) / "shard.tar"
        with tarfile.open(path, "w") as archive:
            for number in range(args.members):
                for name in [f"{number:09d}.jpg"] + ([f"{number:09d}.json"] if number % 10 == 0 else []):
                    info = tarfile.TarInfo(name)
                    info.size = 2
                    archive.addfile(info, io.BytesIO(b"{}"))
        results = {}
        for how in ("tarfile", "hookcli"):
            done = subprocess.run(
                [sys.executable, "-c", _MEASURE, str(path), how], capture_output=True, text=True, check=True
            )
            count, size, seconds = done.stdout.split()
            results[how] = int(size) / int(count), float(seconds)
            print(
                f"{how:8s} {int(count):,} members: {results[how][0]:7.0f} bytes a member, "
                f"{float(seconds) * 1e6 / int(count):5.1f} µs a member"
            )
        print(
            json.dumps(
                {
                    "memory_ratio_tarfile_over_hookcli": round(results["tarfile"][0] / results["hookcli"][0], 2),
                    "time_ratio_tarfile_over_hookcli": round(results["tarfile"][1] / results["hookcli"][1], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
