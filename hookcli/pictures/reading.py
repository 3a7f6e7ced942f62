"""What pictures read of saved features: row names and selections, the shape a row is drawn at, and the
detections a detection model stored.

>>> list(select_rows(["1:3"], None, 5))
[1, 2]
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hookcli.errors import UsageProblem
from hookcli.families import channels_last_output, square_input
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.render import NotDrawable
from hookcli.storage.fileformat import DETECTIONS
from hookcli.storage.reader import FeatureReader
from hookcli.storage.recorded_run import recorded_edits

__all__ = [
    "BOXES",
    "DRAWN_DETECTIONS",
    "Detections",
    "channels_first",
    "channels_last",
    "detection_keys",
    "attention_drawn",
    "attention_label",
    "attention_maps",
    "drawn_row_shape",
    "drawn_shape",
    "edits_facts",
    "is_attention",
    "draws_flow",
    "frames_text",
    "input_names",
    "one_map_a_row",
    "read_detections",
    "recorded_categories",
    "recorded_prefix_tokens",
    "row_drawn",
    "select_rows",
    "target_box",
]


#: The ``family`` metadata of files whose ``[2, H, W]`` rows are optical-flow fields.
_FLOW_FAMILY = "optical_flow"


#: The ``family`` metadata of files whose ``detections#…`` keys are a detection model's final detections.
_DETECTION_FAMILY = "detection"


#: The key the detections picture is planned under; the other ``detections#…`` keys are drawn with it.
BOXES = f"{DETECTIONS}#boxes"


#: What the detections picture shows of them.
DRAWN_DETECTIONS = (BOXES, f"{DETECTIONS}#labels", f"{DETECTIONS}#scores")


#: The most class names read from a file (the metadata is untrusted).
_MOST_CATEGORIES = 100_000


def recorded_categories(metadata) -> list[str] | None:
    """The class names a file's metadata records for its weights, or None when it records none, or something that
    is not a list of names."""
    try:
        names = json.loads(metadata.get("categories", "null"))
    except (ValueError, RecursionError, TypeError):
        return None
    if not isinstance(names, list) or len(names) > _MOST_CATEGORIES or not all(isinstance(n, str) for n in names):
        return None
    return names or None


def recorded_prefix_tokens(metadata) -> int | None:
    """The ``prefix_tokens`` a file's metadata records (class and register tokens of a vision transformer), or None
    when it records none or something that is not a small whole number (the metadata is untrusted)."""
    text = metadata.get("prefix_tokens") if hasattr(metadata, "get") else None
    try:
        count = int(text) if isinstance(text, str) and text.strip().isdigit() else None
    except ValueError:
        return None
    return count if count is not None and count <= 4096 else None


def input_names(metadata, rows: int) -> list[str] | None:
    """The metadata's ``inputs``, one name a row, or None when it does not list ``rows`` names (read once for each
    text: a grid and a report ask several times, and a folder's list may hold millions)."""
    text = metadata.get("inputs", "[]")
    inputs = _names(text) if isinstance(text, str) else None
    return list(inputs) if inputs is not None and len(inputs) == rows else None


@functools.lru_cache(maxsize=4)
def _names(text: str) -> tuple[str, ...] | None:
    try:
        inputs = json.loads(text)
    except (ValueError, RecursionError, TypeError):
        return None
    return tuple(inputs) if isinstance(inputs, list) and all(isinstance(p, str) for p in inputs) else None


_ROW_RANGE = re.compile(r"(-?\d*):(-?\d*)")


