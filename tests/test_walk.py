"""The road a run takes stays short: the walks of ``bench/walk_bench.py --road`` (the functions of ``hookcli.api`` and
the run layer's road entered by one call, and the ``return`` statements they hold) stay within half the rooms and a
quarter of the exits they had before the commands were objects (448b07c: 32 rooms and 59 exits for an extract in
memory, 34 and 57 for a comparison)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from walk_bench import WALKER  # noqa: E402


@pytest.mark.parametrize(("call", "rooms", "exits"), [("run_request", 16, 14), ("compare", 17, 14)])
def test_a_call_walks_at_most_half_the_rooms_and_a_quarter_of_the_exits_it_did(tmp_path, call, rooms, exits):
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(photo)
    done = subprocess.run(
        [sys.executable, "-c", WALKER, str(photo), call, "road"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-600:]
    walked = json.loads(done.stdout.strip().splitlines()[-1])
    assert walked["rooms"] <= rooms and walked["returns"] <= exits, walked
