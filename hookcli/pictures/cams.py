"""CAM pictures: each class-activation map drawn over the image the model saw, as the batches of a ``cam`` run go
by (a writer of :mod:`hookcli.storage.writers`' interface that hands the rows on to another).

>>> cam_png_name(3, "/photos/cat.jpg", 1, 2)
'00003_cat.top2.png'
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from hookcli.errors import HookcliError
from hookcli.pictures.file_names import safe_name
from hookcli.pictures.photos import ModelPhotos, heat_picture
from hookcli.pictures.png import save_png
from hookcli.pictures.render import add_title
from hookcli.storage.features import FeatureFile
from hookcli.storage.recorded_run import lenient_json

__all__ = ["CamOverlays", "cam_png_name"]

#: What :func:`cam_png_name` names, the input's stem its group 1: a CAM picture, of this run or an earlier one.
_CAM_PNG = re.compile(r"[0-9]{5,}_(.*?)(?:\.top[0-9]+)?\.png")


def cam_png_name(index: int, path, k: int, count: int) -> str:
    """``<index>_<input stem>.png`` (``….top<k>.png`` for each of top K): a CAM overlay's file name."""
    return f"{index:05d}_{_stem(path)}" + (f".top{k + 1}" if count > 1 else "") + ".png"


def _stem(path) -> str:
    """What a CAM picture's name keeps of its input's: the index keeps names apart, the cap keeps them short."""
    return safe_name(Path(str(path)).stem)[:100]


def _drawn_for(maps: str | os.PathLike) -> set[str]:
    """The input stems of the run that wrote the maps file ``maps``, after which its pictures are named; none where
    there is no such file or it cannot be read (it is untrusted: nothing it names is removed then)."""
    try:
        with FeatureFile(maps) as earlier:
            inputs = lenient_json(earlier.metadata.get("inputs"))
    except (HookcliError, OSError):
        return set()
    return {_stem(path) for path in inputs if isinstance(path, str)} if isinstance(inputs, list) else set()


