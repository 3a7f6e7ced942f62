"""Render PNG pictures of saved features: one per (tensor, image).

:func:`plan_grids` picks tensors (``keys``, globs), images (``images``: row
index or input file name) and names each PNG
``<key>__<row>_<input name>.png`` (``….overlay.png`` for overlays) so a folder
sorts by tensor, then row. Every planned path is checked before anything is
drawn; :func:`write_grids` then reads one row at a time (only the channels it
draws) and writes each PNG atomically.

>>> from hookcli.store import Features
>>> features = Features({"x": np.ones((1, 4, 3, 3), dtype="float32")}, {"inputs": '["/photos/cat.jpg"]'})
>>> options = GridOptions(channels="0:2", title=False)
>>> jobs = plan_grids(features, options, "grids")
>>> [str(job.path) for job in jobs]
['grids/x__00000_cat.png']
>>> render_job(features, jobs[0], options).shape
(37, 72, 3)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hookcli.errors import FeatureFileError, UsageProblem, check_choice, check_whole
from hookcli.selectors import glob_to_regex
from hookcli.render import NotDrawable, add_title, as_maps, check_cmap, overlay, scale_maps, tile_maps
from hookcli.store import refuse_existing

__all__ = [
    "SCALES", "GridJob", "GridOptions", "default_grid_folder", "parse_channels", "plan_grids", "render_job",
    "safe_name", "write_grids",
]

SCALES = ("channel", "grid")

_UNSAFE = re.compile(r"[^A-Za-z0-9._@#+=-]+")
_LAYOUTS = {"tokens": "tokens as a square", "tokens+cls": "tokens as a square, class token left out",
            "matrix": "tokens x dims", "vector": "vector"}


def parse_channels(value) -> slice | None:
    """A channel selection as a slice: ``"A:B"`` (either end may be left out), one channel ``K``, or a slice."""
    if value is None or isinstance(value, slice):
        return value
    text = str(value).strip()
    try:
        if ":" not in text:
            index = int(text)
            return slice(index, index + 1 if index != -1 else None)
        start, stop = text.split(":")
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(f"'{value}' is not a channel range; use A:B, A:, :B or one index K") from None


def default_grid_folder(source) -> str:
    """Where grid writes when no folder is given: ``<file stem>_grids``, or ``grids`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "grids"
    return f"{Path(source).name.removesuffix('.safetensors') or 'features'}_grids"


@dataclass(frozen=True)
class GridOptions:
    """How to draw: which tensors and images, which channels, and the look of the grid.

    ``keys`` and ``images`` take one value or a list; ``channels`` a slice,
    ``"A:B"`` or one channel. Values are checked here, with the library's errors.
    """

    keys: Sequence[str] = ()
    images: Sequence[str] = ()
    channels: slice | None = None
    top: int | None = None
    columns: int | None = None
    padding: int = 2
    cmap: str = "viridis"
    scale: str = "channel"
    min_tile: int = 32
    title: bool = True
    overlay: bool = False
    alpha: float = 0.5
    overlay_cmap: str = "inferno"

    def __post_init__(self) -> None:
        for name in ("keys", "images"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str | int) else tuple(value))
        object.__setattr__(self, "images", tuple(str(i) for i in self.images))
        try:
            object.__setattr__(self, "channels", parse_channels(self.channels))
        except ValueError as err:
            raise UsageProblem(f"invalid channels: {err}") from None
        for name, low in (("top", 1), ("columns", 1), ("padding", 0), ("min_tile", 1)):
            check_whole(name, getattr(self, name), low, optional=True)
        check_choice("scale", self.scale, SCALES)
        if not 0 <= self.alpha <= 1:
            raise UsageProblem(f"alpha must be between 0 and 1, not {self.alpha!r}")


@dataclass
class GridJob:
    """One PNG to draw: tensor ``key``, row ``row`` (input ``name``), written to ``path``."""

    key: str
    row: int
    name: str
    path: Path
    source_image: str | None = field(default=None, repr=False)


def plan_grids(features, options: GridOptions, out_dir: str | Path, *, force: bool = False) -> list[GridJob]:
    """List the PNGs to write; refuses unknown keys, bad image indices and existing files (unless ``force``)."""
    check_cmap(options.overlay_cmap if options.overlay else options.cmap)
    keys = _select_keys(features.keys(), options.keys, features.name)
    inputs = _inputs(features.metadata)
    rows = max((features.shape(k)[0] for k in keys if features.shape(k)), default=0)
    names = inputs if len(inputs) == rows else [f"row{i:05d}" for i in range(rows)]
    chosen_rows = _select_rows(options.images, names, rows)
    out_dir = Path(out_dir)
    suffix = ".overlay.png" if options.overlay else ".png"
    jobs = []
    for key in keys:
        for row in chosen_rows:
            if not features.shape(key) or row >= features.shape(key)[0]:
                continue
            stem = Path(names[row]).stem if names[row] else f"row{row:05d}"
            path = out_dir / f"{safe_name(key)}__{row:05d}_{safe_name(stem)}{suffix}"
            source = inputs[row] if len(inputs) == rows else None
            jobs.append(GridJob(key, row, Path(names[row]).name, path, source))
    if options.overlay and jobs and any(job.source_image is None for job in jobs):
        raise UsageProblem(
            f"--overlay needs the input images, and '{features.name}' does not list them",
            hint="overlays work on files written by hookcli extract, whose 'inputs' metadata names the images",
        )
    refuse_existing([job.path for job in jobs], force=force)
    return jobs


def safe_name(text: str) -> str:
    """``text`` for a file name: runs of characters other than letters, digits and ``._@#+=-`` become ``_``."""
    return _UNSAFE.sub("_", text)


def _select_keys(available: list[str], patterns: Sequence[str], name: str) -> list[str]:
    if not available:
        raise FeatureFileError(f"'{name}' holds no tensors")
    if not patterns:
        return list(available)
    chosen = []
    for pattern in patterns:
        regex = glob_to_regex(pattern)
        found = [k for k in available if regex.fullmatch(k)]
        if not found:
            import difflib

            closest = difflib.get_close_matches(pattern, available, n=3, cutoff=0.0)
            raise UsageProblem(
                f"no tensor '{pattern}' in '{name}' (closest: {', '.join(closest)})",
                hint="'hookcli info' lists the keys",
            )
        chosen.extend(k for k in found if k not in chosen)
    return chosen


def _inputs(metadata) -> list[str]:
    try:
        inputs = json.loads(metadata.get("inputs", "[]"))
    except ValueError:
        return []
    return [str(p) for p in inputs] if isinstance(inputs, list) else []


def _select_rows(wanted: Sequence[str], names: list[str], rows: int) -> list[int]:
    if not wanted:
        return list(range(rows))
    chosen = []
    for item in wanted:
        if re.fullmatch(r"-?\d+", item):
            index = int(item)
            if not -rows <= index < rows:
                raise UsageProblem(
                    f"image index {index} is out of range: the file has {rows} image{'s' if rows != 1 else ''}",
                    hint=("the file has no rows" if not rows else "use 0, or the input's file name" if rows == 1
                          else f"use 0 to {rows - 1}, or an input file name"),
                )
            found = [index % rows]
        else:
            found = [i for i, n in enumerate(names) if item in (n, Path(n).name, Path(n).stem)]
            if not found:
                raise UsageProblem(f"no image named '{item}' in the file",
                                   hint="give a row index or an input's file name ('hookcli info' lists them)")
        chosen.extend(i for i in found if i not in chosen)
    return chosen


def render_job(features, job: GridJob, options: GridOptions) -> np.ndarray:
    """Pixels for one job; raises :class:`~hookcli.render.NotDrawable` for shapes without a picture."""
    shape = features.shape(job.key)[1:]
    # Channel maps of [C, H, W] rows are read a range at a time; other layouts are sliced after reading.
    direct = options.channels is not None and options.top is None and len(shape) == 3
    values = features.read(job.key, job.row, options.channels if direct else None)
    maps, layout = as_maps(values)
    first = 0
    if options.channels is not None:
        first = options.channels.indices(shape[0] if direct else len(maps))[0]
        if not direct:
            maps = maps[options.channels]
    if len(maps) == 0:
        raise NotDrawable("no channels in the selected range")
    picked = f"channels {first}-{first + len(maps) - 1}" if len(maps) > 1 else f"channel {first}"
    if options.top is not None:
        means = np.nanmean(np.where(np.isfinite(maps), maps, np.nan).reshape(len(maps), -1), axis=1)
        order = np.argsort(-np.nan_to_num(means, nan=-np.inf), kind="stable")[: options.top]
        maps = maps[order]
        picked = f"top {len(maps)} by mean"
    if options.overlay:
        pixels = _overlay_pixels(features, job, maps, options)
        picked = f"mean of {picked}" if len(maps) > 1 else picked
    else:
        pixels = tile_maps(
            scale_maps(maps, options.scale), columns=options.columns, padding=options.padding, cmap=options.cmap,
            min_tile=options.min_tile, stretch_rows_only=(layout == "vector"),
        )
    if options.title:
        parts = [job.key, job.name, str(list(shape)), picked]
        pixels = add_title(pixels, parts + ([_LAYOUTS[layout]] if layout in _LAYOUTS else []))
    return pixels


def _overlay_pixels(features, job: GridJob, maps: np.ndarray, options: GridOptions) -> np.ndarray:
    from hookcli.images import load_rgb, model_view

    try:
        preprocess = json.loads(features.metadata.get("preprocess", "{}"))
    except ValueError:
        preprocess = {}
    photo = load_rgb(job.source_image)
    if {"resize", "crop"} <= preprocess.keys():
        photo = model_view(photo, resize=preprocess["resize"], crop=preprocess["crop"],
                           interpolation=preprocess.get("interpolation", "bilinear"))
    heat = np.nanmean(np.where(np.isfinite(maps), maps, np.nan), axis=0) if len(maps) > 1 else maps[0]
    return overlay(np.asarray(photo), heat, cmap=options.overlay_cmap, alpha=options.alpha)


def write_grids(
    features, jobs: Sequence[GridJob], options: GridOptions, *, force: bool = False,
    on_skip: Callable[[str], None] | None = None, on_written: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Render and write every job's PNG (atomically); undrawable tensors are reported through ``on_skip``."""
    from PIL import Image

    from hookcli.store import atomic_path

    written, skipped = [], set()
    for job in jobs:
        if job.key in skipped:
            continue
        try:
            pixels = render_job(features, job, options)
        except NotDrawable as reason:
            skipped.add(job.key)
            if on_skip is not None:
                on_skip(f"skipped '{job.key}' (shape {features.shape(job.key)}): {reason}")
            continue
        job.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(job.path, force=force) as temporary:
            # zlib level 1: a third of the default's time for files about a tenth larger.
            Image.fromarray(pixels).save(temporary, format="PNG", compress_level=1)
        written.append(job.path)
        if on_written is not None:
            on_written(job.path)
    return written
