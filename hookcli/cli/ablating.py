"""``hookcli ablate``: parses its options and calls :func:`hookcli.api.ablate`."""

from __future__ import annotations

import click

from hookcli.cli.app import main
from hookcli.cli.declared import (
    CONTEXT_SETTINGS,
    clip_options,
    config_option,
    model_options,
    preprocess_options,
    run_option,
    run_options,
)
from hookcli.cli.running import run_command

__all__ = ["ablate"]


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options
@click.option("--layer", "-l", required=True, metavar="LAYER", help="The layer whose units are ablated, one by one.")
@run_option("units")
@run_option("how")
@run_option("effect_on")
@preprocess_options
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="The effects' file [<model>-<layer>.ablate.safetensors]; its parts are kept beside it until it is complete.",
)
@run_option("shard_size", "ablate")
@run_option("part", "ablate")
@clip_options
@run_options(stored="the effects are gathered in float64 from float32 outputs", edited=False)
def ablate(**options) -> None:
    """Ablate each unit of a layer alone, and measure what it does to the model's output over every input.

    For each unit: the mean and spread of the change of each input's predicted
    class's logit and probability (LAYER@logit_change, @prob_change and their
    _std), the share of inputs whose top class flips (LAYER@flips), the KL
    divergence of the output distribution (LAYER@kl), and each class's mean
    change (LAYER@class_effect, units x classes). The layers before LAYER run
    once a batch; the rest runs on the layer's output copied for each unit.
    Like stats, it streams, resumes after an interruption, and any number of
    processes share one run and write the same file.

    \b
      hookcli ablate -m resnet18 -l layer4 photos/ -o effects.safetensors
      hookcli ablate -m mobilenet_v2 -l features.14 --units 120:140 --how mean:f14.stats.safetensors photos/
    """
    run_command("ablate", options, options.pop("layer"), options.pop("images"))