def select_rows(wanted: Sequence[str], names: Sequence[str] | None, rows: int) -> Sequence[int]:
    """The rows ``wanted`` picks, in the order given and each once: row indices, input names, ranges ``A:B``.

    All rows when nothing is wanted. One range alone stays a ``range``, so a
    selection of a million rows costs nothing to hold.
    """
    if not wanted:
        return range(rows)
    if len(wanted) == 1 and _ROW_RANGE.fullmatch(wanted[0]):
        return _row_range(wanted[0], rows)
    chosen = {}
    found: Sequence[int]
    for item in wanted:
        if _ROW_RANGE.fullmatch(item):
            found = _row_range(item, rows)
        elif re.fullmatch(r"-?\d+", item):
            index = int(item)
            if not -rows <= index < rows:
                raise UsageProblem(
                    f"image index {index} is out of range: the file has {rows} image{'s' if rows != 1 else ''}",
                    hint=(
                        "the file has no rows"
                        if not rows
                        else "use 0, or the input's file name"
                        if rows == 1
                        else f"use 0 to {rows - 1}, or an input file name"
                    ),
                )
            found = [index % rows]
        else:
            found = [i for i, n in enumerate(names or ()) if item in (n, Path(n).name, Path(n).stem)]
            if not found:
                raise UsageProblem(
                    f"no image named '{item}' in the file",
                    hint="give a row index, a range A:B or an input's file name ('hookcli info' lists them)",
                )
        chosen.update(dict.fromkeys(found))
    return list(chosen)


def _row_range(text: str, rows: int) -> range:
    """Rows A to B - 1 of ``A:B`` as a Python slice takes them: ends may be negative, left out or past the file."""
    start, stop = (int(end) if end else None for end in text.split(":"))
    chosen = range(rows)[start:stop]
    if not chosen:
        images = f"{rows} image{'s' if rows != 1 else ''}"
        raise UsageProblem(
            f"image range '{text}' selects no images: the file has {images}",
            hint=f"A:B takes rows A to B-1, as a Python slice does; the rows are 0 to {rows - 1}"
            if rows
            else "the file has no rows",
        )
    return chosen


_CAM_KEY = re.compile(r"cam(#\d+)?")


def drawn_shape(features: FeatureReader, key: str) -> list[int]:
    """The shape ``key`` is drawn as: its own, except a CAM file's maps (``cam``, ``cam#k``: ``[N, h, w]``, one map a
    row), drawn as ``[N, 1, h, w]`` so that an ``h × w`` map is never read as ViT tokens, and an attention capture's
    weights, drawn as the class token's attention over the patches (:func:`attention_drawn`). A ragged key's is
    ``[N, *largest row]``; :func:`drawn_row_shape` gives each row's."""
    shape = list(features.shape(key))
    if is_attention(features, key):
        return [shape[0], *attention_drawn(features, shape[1:])]
    return [shape[0], 1, *shape[1:]] if one_map_a_row(features, key) else shape


def is_attention(features: FeatureReader, key: str) -> bool:
    """Whether ``key`` holds an attention module's weights (``--capture attention``)."""
    return key.endswith("@attention") and str(features.metadata.get("capture", "")).startswith("attention")


def attention_drawn(features: FeatureReader, row: Sequence[int]) -> list[int]:
    """``[heads (1 when averaged), h, w]``: what a row of attention weights is drawn as, the class token's (the first
    query's) attention to each patch, the patches folded back to the image's grid; NotDrawable when they do not fold."""
    kept = str(features.metadata.get("capture", "attention")).partition(":")[2] or "all"
    if not kept.startswith("class") and len(row) >= 2 and row[-2] != row[-1]:
        raise NotDrawable(f"its {row[-2]} queries attend to {row[-1]} other keys (cross-attention), not to the image")
    grid = _patch_grid(features, int(row[-1]))
    if grid is None:
        raise NotDrawable(
            f"its {row[-1]} keys are not the patches of an image of one size (a centre crop, or a resize to "
            "[height, width]) after a class token or none"
        )
    return [1 if kept.endswith("mean") else int(row[0]), grid[1], grid[2]]


def attention_label(features: FeatureReader) -> str | None:
    """What an attention key's one map is, where it is not one head's: ``rollout`` or ``heads' mean``; else None."""
    if "rollout" in features.metadata:
        return "rollout"
    return "heads' mean" if str(features.metadata.get("capture", "")).endswith("mean") else None


def attention_maps(features: FeatureReader, values: np.ndarray) -> np.ndarray:
    """A row of attention weights (as stored) as :func:`attention_drawn`'s maps."""
    kept = str(features.metadata.get("capture", "attention")).partition(":")[2] or "all"
    first = values if kept.startswith("class") else values[..., 0, :]  # the class token's query
    first = first[None] if kept.endswith("mean") else first
    grid = _patch_grid(features, first.shape[-1])
    assert grid is not None, "checked by attention_drawn"
    skip, height, width = grid
    return first[..., skip:].reshape(first.shape[0], height, width)


