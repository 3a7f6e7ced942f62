"""``hookcli rollout``: parses its options and calls :func:`hookcli.statistics.rollout.rollout`."""

from __future__ import annotations

from pathlib import Path

import click

from hookcli.cli.app import main
from hookcli.cli.declared import CONTEXT_SETTINGS

__all__ = ["rollout"]


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", metavar="FILE|DIR|-")
@click.option(
    "--key",
    "-k",
    "keys",
    multiple=True,
    metavar="KEY",
    help="A block's @attention key, or a pattern of them as grid -k takes (repeatable); taken in the file's order, "
    "which is the model's [every @attention key].",
)
@click.option(
    "--residual",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="The share of each token a block keeps (the residual connection): each block's mixing is "
    "(1 - R) x attention + R x identity, its rows summed to 1.",
)
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="The rollout's file [<file stem>.rollout.safetensors; stdin.rollout.safetensors].",
)
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing file.")
def rollout(file, keys, residual, output, force) -> None:
    """Combine a run's attention blocks into an attention rollout: a map an image.

    FILE holds the attention weights of a vision transformer's blocks, every
    token's (hookcli extract --capture attention, with --attention mean or
    all). Each block's heads are averaged, mixed with the identity as its
    residual connection does, and the blocks multiplied in order (Abnar and
    Zuidema, 2020); the class token's row is kept as rollout@attention
    [N, tokens], with FILE's metadata, so that grid draws it over each photo.

    \b
      hookcli extract -m vit_b_16 -l '**.self_attention' --capture attention --attention mean photos/ -o a.safetensors
      hookcli rollout a.safetensors -o r.safetensors
      hookcli grid r.safetensors --overlay
    """
    from hookcli.statistics.rollout import rollout as rolled  # torch

    stem = "stdin" if file == "-" else Path(file).name.removesuffix(".safetensors") or "rollout"
    target = output or f"{stem}.rollout.safetensors"
    click.echo(rolled(file, keys, residual=residual, output=target, force=force))
