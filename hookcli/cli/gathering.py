"""The commands that gather over their inputs instead of storing rows: ``stats`` and ``compare``. Each runs a
model (as ``extract`` does) or reads saved features, parses its options and calls :mod:`hookcli.api`.
"""

from __future__ import annotations

import contextlib

import click

from hookcli.cli.app import main
from hookcli.cli.declared import (
    CONTEXT_SETTINGS,
    LAYER_HELP,
    clip_options,
    comparing_options,
    config_option,
    declared_option,
    model_options,
    preprocess_options,
    run_option,
    run_options,
    stats_choice_options,
)
from hookcli.cli.running import Reporter, given_options, library, run_command
from hookcli.options.compare import COMPARE_OPTIONS
from hookcli.options.declaring import declared as declared_in
from hookcli.options.grid import GRID_OPTIONS
from hookcli.options.run import SAVED_RUN_OPTIONS, SAVED_STATS_OPTIONS

__all__ = ["compare", "stats"]


def _model_run_options(command: str, *, written: str, stored: str):
    """What ``stats`` and ``compare`` take to run a model as extract does, and their one output file (``written``)."""

    def decorated(function):
        for decorator in reversed(
            [
                preprocess_options,
                click.option(
                    "--output",
                    "-o",
                    metavar="FILE",
                    help=f"{written} [<model>-<layer>.{command}.safetensors; of saved features, <their "
                    f"name>.{command}.safetensors].",
                ),
                run_option("shard_size", command),
                run_option("part", command),
                run_option("fuse"),
                clip_options,
                run_option("pair_with"),
                run_options(stored=stored),
            ]
        ):
            function = decorator(function)
        return function

    return decorated


def _saved_options(own: tuple[str, ...]) -> dict:
    """The options given for a run over saved features, which takes ``own`` (and ``-o``, ``-q``) only: any other
    given (a model's: ``--resize``, ``--device``…) is refused."""
    ctx = click.get_current_context()
    given = given_options(ctx)
    asked = [name for name in given if name not in (*own, "output", "quiet", "images")]
    if asked:
        raise click.UsageError(
            f"--{asked[0].replace('_', '-')} applies when --model runs a model; saved features are already computed"
        )
    return {name: ctx.params[name] for name in given if name in own}


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options(required=False)
@click.option("--layer", "-l", multiple=True, metavar="SELECTOR", help=LAYER_HELP)
@declared_option(declared_in("keys", GRID_OPTIONS), command="stats")
@stats_choice_options
@run_option("incomplete")
@_model_run_options("stats", written="Statistics file", stored="statistics are gathered in float64 from float32 values")
def stats(**options) -> None:
    """Statistics of each channel of layers over every input, in one pass: dataset examples, quantiles, PCA.

    With --model and --layer, the model runs over IMAGES (as for extract) and
    nothing but the statistics is kept; without --model, IMAGES is one source
    of saved features (a file, a shard folder or -), its tensors chosen with
    -k. For each layer key K of C channels the file holds K@count, K@mean,
    K@std, K@min, K@max and K@zeros (the share of exact zeros) over every
    value of each channel; K@quantiles at --quantiles; each channel's --top
    inputs with the highest maximum (or --top-by mean) of its map, with
    where the maximum is and the map itself (K@top_values, K@top_rows into
    the inputs, K@top_at, K@top_maps); and, unless --no-pca, the covariance
    of the channels pooled over positions and its principal components
    (K@cov, K@pca_values, K@pca_vectors). Memory does not grow with the
    number of inputs. Each shard's statistics are kept in FILE.parts/ until
    the last is done, so a run killed part-way continues where it stopped,
    and any number of processes may share one run (torchrun, Slurm, --part):
    they write the same file as one process. grid, report and info read it.

    \b
      hookcli stats -m resnet50 -l layer3 -l layer4 photos/ -o stats.safetensors
      hookcli stats -m vit_b_16 -l encoder.layers.encoder_layer_11 --top 16 --quantiles 0.5,0.995 photos/
      hookcli stats feats/ -k layer3 -o layer3.stats.safetensors
      torchrun --nproc-per-node 4 -m hookcli stats -m resnet50 -l layer4 --shard-size 2048 data.tar -o s.safetensors
    """
    images = options.pop("images")
    if options["model"] is not None:
        if not options["layer"]:
            raise click.UsageError("--layer is needed with --model (repeat it for more layers)")
        if options["keys"]:
            raise click.UsageError("-k chooses tensors of saved features; with --model choose layers with --layer")
        options.pop("keys")
        run_command("stats", options, options.pop("layer"), images)
        return
    chosen = _saved_options((*SAVED_STATS_OPTIONS, "keys"))
    if len(images) != 1:
        raise click.UsageError(f"give one source of saved features (a file, a folder or -), not {len(images)}")
    api = library()
    with contextlib.closing(Reporter(options["quiet"])) as reporter:
        api.stats(features=images[0], output=options["output"] or api.DEFAULT_OUTPUT, progress=reporter, **chosen)