def _patch_grid(features: FeatureReader, keys: int) -> tuple[int, int, int] | None:
    """``(prefix tokens, rows, columns)`` of the patches among ``keys`` keys, or None: the prefix the file records
    (else 1 or 0) before a grid of the image's shape, where every input reaches the model at one size (a centre
    crop, or a resize to ``[height, width]``)."""
    try:
        preprocess = Preprocess.from_metadata(features.metadata.get("preprocess"))
    except ValueError:  # untrusted metadata that does not parse
        return None
    squashed = preprocess is not None and preprocess.kind == "classification" and not preprocess.crop
    if square_input(preprocess):
        shape: tuple[int, int] | None = None  # the grid is square, of any side
    elif squashed and preprocess is not None and isinstance(preprocess.resize, tuple):
        shape = preprocess.resize  # squashed to [height, width] (a shorter side resized gives each image its own)
    else:
        return None
    recorded = recorded_prefix_tokens(features.metadata)
    for skip in [n for n in (recorded, 1, 0) if n is not None]:
        patches = keys - skip
        side = math.isqrt(max(patches, 0))
        if shape is None and patches > 0 and side * side == patches:
            return skip, side, side
        height, width = shape or (0, 0)
        size = math.isqrt(height * width // patches) if patches > 0 else 0  # a patch's side, in pixels
        if size and size * size * patches == height * width and height % size == width % size == 0:
            return skip, height // size, width // size
    return None


def one_map_a_row(features: FeatureReader, key: str) -> bool:
    """Whether ``key`` is a CAM file's maps (``cam``, ``cam#k``: ``[N, h, w]``): one map a row, with no channels."""
    return "cam_layer" in features.metadata and _CAM_KEY.fullmatch(key) is not None and len(features.shape(key)) == 3


def drawn_row_shape(features: FeatureReader, key: str, row: int) -> list[int]:
    """The shape row ``row`` of ``key`` is drawn as (:func:`drawn_shape`): its own when ``key`` is ragged."""
    own = features.row_shape(key, row)
    if is_attention(features, key):
        return attention_drawn(features, own)
    return [1, *own] if one_map_a_row(features, key) else own


def detection_keys(features: FeatureReader, keys: Sequence[str]) -> list[str]:
    """The keys among ``keys`` that hold a detection model's final detections, in the order given.

    They are ``detections#boxes``, ``#labels``, ``#scores`` (and ``#masks``,
    ``#keypoints``, … for some models): one entry per detected object, a
    different number each image. None unless the file's ``family`` is
    ``detection``, so a layer named ``detections`` elsewhere stays a layer.
    """
    if features.metadata.get("family") != _DETECTION_FAMILY:
        return []
    return [key for key in keys if key.startswith(DETECTIONS + "#")]


@dataclass(frozen=True)
class Detections:
    """One image's final detections: ``boxes`` (float64 ``[K, 4]``: x1, y1, x2, y2 in the pixels of the image the
    model was given), and ``labels`` (class indices) and ``scores`` (``[K]`` each), None where the file has none."""

    boxes: np.ndarray
    labels: np.ndarray | None
    scores: np.ndarray | None


def read_detections(features: FeatureReader, row: int) -> Detections:
    """Row ``row``'s final detections, from a detection file's ``detections#…`` keys.

    Raises :class:`~hookcli.pictures.render.NotDrawable` when the file's rows are not
    ``[K, 4]`` boxes with K labels and K scores.

    >>> from hookcli.storage.features import Features
    >>> features = Features({"detections#boxes": np.array([[[1, 2, 30, 40]]], dtype="float32"),
    ...                      "detections#labels": np.array([[7]])}, {"family": "detection"})
    >>> found = read_detections(features, 0)
    >>> found.boxes.tolist(), found.labels.tolist(), found.scores
    ([[1.0, 2.0, 30.0, 40.0]], [7], None)
    """
    keys = set(features.keys())
    if BOXES not in keys:
        raise NotDrawable(f"there is no '{BOXES}'")
    boxes = np.asarray(features.read(BOXES, row), dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise NotDrawable(f"row {row} of '{BOXES}' is {list(boxes.shape)}, not [K, 4] boxes")
    found: dict[str, np.ndarray | None] = {}
    for name in ("labels", "scores"):
        key = f"{DETECTIONS}#{name}"
        value = np.asarray(features.read(key, row)) if key in keys else None
        if value is not None and value.shape != boxes.shape[:1]:
            raise NotDrawable(
                f"row {row} of '{key}' is {list(value.shape)}, not one value for each of its {len(boxes)} boxes"
            )
        found[name] = value
    labels = found["labels"]
    if labels is not None and labels.dtype.kind not in "iu":
        raise NotDrawable(f"'{DETECTIONS}#labels' holds {labels.dtype} values, not class indices")
    return Detections(boxes, labels, found["scores"])


def target_box(target: dict) -> np.ndarray | None:
    """The box (``[1, 4]``: x1, y1, x2, y2 in pixels of the image the model was given) of the detection a ``grad`` or
    ``cam`` target of a detection model names, or None where it names none or its box is not four finite numbers
    (targets come from the file's metadata, untrusted).

    >>> target_box({"detection": 2, "box": [1, 2.5, 30, 40]}).tolist(), target_box({"class": 3, "logit": 1.0})
    ([[1.0, 2.5, 30.0, 40.0]], None)
    """
    box = target.get("box")
    if not isinstance(box, list) or len(box) != 4:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in box):
        return None
    return np.array([box], dtype=np.float64)


def row_drawn(row: Sequence[int], options: GridOptions) -> tuple[list[int], int | None]:
    """``(the per-row shape drawn, the frame drawn or None)``: a video clip's ``[C, T, H, W]`` is the ``[C, H, W]`` of
    ``options.frame`` when one is given; NotDrawable when the clip has no such frame."""
    row = list(row)
    if options.frame is None or len(row) != 4:
        return row, None
    if options.frame >= row[1]:
        raise NotDrawable(f"--frame {options.frame} is out of range: it has {frames_text(row[1])}")
    return [row[0], *row[2:]], options.frame


def channels_last(features: FeatureReader, row: Sequence[int]) -> bool:
    """Whether rows of this shape are ``[H, W, C]`` maps (see :func:`hookcli.families.channels_last_output`): told
    only for a file whose preprocessing made every image square."""
    if len(row) != 3 or not channels_last_output([0, *row]):
        return False
    try:
        return square_input(Preprocess.from_metadata(features.metadata.get("preprocess")))
    except ValueError:  # untrusted metadata that does not parse: draw as stored
        return False


def channels_first(features: FeatureReader, shape: Sequence[int]) -> list[int]:
    """A tensor's shape as it is drawn: ``[N, H, W, C]`` rows (:func:`channels_last`) as ``[N, C, H, W]``."""
    shape = list(shape)
    return [shape[0], shape[3], shape[1], shape[2]] if channels_last(features, shape[1:]) else shape


def frames_text(frames: int) -> str:
    return "no frames" if frames == 0 else "one frame (0)" if frames == 1 else f"{frames} frames (0-{frames - 1})"


def draws_flow(features: FeatureReader, key: str, options: GridOptions) -> bool:
    """Whether ``key`` is drawn as optical flow: its rows are ``[2, H, W]`` and the file's metadata says
    ``"family": "optical_flow"``, and ``options.flow_as_channels`` does not ask for the two channels."""
    shape = features.shape(key)
    return (
        not options.flow_as_channels
        and features.metadata.get("family") == _FLOW_FAMILY
        and len(shape) == 4
        and shape[1] == 2
    )


def edits_facts(metadata) -> list[tuple[str, str]]:
    """A report summary's row naming the run's edits (:func:`recorded_edits`, each as its spec, what every number
    shown is the effect of); none for a run without them."""
    specs = "; ".join(recorded_edits(metadata))
    return [("edited (--intervene)", specs if len(specs) <= 300 else specs[:299] + "…")] if specs else []