class CamOverlays:
    """Draws each batch's maps over the images the model saw as the batches go by; the rows go on to ``inner``.

    The photos come with the batches (``Batch.pictures``), made by
    ``picture`` where each image was decoded for the model, so that no image
    is decoded again for its picture: the run must be given ``picture``.
    ``written`` lists the inner writer's paths, then the PNGs. A map that is
    zero everywhere (no position raises the class's score) is reported
    through ``on_note`` and drawn as the photo alone, saying so. ``edits``: the ``--intervene`` specs of an edited
    run, which each caption names. The pictures are drawn under hidden names and take their own as the maps file
    is written: a run that fails or is stopped leaves the folder as it found it (and none, if it made it); one that
    completes with ``force`` removes an earlier run's pictures it did not draw again, which its maps no longer hold.
    """

    def __init__(
        self,
        inner,
        paths: Sequence,
        folder: str | os.PathLike,
        *,
        preprocess,
        count: int,
        method: str,
        layer: str,
        alpha: float = 0.5,
        cmap: str = "inferno",
        force: bool = False,
        on_note: Callable[[str], None] | None = None,
        edits: Sequence[str] = (),
    ) -> None:
        self.inner, self.paths, self.folder, self.edits = inner, paths, Path(folder), tuple(edits)
        self.picture, self.count, self.method, self.layer = ModelPhotos(preprocess), count, method, layer
        self.alpha, self.cmap, self.force, self.on_note = alpha, cmap, force, on_note
        self.pngs: list[Path] = []  # the pictures' names, each drawn under a hidden one (_drawn) until finish
        self.written: list[Path] = []
        self.made = False  # the folder is this run's
        self.earlier: set[str] = set()  # the input stems an earlier run's maps file names (its pictures' names)

    def begin(self, batch_size: int):
        self.made = not self.folder.exists()
        self.earlier = _drawn_for(self.inner.path) if self.force and not self.made else set()
        self.folder.mkdir(parents=True, exist_ok=True)
        order = self.inner.begin(batch_size)
        self.done, self.kept = self.inner.done, self.inner.kept
        return order

    @property
    def has_rows(self) -> bool:
        return self.inner.has_rows

    @property
    def complete(self) -> bool:
        return self.inner.complete

    @property
    def finisher(self) -> bool:
        return self.inner.finisher

    @property
    def inputs_done(self) -> int:
        return self.inner.inputs_done

    def add(self, batch) -> None:
        for row, index in enumerate(batch.indices):
            photo, scale = batch.pictures[index]
            for k, chosen in enumerate(batch.targets[row]):
                heat = batch.features["cam" if self.count == 1 else f"cam#{k}"][row].numpy()
                label, caption = _cam_caption(chosen)
                box = np.array([chosen["box"]]) * scale if chosen.get("box") else None  # pixels the model was given
                pixels, flat = heat_picture(photo, heat, cmap=self.cmap, alpha=self.alpha, what=self.method, boxes=box)
                if flat and self.on_note is not None:
                    self.on_note(f"{Path(self.paths[index]).name}, {label}: {flat}")
                pixels = add_title(
                    pixels, [*caption, f"{self.method} at {self.layer}", *(f"edited: {spec}" for spec in self.edits)]
                )
                path = self.folder / cam_png_name(index, self.paths[index], k, self.count)
                save_png(pixels, _drawn(path), force=True)
                self.pngs.append(path)
        self.inner.add(batch)

    def finish(self):
        result = self.inner.finish()
        for path in self.pngs:
            os.replace(_drawn(path), path)
        self.written = [*self.inner.written, *self.pngs]
        if self.force:
            self._remove_earlier({path.name for path in self.pngs})
        return result

    def _remove_earlier(self, drawn: set[str]) -> None:
        """Remove the pictures of the earlier run whose maps file this one replaced and that this one did not draw
        again (named after that run's inputs: a file of the user's is left), saying so."""
        named = ((p, _CAM_PNG.fullmatch(p.name)) for p in self.folder.iterdir() if p.name not in drawn)
        earlier = sorted(p for p, found in named if found is not None and found[1] in self.earlier)
        if earlier:
            for path in earlier:
                path.unlink(missing_ok=True)
            if self.on_note is not None:
                self.on_note(
                    f"removed {len(earlier)} picture{'s' if len(earlier) > 1 else ''} of an earlier run from "
                    f"'{self.folder}' ('{earlier[0].name}'{', …' if len(earlier) > 1 else ''}), whose maps "
                    "cams.safetensors no longer holds"
                )

    def abort(self) -> None:
        self.inner.abort()
        for path in self.pngs:
            _drawn(path).unlink(missing_ok=True)
        if self.made:
            with contextlib.suppress(OSError):  # left where something else was put there meanwhile
                self.folder.rmdir()


def _drawn(path: Path) -> Path:
    """Where the picture ``path`` is drawn until its run completes: a hidden name beside it."""
    return path.with_name(f".{path.name}.drawn")


def _cam_caption(chosen: Mapping) -> tuple[str, list[str]]:
    """``(label, caption lines)`` for a CAM target: a class's logit, a segmentation mask or a detection."""
    name = chosen.get("name")
    label = (
        f"{name} ({chosen['class']})"
        if name
        else (f"class {chosen['class']}" if chosen.get("class") is not None else "any class")
    )
    if "logit" in chosen:
        return label, [label, f"logit {chosen['logit']:.2f}", f"p {chosen['probability']:.1%}"]
    if "pixels" in chosen:
        over = "region" if chosen.get("region") else "mask"
        return label, [label, f"{over} of {chosen['pixels']} px", f"score {chosen['score']:.2f}"]
    if chosen.get("detection") is None:
        return label, [label, "no such detection: nothing to explain"]
    return label, [label, f"detection {chosen['detection']}", f"score {chosen['score']:.2f}"]
