"""``hookcli cam``: class-activation maps of one layer, kept as rows and drawn over each photo into a folder."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageProblem
from hookcli.files import check_folder_output, refuse_existing
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Planned, named_model, refuse_unsupported
from hookcli.run.commands.grad import NO_GRADIENTS, Grad
from hookcli.run.outputs import DEFAULT_OUTPUT, model_label, refuse_overwriting_inputs
from hookcli.run.selectors import resolve_layers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.families import FamilyTraits
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.targets import Target
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Cam"]


class Cam(Grad):
    """A gradient run of one layer (given, or the model's last spatial one) whose rows are its CAMs, written as
    ``cams.safetensors`` and a picture a photo and target in a folder (in memory: the rows alone)."""

    name = "cam"
    named = ""
    selects_layers = False
    stores_as_asked = False

    def output(self, output, model_name: str) -> tuple[str, str | None]:
        if output is None:
            return "memory", None
        return "cam", str(f"{model_label(model_name)}-cam" if output is DEFAULT_OUTPUT else output)

    def check_output(self, kind: str, path: str | None, opts: RunOptions) -> None:
        if kind == "cam":
            assert path is not None, "a cam run's output names its folder"
            check_folder_output(path)
            refuse_existing([str(Path(path) / "cams.safetensors")], force=opts.force)

    def check_family(self, family: str, traits: FamilyTraits) -> None:
        if not traits.cams:
            raise refuse_unsupported(self.name, family, NO_GRADIENTS[family])

    def check_options(self, opts: RunOptions) -> None:
        from hookcli.pictures.render import check_cmap

        check_cmap(opts.cmap)

    def parts(
        self, loaded: LoadedModel, layers: Any, settings: RunSettings, opts: RunOptions, target: Target | None
    ) -> tuple[dict[str, str], Callable[..., Any], dict[str, str]]:
        from hookcli.run.gradients import CamForward

        assert target is not None, "a cam run has a target"
        layer = _cam_layer(loaded, layers, settings)
        forward = functools.partial(
            CamForward,
            target=target,
            categories=loaded.categories,
            method=opts.method,
            scores=loaded.scores,
            prefix_tokens=loaded.prefix_tokens,
        )
        return {layer: "cam"}, forward, {"target": target.describe(), "method": opts.method, "cam_layer": layer}

    def check_planned(self, kind: str, path: str | None, paths, target: Target | None, opts: RunOptions) -> None:
        from hookcli.pictures.cams import cam_png_name

        if kind != "cam":
            return
        assert target is not None and path is not None, "a cam run has a target and a folder"
        names = [cam_png_name(i, p, k, target.count) for i, p in enumerate(paths) for k in range(target.count)]
        planned = [Path(path) / "cams.safetensors", *(Path(path) / n for n in names)]
        refuse_existing(planned, force=opts.force)
        refuse_overwriting_inputs(planned, paths)

    def extras(self, opts: RunOptions) -> Mapping[str, Any]:
        return {"cam_look": {"method": opts.method, "alpha": opts.alpha, "cmap": opts.cmap}}

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
            **run.cam_look,
        )

    def picture(self, writer: RowsWriter):
        return getattr(writer, "picture", None)


def _cam_layer(loaded: LoadedModel, selector, settings: RunSettings) -> str:
    """The one layer a CAM is of: the one ``selector`` names, or the model's default."""
    from hookcli.run.batches import map_batch, natural_input
    from hookcli.run.gradients import default_cam_layer

    if selector:
        if not isinstance(selector, str):
            (selector,) = selector
        chosen = resolve_layers(loaded.module, [selector], model_name=named_model(loaded))
        if len(chosen) != 1:
            raise UsageProblem(
                f"cam takes one layer, and '{selector}' matches {len(chosen)}", hint="see 'hookcli cam --help'"
            )
        return next(iter(chosen))
    device = next(loaded.module.parameters()).device  # a model reused from an earlier run may be on a GPU
    example = natural_input(loaded.family, preprocess=settings.preprocess)
    return default_cam_layer(loaded, map_batch(example, lambda tensor: tensor.to(device)))