@main.command(context_settings=CONTEXT_SETTINGS)
@config_option
@model_options(required=False)
@click.option("--layer", "-l", multiple=True, metavar="SELECTOR", help=LAYER_HELP)
@click.option(
    "--model2", metavar="NAME", help="A second model, run over the same images in one pass [the first model]."
)
@click.option(
    "--layer2", "layers2", multiple=True, metavar="SELECTOR", help="The second side's layers (as --layer) [--layer]."
)
@click.option(
    "--weights2",
    metavar="NAME|FILE",
    help="The second side's weights (as -w), which makes a second side of the same model if no --model2 is given [-w].",
)
@click.option(
    "--seed2", type=int, metavar="N", help="The second side's seed with --weights2 none (as --seed) [--seed]."
)
@declared_option(declared_in("keys", GRID_OPTIONS), command="compare")
@click.option(
    "--key2",
    "keys2",
    multiple=True,
    metavar="GLOB",
    help="Saved features: the tensors of the second side (of the second source, or of the one) [as -k].",
)
@click.option(
    "--merge",
    is_flag=True,
    help="IMAGES are linear-cka comparison files over disjoint inputs: merge them into one, as if one run had seen "
    "them all.",
)
@comparing_options
@run_option("incomplete")
@_model_run_options("compare", written="Comparison file", stored="similarities are computed in float64")
def compare(**options) -> None:
    """How alike layers and models are: CKA or RSA of every pair of representations.

    With --model and --layer, the model runs over IMAGES (as for extract);
    its layers are compared with themselves, or with --layer2 of --model2,
    run over the same images in one pass; -w and --seed are both models'
    unless --weights2 and --seed2 give the second its own (a trained model
    against its random start: -w DEFAULT --weights2 none). Without --model,
    IMAGES is one or two sources of saved features (files, shard folders,
    -), the same rows in the same order, their tensors chosen with -k and
    --key2. The file holds
    the matrix under the method's name, float64 [rows, columns], the labels
    in its rows and columns metadata. --method linear-cka (exact, from running
    sums; its sums are kept so that files over disjoint inputs merge),
    minibatch-cka (the unbiased estimator over the run's batches; maps whole
    by default) or rsa (RDMs of the first --rsa-rows inputs, compared by rank
    correlation). A representation with no spread has no CKA: its entries are
    NaN, and a note names it. Resumable and shared by many processes as stats
    is. --merge joins linear-cka files made over disjoint inputs.

    \b
      hookcli compare -m resnet18 -l 'layer*' photos/ -o cka.safetensors
      hookcli compare -m resnet18 -l layer4 --model2 resnet50 --layer2 'layer*' photos/ -o r18-r50.safetensors
      hookcli compare feats/ -k 'layer*' --method rsa --rsa-rows 500 -o rsa.safetensors
      hookcli compare a/ b/ -k layer4 --key2 'blocks.*' -o ab.safetensors
      hookcli compare --merge part1.safetensors part2.safetensors -o all.safetensors
    """
    images = options.pop("images")
    if options.pop("merge"):
        given = given_options(click.get_current_context())
        asked = [name for name in given if name not in ("merge", "output", "force", "quiet", "images")]
        if asked:
            raise click.UsageError(f"--merge takes comparison files, -o and --force alone, not --{asked[0]}")
        api = library()
        with contextlib.closing(Reporter(options["quiet"])) as reporter:
            api.compare(merge=list(images), output=options["output"] or "merged.compare.safetensors",
                        force=options["force"], progress=reporter)  # fmt: skip
        return
    if options["model"] is not None:
        if not options["layer"]:
            raise click.UsageError("--layer is needed with --model (repeat it for more layers)")
        if options["keys"] or options["keys2"]:
            raise click.UsageError("-k and --key2 choose tensors of saved features; with --model give --layer2")
        for name in ("weights2", "seed2"):
            if options[name] is None:
                options.pop(name)
        options.pop("keys"), options.pop("keys2")
        options["layers2"] = options["layers2"] or None
        run_command("compare", options, options.pop("layer"), images)
        return
    chosen = _saved_options((*SAVED_RUN_OPTIONS, *(option.name for option in COMPARE_OPTIONS), "keys", "keys2"))
    if not 1 <= len(images) <= 2:
        raise click.UsageError(f"give one or two sources of saved features (files, folders or -), not {len(images)}")
    api = library()
    with contextlib.closing(Reporter(options["quiet"])) as reporter:
        api.compare(
            features=images[0],
            features2=images[1] if len(images) == 2 else None,
            output=options["output"] or api.DEFAULT_OUTPUT,
            progress=reporter,
            **chosen,
        )
