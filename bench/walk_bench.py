"""How far a run walks through the code: this tree against another revision, side by side.

Run from the repository root:  python bench/walk_bench.py  [--base REV]

A walk is what ``sys.setprofile`` sees of the road a run takes (``hookcli/api.py`` and ``hookcli/run/``; the
forward's, decoder's and writers' own work is not counted) while one call runs, with one input so that no loop
repeats: the **rooms** are the distinct functions entered, the **returns** every return from one, and the
**climbs** the returns into a function of another module (control going back up to where it came from). Two calls
are walked, each in a fresh process of each tree: ``run_request`` (an ``extract`` of resnet18's ``layer1`` in
memory, the request checked beforehand) and ``compare`` (resnet18's ``layer1`` and ``layer2`` compared over the
same input). Decoding runs in this process (``workers=0``).

``--road`` walks the road alone: the engines a run calls along it (the forward, capture, decoding, speed, fusion,
device, team and launch modules of ``run/``) are left out, a room is a named function (comprehensions, inlined
from Python 3.12 on, are not rooms), and the returns are the ``return`` statements of the rooms entered: the exits
a reader follows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revision_bench import ROOT, checked_out, tree_environment  # noqa: E402

#: What each tree's process runs: the call walked, after everything before it has run once unwalked.
WALKER = r"""
import json, os, sys
import hookcli
from hookcli.run.request import request
from hookcli.run.execute import run_request

photo, which, road_only = sys.argv[1], sys.argv[2], sys.argv[3] == "road"
options = dict(weights="none", resize=32, crop=32, workers=0)
package = os.path.dirname(hookcli.__file__) + os.sep
road = (package + "api.py", package + "run" + os.sep)  # the road a run takes: the API and the run layer


def call():
    if which == "run_request":
        return run_request(request("extract", "resnet18", "layer1", [photo], **options))
    return hookcli.compare("resnet18", ["layer1", "layer2"], [photo], **options)


call()  # imports, caches and the model's first build, outside the walk
ENGINES = tuple(package + "run" + os.sep + name for name in (
    "batches", "capture", "speed", "fusion", "forwards", "selectors", "device", "team", "launch", "settings",
    "gradients", "targets", "layer_table", "environment", "edits", "ablation"))
rooms, returns, climbs = {}, 0, 0


def counted(code):
    if not code.co_filename.startswith(road):
        return False
    return not road_only or not (code.co_filename.startswith(ENGINES) or code.co_name.startswith("<"))


def profile(frame, event, arg):
    global returns, climbs
    if event not in ("call", "return") or not counted(frame.f_code):
        return
    if event == "call":
        rooms[(frame.f_code.co_filename, frame.f_code.co_qualname)] = frame.f_code.co_firstlineno
        return
    returns += 1
    caller = frame.f_back
    if caller is not None and caller.f_code.co_filename.startswith(road):
        climbs += caller.f_code.co_filename != frame.f_code.co_filename


def exits(path, line):  # the return statements of the function defined there, nested functions left out
    import ast

    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and line in (
            node.lineno, *(d.lineno for d in node.decorator_list)
        ):
            count, todo = 0, list(node.body)
            while todo:
                item = todo.pop()
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                count += isinstance(item, ast.Return)
                todo.extend(ast.iter_child_nodes(item))
            return count
    return 0


sys.setprofile(profile)
call()
sys.setprofile(None)
if road_only:
    returns = sum(exits(path, line) for (path, _), line in rooms.items())
print(json.dumps({"rooms": len(rooms), "climbs": climbs, "returns": returns}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with [HEAD~1]")
    parser.add_argument("--road", action="store_true", help="the road alone, its exits counted in the code")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookcli-walk-") as folder:
        work = Path(folder)
        photo = work / "photo.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(photo)
        with checked_out(args.base, work / "other") as other:
            trees = {"this tree": ROOT, args.base: other}
            print(f"{'walk':12s} {'':8s} {'this tree':>10s} {args.base:>12s}  ratio")
            for which in ("run_request", "compare"):
                walked = {label: _walk(tree, photo, which, work, args.road) for label, tree in trees.items()}
                for measure in ("rooms", "climbs", "returns"):
                    mine, theirs = (walked[label][measure] for label in trees)
                    print(f"{which:12s} {measure:8s} {mine:10d} {theirs:12d}  {mine / theirs:5.2f}x")


def _walk(tree: Path, photo: Path, which: str, work: Path, road: bool) -> dict:
    env = tree_environment(tree, work)
    done = subprocess.run(
        [sys.executable, "-c", WALKER, str(photo), which, "road" if road else "all"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{which} failed in {tree}: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
