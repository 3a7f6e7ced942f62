"""What ``--capture attention`` costs: vit_b_16's 12 blocks' attention weights against the same run's block outputs.

Run from the repository root:  python bench/attention_bench.py  [--images 16] [--batch-size 8] [--device cpu]

Each variant runs in a fresh process (``hookcli.extract`` in memory, random weights, ``--images`` photo-sized
JPEGs): the 12 encoder blocks' outputs; their attention modules' weights, all of them (``[12, 197, 197]`` an image
and block) and the class token's row only (``--attention class``). It prints the time of the run (model built
beforehand), its ratio to the block outputs' (goal: at most 1.3x), and the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_bench import make_images  # noqa: E402

_CHILD = """
import json, resource, sys, time
import hookcli
paths, variant, batch, device = json.loads(sys.argv[1])
model = hookcli.load_model("vit_b_16", "none")
blocks = [f"encoder.layers.encoder_layer_{n}" for n in range(12)]
if variant == "outputs":
    asked = {"capture": "output"}
else:
    blocks = [f"{block}.self_attention" for block in blocks]
    asked = {"capture": "attention", "attention": variant}
hookcli.extract(model, blocks, paths[:batch], batch_size=batch, device=device, **asked)  # warm-up
start = time.perf_counter()
found = hookcli.extract(model, blocks, paths, batch_size=batch, device=device, **asked)
seconds = time.perf_counter() - start
kept = sum(found[key].numel() * found[key].element_size() for key in found.keys())
print(json.dumps({"seconds": seconds, "kept": kept, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(p) for p in make_images(Path(tmp), args.images)]
        print(f"vit_b_16, 12 blocks, {args.images} images, batch {args.batch_size}, {args.device}")
        print(f"{'captured':34s} {'seconds':>8s} {'ratio':>6s} {'kept MiB':>9s} {'peak MiB':>9s}")
        base = None
        for variant, label in (("outputs", "block outputs"), ("all", "attention, all"), ("class", "attention, class")):
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, json.dumps([paths, variant, args.batch_size, args.device])],
                capture_output=True,
                text=True,
                check=True,
            )
            found = json.loads(done.stdout.strip().splitlines()[-1])
            base = base or found["seconds"]
            print(
                f"{label:34s} {found['seconds']:8.2f} {found['seconds'] / base:5.2f}x {found['kept'] / 2**20:9.1f} "
                f"{found['peak'] / 1024:9.0f}"
            )


if __name__ == "__main__":
    main()
