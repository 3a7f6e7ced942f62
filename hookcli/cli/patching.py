"""``hookcli patch``: parses its options and calls :func:`hookcli.api.patch`."""

from __future__ import annotations

import click

from hookcli.cli.app import main
from hookcli.cli.declared import (
    CONTEXT_SETTINGS,
    config_option,
    model_options,
    preprocess_options,
    run_option,
    run_options,
)
from hookcli.cli.running import run_command
from hookcli.errors import UsageProblem

__all__ = ["patch"]


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option(
    "--layer", "-l", "layers", multiple=True, required=True, metavar="LAYER", help="A layer to patch (repeatable)."
)
@click.option(
    "--pairs",
    metavar="FILE",
    help="The pairs: a line each, the source's path, a tab (or spaces, where neither path holds one), the "
    "target's; blank lines and lines starting with # are skipped.",
)
@click.option(
    "--pairs-from",
    nargs=2,
    metavar="SOURCES TARGETS",
    help="The pairs: the n-th image of SOURCES with the n-th of TARGETS, each folder's own images sorted by name "
    "(names need not match).",
)
@run_option("positions")
@preprocess_options
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="The effects' file [<model>-<layer>.patch.safetensors, or <model>-<n>layers.patch.safetensors]; its parts "
    "are kept beside it until it is complete.",
)
@run_option("shard_size", "patch")
@run_option("part", "patch")
@run_options(stored="the measures are float64, from float32 outputs", edited=False, paired=True)
def patch(**options) -> None:
    """Patch layers of each pair's target with its source's activations, and measure how far its output moves.

    For each pair (a source input, a target input) and each layer (with
    --positions, each position of it: a map's pixels, a sequence's tokens), the
    target runs with the layer's output taken from the source's. The measure is
    m = z[y_s] - z[y_t], the logit of the class predicted for the source less
    the one predicted for the target: LAYER@change is how much the patch moves
    m, LAYER@effect that change over m(source) - m(target) (0: nothing, 1: as
    far as the source), LAYER@mean_effect its mean over the pairs where it is
    defined. Batches and shards hold whole pairs: --batch-size and --shard-size
    must be even. The layers before a patched layer run once a batch, not once
    a patch. Like stats, it streams, resumes after an interruption, and any
    number of processes share one run and write the same file.

    \b
      hookcli patch -m resnet18 -l layer3 -l layer4 --pairs pairs.txt -o patch.safetensors
      hookcli patch -m resnet18 -l layer2 --positions --pairs-from clean/ corrupted/
    """
    pairs, pairs_from = options.pop("pairs"), options.pop("pairs_from") or None
    if (pairs is None) == (pairs_from is None):
        raise UsageProblem(
            "patch takes its pairs from --pairs FILE or --pairs-from SOURCES TARGETS: one of them",
            hint="hookcli patch --help shows both",
        )
    options["pairs_from"] = pairs_from
    run_command("patch", options, options.pop("layers"), pairs)
