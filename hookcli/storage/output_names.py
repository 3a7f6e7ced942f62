"""What a safetensors output may be named: not a name that promises another format (``x.pt``, ``x.png``…).

>>> refuse_other_format("features.safetensors"), refuse_other_format("features")
(None, None)
>>> refuse_other_format("features.pt")
Traceback (most recent call last):
...
hookcli.errors.UsageProblem: output 'features.pt' ends in .pt, the suffix of another format. Hint: hookcli writes \
safetensors: name it 'features.safetensors', or end the path with / for a shard folder
"""

from __future__ import annotations

from pathlib import Path

from hookcli.errors import UsageProblem
from hookcli.inputs.names import IMAGE_SUFFIXES

__all__ = ["OTHER_FORMATS", "refuse_other_format"]

#: Suffixes of formats other than safetensors (besides images'): an output file is refused under such a name.
OTHER_FORMATS = frozenset(
    {
        ".pt",
        ".pth",
        ".bin",
        ".ckpt",
        ".npy",
        ".npz",
        ".h5",
        ".hdf5",
        ".pkl",
        ".pickle",
        ".joblib",
        ".json",
        ".jsonl",
        ".csv",
        ".tsv",
        ".txt",
        ".parquet",
        ".arrow",
        ".feather",
        ".onnx",
        ".gguf",
        ".mat",
        ".zip",
        ".tar",
        ".gz",
        ".svg",
        ".pdf",
    }
)


def refuse_other_format(path: str, *, folders: bool = True) -> None:
    """What a file output holds is safetensors; a name that promises another format would mislead its reader.
    ``folders``: the command writes shard folders too (the hint offers one).

    Any other name is written as given, one without a suffix too.
    """
    suffix = Path(path).suffix
    if suffix.lower() in OTHER_FORMATS | IMAGE_SUFFIXES:
        folder = ", or end the path with / for a shard folder" if folders else ""
        raise UsageProblem(
            f"output '{path}' ends in {suffix}, the suffix of another format",
            hint=f"hookcli writes safetensors: name it '{Path(path).with_suffix('.safetensors')}'{folder}",
        )
