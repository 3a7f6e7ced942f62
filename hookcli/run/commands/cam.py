"""``hookcli cam``: class-activation maps of one layer, kept as rows and drawn over each photo into a folder."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageProblem
from hookcli.families import FamilyTraits, square_input
from hookcli.files import check_folder_output, refuse_existing
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Asked, Parts, Planned, refuse_unsupported
from hookcli.run.commands.grad import EAGER, NO_GRADIENTS, Grad, gradient_target
from hookcli.run.outputs import DEFAULT_OUTPUT, model_label, refuse_overwriting_inputs
from hookcli.run.selectors import selected_layers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Cam"]


class Cam(Grad):
    """A gradient run of one layer (given, or the model's last spatial one) whose rows are its CAMs, written as
    ``cams.safetensors`` and a picture a photo and target in a folder (in memory: the rows alone)."""

    name = "cam"
    named = ""
    selects_layers = False
    stores_as_asked = False

    def output(self, output: Any, model_name: str, opts: RunOptions) -> tuple[str, str | None]:
        if output is None:
            return "memory", None
        path = str(f"{model_label(model_name)}-cam" if output is DEFAULT_OUTPUT else output)
        if path == "-":
            raise UsageProblem(
                "cam writes a folder (its maps and a picture an image), and '-' is standard output",
                hint="give -o DIR; hookcli grad -o - writes the gradients to standard output",
            )
        check_folder_output(path)
        refuse_existing([str(Path(path) / "cams.safetensors")], force=opts.force)
        return "cam", path

    def check(self, family: str, traits: FamilyTraits, opts: RunOptions) -> None:
        from hookcli.pictures.render import check_cmap  # matplotlib's colour maps: cam draws with it

        if not traits.cams:
            raise refuse_unsupported(self.name, family, NO_GRADIENTS[family])
        check_cmap(opts.cmap)

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        from hookcli.pictures.cams import cam_png_name
        from hookcli.run.gradients import CamForward
        from hookcli.statistics.units import known_units

        opts = asked.opts
        target, notes = gradient_target(loaded, opts)
        layer = _cam_layer(loaded, asked.layers, settings)
        if asked.kind == "cam":  # its pictures' names are known now: refuse any that would write over a file
            assert asked.path is not None and asked.rows is not None, "a cam run's request has its folder and rows"
            paths = asked.rows.paths
            names = [cam_png_name(i, p, k, target.count) for i, p in enumerate(paths) for k in range(target.count)]
            planned = [Path(asked.path) / "cams.safetensors", *(Path(asked.path) / n for n in names)]
            refuse_existing(planned, force=opts.force)
            refuse_overwriting_inputs(planned, paths)
        forward = functools.partial(
            CamForward,
            target=target,
            categories=loaded.categories,
            method=opts.method,
            scores=loaded.scores,
            prefix_tokens=loaded.prefix_tokens,
            square=square_input(settings.preprocess),
            width=known_units(loaded.module.get_submodule(layer)),
        )
        return Parts(
            {layer: "cam"},
            forward,
            {"target": target.describe(), "method": opts.method, "cam_layer": layer},
            target=target,
            notes=notes,
            compiled=EAGER if opts.compile else (),
            extras={"cam_look": {"method": opts.method, "alpha": opts.alpha, "cmap": opts.cmap}},
        )

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        from hookcli.pictures.cams import CamOverlays
        from hookcli.storage import writers

        if run.output.kind == "memory":
            return writers.MemoryWriter(run.record, run.inputs)
        path = run.output.named_path
        (layer,) = run.layers
        assert run.target is not None and run.cam_look is not None, "plan gives a cam run both"
        inner = writers.FileWriter(run.record, run.inputs, str(Path(path) / "cams.safetensors"), force=run.force)
        return CamOverlays(
            inner,
            run.inputs,
            path,
            preprocess=run.settings.preprocess,
            count=run.target.count,
            layer=layer,
            force=run.force,
            on_note=note,
            edits=[edit.intervention.written or edit.intervention.text for edit in run.settings.edits],
            **run.cam_look,
        )


def _cam_layer(loaded: LoadedModel, selector, settings: RunSettings) -> str:
    """The one layer a CAM is of: the one ``selector`` names, or the model's default."""
    from hookcli.run.batches import map_batch, natural_input
    from hookcli.run.gradients import default_cam_layer

    if selector:
        if not isinstance(selector, str):
            (selector,) = selector
        chosen = selected_layers(loaded, selector)
        if len(chosen) != 1:
            raise UsageProblem(
                f"cam takes one layer, and '{selector}' matches {len(chosen)}", hint="see 'hookcli cam --help'"
            )
        return next(iter(chosen))
    device = next(loaded.module.parameters()).device  # a model reused from an earlier run may be on a GPU
    example = natural_input(loaded.family, preprocess=settings.preprocess)
    return default_cam_layer(loaded, map_batch(example, lambda tensor: tensor.to(device)))
