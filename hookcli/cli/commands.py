"""The commands: each parses its options, calls :mod:`hookcli.api` and prints what it reports.

:mod:`hookcli.api` is imported when a command runs (``--help`` and the
refusals made while parsing go without it), and loads the heavier layers
(numpy, Pillow, torch) when the command needs them, so ``models`` and the
refusals made while checking answer without them, and a command loads only
what it uses (``info`` and ``grid`` never load torch).
"""

from __future__ import annotations

import contextlib
import json

import click

from hookcli.cli import printing
from hookcli.cli.app import main
from hookcli.cli.declared import (
    CONTEXT_SETTINGS,
    LAYER_HELP,
    REGION,
    clip_options,
    config_option,
    grid_drawing_options,
    model_options,
    preprocess_options,
    rows_output_options,
    run_option,
    run_options,
)
from hookcli.cli.running import Reporter, library, run_command
from hookcli.families import FAMILIES
from hookcli.models.specs import LISTED_SOURCES

__all__ = ["cam", "extract", "grad", "grid", "info", "layers", "models", "report"]


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("pattern", required=False)
@click.option(
    "--source",
    type=click.Choice(LISTED_SOURCES),
    default="torchvision",
    show_default=True,
    help="Where the models come from.",
)
@click.option("--family", type=click.Choice(FAMILIES), help="Only the models of this family.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def models(pattern: str | None, source: str, family: str | None, as_json: bool) -> None:
    """List the models hookcli can load, their family and their weights.

    Every torchvision family: classification, detection (and instance
    segmentation, keypoints), segmentation, video, optical_flow and quantized
    (CPU only). Read from a cache of torchvision's model registry, models.json
    in $HOOKCLI_CACHE_DIR (default $XDG_CACHE_HOME/hookcli or
    ~/.cache/hookcli), without importing torch; it is rebuilt when
    torchvision changes.

    --source timm lists timm's architectures and their pretrained tags,
    --source open_clip OpenCLIP's; --source hf the models in the local
    Hugging Face cache. PATTERN is a glob on the name (timm's own syntax for
    timm: 'vit_*', '*dino*').

    \b
      hookcli models --family video
      hookcli models --source timm 'convnext_*'
      hookcli models --json | python -c 'import json,sys; print(len(json.load(sys.stdin)))'
    """
    rows = library().models(family, pattern=pattern, source=source)
    if not rows:
        from hookcli.models.catalog import no_models_note  # loaded already, by hookcli.api

        click.echo(f"Note: {no_models_note(source, pattern, family)}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [("model", "family", "weights")]
    table += [(r["model"], r["family"], _weights_cell(r)) for r in rows]
    for line in printing.table_lines(table):
        click.echo(line)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the checks.")
def doctor(as_json: bool) -> None:
    """Check the install: Python, torch and torchvision together, the GPUs, the extras.

    torch and torchvision must be builds made for each other: torchvision runs
    one of its operators to show it. A pair taken from two indexes (a CPU
    torch, a CUDA torchvision) fails here with what to install, rather than in
    the first command. Each line says ok, -- (optional, absent) or FAILED;
    the exit code is 1 when a check fails.

    \b
      hookcli doctor
      hookcli doctor --json
    """
    checks = library().doctor()
    failed = [check["name"] for check in checks if check["ok"] is False]
    if as_json:
        click.echo(json.dumps(checks, indent=2))
    else:
        marks = {True: "ok", None: "--", False: "FAILED"}
        rows = [
            (marks[check["ok"]], check["name"], check["detail"] + (f". Hint: {check['hint']}" if check["hint"] else ""))
            for check in checks
        ]
        for line in printing.table_lines(rows):
            click.echo(line)
    if failed:
        count = f"{len(failed)} check{'s' if len(failed) > 1 else ''}"
        said = "its hint" if as_json else "its line above"
        raise click.ClickException(f"{count} failed: {', '.join(failed)}. Hint: {said} says what to do")


def _weights_cell(row: dict) -> str:
    if not row["weights"]:
        return "none (random only)"
    if row["weights"] == [row["default"]]:
        return row["default"]
    shown = row["weights"][:6]
    more = f" +{len(row['weights']) - len(shown)} more" if len(row["weights"]) > len(shown) else ""
    return f"{' '.join(shown)}{more} (default {row['default']})"


@main.command(context_settings=CONTEXT_SETTINGS)
@model_options(weights="none")
@click.option("--input-size", type=click.IntRange(min=1), help="Side of the square dummy input [weights' crop size].")
@click.option("--frames", type=click.IntRange(1, 1024), help="Frames of the dummy clip of a video model [16].")
@click.option("--depth", type=click.IntRange(min=1), help="Only paths with at most this many components.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.option("--nl", "as_nl", is_flag=True, help="Newline-delimited JSON, one layer per line.")
def layers(model, weights, seed, input_size, frames, depth, as_json, as_nl) -> None:
    """List every layer --layer accepts, in forward order, with output shapes.

    Shapes come from one forward of the family's input, all zeros, batch 1: an
    image; for detection a list of one image; for video a clip; for optical
    flow a pair of frames. Layers the model
    never calls in eval mode come last, with calls 0. Weights do not change the
    layout, so random ones (the default here) describe it without a download.

    \b
      hookcli layers --model resnet50 --depth 2
      hookcli layers --model vgg16_bn --weights none --nl | grep BatchNorm
    """
    if as_json and as_nl:
        raise click.UsageError("--json and --nl cannot be used together")
    rows = library().layers(model, weights=weights, seed=seed, input_size=input_size, depth=depth, frames=frames)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    elif as_nl:
        for r in rows:
            click.echo(json.dumps(r.to_dict()))
    else:
        table = [("path", "type", "output", "params", "calls")]
        for r in rows:
            shape = json.dumps(r.output).replace(" ", "") if r.output is not None else "-"
            table.append((r.path, r.type, shape, f"{r.params:,}", str(r.calls)))
        for line in printing.table_lines(table, right=(3, 4)):
            click.echo(line)


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=LAYER_HELP)
@run_option("capture")
@run_option("attention")
@preprocess_options
@rows_output_options
@run_option("pool")
@run_option("grid")
@run_option("fuse")
@clip_options
@run_option("pair_with")
@run_option("flow")
@run_option("detections")
@run_options
def extract(**options) -> None:
    """Capture layers of a model on images and save them to safetensors.

    IMAGES are files, folders (--recursive for sub-folders) or - to read image
    paths from stdin, one per line. Rows follow input order. The written path is
    printed on stdout (with -o - the file's bytes are). For video models they
    are videos (files, or folders of frames), and a row is a clip; for optical
    flow a row is a pair of frames of a video.

    With -o DIR/ rows stream into shards of --shard-size images plus an index,
    DIR/index.jsonl, and memory stays flat however many images there are.
    Running the same command again after an interruption continues where it
    stopped. Any number of processes may run the same command on one folder
    (torchrun, srun, job arrays, or shells): each computes the shards it
    claims.

    \b
      hookcli extract --model vgg16_bn --layer features.18 img.jpg
      hookcli extract -m resnet50 -l 'layer3.*.conv2' -l avgpool=pooled photos/ -o feats.safetensors
      find photos -name '*.jpg' | hookcli extract -m resnet50 -l layer3 --pool avg - -o feats/
      hookcli extract --config configs/vgg16_bn-features18.toml img.jpg --grid grids/
      hookcli extract -m r3d_18 -l layer3 --clip-length 16 --clips-per-video 4 walk.mp4
      hookcli extract -m fasterrcnn_resnet50_fpn -l backbone.body.layer3 --detections street.jpg
      torchrun --nproc-per-node 8 -m hookcli extract -m resnet50 -l avgpool data-{00..99}.tar -o feats/
    """
    run_command("extract", options, options.pop("layer"), options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option("--layer", "-l", multiple=True, required=True, metavar="SELECTOR", help=LAYER_HELP)
@run_option("target", "grad")
@preprocess_options
@rows_output_options
@clip_options
@REGION
@run_options
def grad(**options) -> None:
    """Save layer activations and the gradient of a target logit with respect to them.

    Keys are <layer> (the activation) and <layer>@grad (d logit / d activation;
    <layer>@grad#k for each of topK); the metadata lists each image's targets
    with logit and probability. The gradient is exact also when in-place
    operations follow the layer. Inputs, outputs and options as for extract.

    \b
      hookcli grad -m resnet50 -l layer4 --target top1 img.jpg
      hookcli grad -m vgg16_bn -l features.40 --target 'golden retriever' photos/ -o grads/
    """
    run_command("grad", options, options.pop("layer"), options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option(
    "--layer",
    "-l",
    metavar="PATH",
    help="Layer to take the map at [the last convolutional stage; ViT: the last block's ln_1].",
)
@run_option("method")
@run_option("target", "cam")
@click.option("--output", "-o", metavar="DIR", help="Folder for cams.safetensors and the overlay PNGs [<model>-cam].")
@run_option("alpha")
@run_option("cmap")
@REGION
@preprocess_options
@run_options(stored="the maps are stored as float32")
def cam(**options) -> None:
    """Class-activation maps (Grad-CAM and friends) with an overlay PNG per image.

    Writes DIR/cams.safetensors (key cam: [N, h, w] maps at the layer's
    resolution, ReLU'd, not normalised; cam#k for each of topK; targets with
    logits and probabilities in the metadata) and DIR/<index>_<name>.png: the
    map upsampled over the image the model saw, captioned with the class and
    its score. Written paths are printed. Detection models: the map of a
    detection's score, drawn with its box; segmentation models: of a class's
    mask (or of the class over --region).

    \b
      hookcli cam -m resnet50 img.jpg -o cams/
      hookcli cam -m vit_b_16 --method gradcam++ --target 'tabby cat' photos/ -o cams/
      hookcli cam -m fasterrcnn_resnet50_fpn --target top3 street.jpg -o cams/
      hookcli cam -m deeplabv3_resnet50 --target person --region 0,0,0.5,1 group.jpg -o cams/
    """
    run_command("cam", options, options.pop("images"))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--json", "as_json", is_flag=True, help="Everything as one JSON object.")
@click.option(
    "--no-stats",
    is_flag=True,
    help="Skip min/mean/max/zeros (reads no tensor data; of a statistics or comparison file, what its checks read).",
)
def info(file, as_json, no_stats) -> None:
    """Show the tensors, metadata and value statistics of a safetensors file.

    Statistics (min, mean and max over finite values, share of zeros, count of
    NaN/inf) are read a row at a time. A statistics file (hookcli stats) is checked,
    then shown by its layers: layout, channels, positions, values a channel and
    examples kept, and a summary of each layer's channels (lowest, mean and highest
    value, share of zeros, channels zero everywhere, principal components that
    explain 90% of the variance). A comparison file is checked, then shown with its
    matrix. DIR is a shard folder written with extract -o DIR/ (or its index.jsonl);
    - reads a file from stdin. Control characters in names and metadata are shown
    escaped (\\x1b, \\n). --json is strict JSON: NaN and ±inf (in metadata) are the
    strings "NaN", "Infinity" and "-Infinity".

    \b
      hookcli info vgg16_bn-features.18.safetensors
      hookcli extract -m resnet18 -l layer4 img.jpg -o - | hookcli info - --json
    """
    described = library().info(file, stats=not no_stats, progress=Reporter(quiet=True))
    if as_json:
        click.echo(printing.info_json(described))
        return
    for line in printing.info_lines(described, stats=not no_stats):
        click.echo(line)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--output", "-o", metavar="DIR", help="Folder for the PNGs [<file stem>_grids].")
@grid_drawing_options("grid")
@click.option("--force", "-f", is_flag=True, help="Overwrite existing PNGs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def grid(file, output, quiet, **options) -> None:
    """Render feature-map grids (PNG) from a safetensors file, one per tensor and image.

    [N, C, H, W] tensors become tiled channel maps, each numbered with its
    channel, [N, T, D] ViT tokens are folded back to a square grid (class token
    dropped), [N, D] vectors and [N, C, 1, 1] pooled channels become a strip of
    values. [N, C, T, H, W] video clips become a table, a row per channel and a
    column per frame (--frame T: that frame's channel maps). In a file of the
    optical_flow family, [N, 2, H, W] flow fields are drawn in colour: the hue
    is the direction, white to full colour the length, with a colour wheel. Rows
    of their own sizes (detection, segmentation) are each drawn at their own
    size, and a detection file's final detections (extract --detections) as one
    picture an image: the boxes over the photo, each with its class index and
    score. A colour bar states the scale. Layers of maps wider than 64 channels
    draw their first 64 unless --channels or --top says otherwise (a vector is
    drawn whole, as one strip of its values). A statistics file
    (hookcli stats) gives a picture a layer and channel: its dataset examples,
    each input's photo as the model saw it with the channel's map over it and
    the map's largest value ringed. A comparison file (hookcli compare) gives
    one heatmap of its matrix, named after the file: <file stem>.png (-k chooses
    representations).
    Written paths are printed, one per line. DIR is a shard folder written with
    extract -o DIR/ (or its index.jsonl); - reads a file from stdin.

    \b
      hookcli grid vgg16_bn-features.18.safetensors --channels 0:64 --cmap gray
      hookcli grid feats.safetensors -k 'layer3*' -i 0 --top 16 --overlay
      hookcli grid clips.safetensors -k layer2 --frame 3 --channels 0:16
      hookcli extract -m resnet18 -l layer2 img.jpg -o - | hookcli grid - -o grids/
    """
    with contextlib.closing(Reporter(quiet)) as reporter:
        api = library()
        api.grid(file, output=output or api.DEFAULT_OUTPUT, progress=reporter, **options)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option("--output", "-o", metavar="DIR", help="Folder for the pages [<file stem>_report].")
@click.option(
    "--page-size",
    type=click.IntRange(min=1),
    help="Images (rows) per page. [20] Of a statistics file: channels per page. [64]",
)
@grid_drawing_options("report")
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing report.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def report(file, output, page_size, quiet, **options) -> None:
    """Write a static HTML report: each image's pictures, statistics and targets, and the file's metadata.

    One page per --page-size images: DIR/index.html (with a summary of the file),
    then DIR/page-00002.html, … linked to each other. Pages stand alone (pictures
    embedded, nothing fetched) and open from file://. The path of index.html is
    printed. The options below are grid's; --image also takes a range A:B of row
    indices. A detection file's final detections are listed for each image (class
    index, score, box) beside their picture. A statistics file (hookcli stats) gives
    a page of each layer's channels at a time: a sortable table of them, its
    principal components, and each channel's quantiles and dataset examples. A
    comparison file (hookcli compare) gives one page: its heatmap and matrix.

    \b
      hookcli report feats.safetensors -o report/
      hookcli report feats/ -k layer3 -i 0:100 --top 16 --page-size 10
      hookcli cam -m resnet50 img.jpg -o cams/ && hookcli report cams/cams.safetensors
    """
    with contextlib.closing(Reporter(quiet)) as reporter:
        api = library()
        api.report(file, output=output or api.DEFAULT_OUTPUT, page_size=page_size, progress=reporter, **options)
