"""Decode workers under every multiprocessing start method: ``fork`` (Linux before Python 3.14), ``forkserver``
(Linux from 3.14) and ``spawn`` (macOS, Windows), set per run here as a newer Python sets it by default."""

import subprocess
import sys
import textwrap
import warnings

from hookcli.console import notes_and_sigterm

_RUNS = textwrap.dedent("""
    import multiprocessing, os, sys
    import hookcli
    from hookcli.cli import main

    try:  # under pytest-xdist this process has a slice of the cores, where torch warns of two decode workers
        os.sched_setaffinity(0, range(os.cpu_count()))
    except (AttributeError, OSError):  # no affinity here, or cores this process may not have
        pass

    folder, photos = sys.argv[1], sys.argv[2:]
    for method in ("fork", "forkserver", "spawn"):
        multiprocessing.set_start_method(method, force=True)
        args = ["extract", "-m", "resnet18", "-w", "none", "-l", "layer1", "-l", "fc", "-j", "2", "-b", "2"]
        try:
            main([*args, "-o", f"{folder}/{method}.safetensors", *photos])
        except SystemExit as done:
            assert done.code in (0, None), (method, done.code)
    multiprocessing.set_start_method("forkserver", force=True)
    features = hookcli.extract("resnet18", "layer1", photos, weights="none", workers=2, batch_size=2)
    print("api", tuple(features["layer1"].shape))
""")


def test_decode_workers_give_the_same_bytes_under_fork_forkserver_and_spawn(tmp_path, make_image):
    photos = [str(make_image(tmp_path / f"{i}.png", size=(40, 36), seed=i)) for i in range(5)]
    done = subprocess.run(
        [sys.executable, "-c", _RUNS, str(tmp_path), *photos], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "api (5, 64, 56, 56)"
    assert "Error" not in done.stderr and "Note" not in done.stderr
    files = {method: (tmp_path / f"{method}.safetensors").read_bytes() for method in ("fork", "forkserver", "spawn")}
    assert files["fork"] == files["forkserver"] == files["spawn"]


def test_deprecations_are_no_notes_unless_debugging():
    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # as pytest and python -W default show them
        with notes_and_sigterm(said.append):
            warnings.warn("This process is multi-threaded, use of fork() may lead to deadlocks", DeprecationWarning)
            warnings.warn("`torch.jit.script_method` is deprecated", FutureWarning)
            warnings.warn("a hookcli note", UserWarning)
            warnings.warn(  # under a memory limit: the run goes on without CUDA, or fails in one line of its own
                "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 2: out of memory", UserWarning
            )
            warnings.warn(  # torch's compiler on a GPU, of the TF32 that --precision fp32 leaves off
                "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. Consider "
                "setting `torch.set_float32_matmul_precision('high')` for better performance.",
                UserWarning,
            )
            warnings.warn(  # torch's compiler on Python 3.13.0 (hookcli doctor says it)
                "Guards may run slower on Python 3.13.0. Consider upgrading to Python 3.13.1+.", RuntimeWarning
            )
    assert said == ["Note: a hookcli note"]
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, *rest: shown.append(str(message))
        with notes_and_sigterm(said.append, debug=lambda: True):
            warnings.warn("`torch.jit.script_method` is deprecated", DeprecationWarning)
    assert shown == ["`torch.jit.script_method` is deprecated"]
