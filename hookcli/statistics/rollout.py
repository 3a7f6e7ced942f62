"""Attention rollout (Abnar and Zuidema, 2020): how much each token's final representation draws on each input token,
through every block, from the blocks' attention weights.

For blocks 1…L with attention weights A_l (averaged over the heads), each block's mixing is
Â_l = ½ A_l + ½ I (the residual connection keeps half of each token), its rows renormalised to sum to 1, and the
rollout is R = Â_L · … · Â_1. Row 0 of R (the class token's, the first in a ViT) over the patches is what
``rollout`` maps.

>>> import torch
>>> uniform = torch.full((1, 2, 2), 0.5)
>>> attention_rollout([uniform, uniform])[0].tolist()
[[0.625, 0.375], [0.375, 0.625]]
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hookcli.errors import FeatureFileError, UsageProblem
from hookcli.files import check_writable
from hookcli.patterns import select_keys
from hookcli.storage.features import Features
from hookcli.storage.fileformat import FORMAT_VERSION
from hookcli.storage.output_names import refuse_other_format
from hookcli.storage.reader import FeatureReader
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shards import open_features

__all__ = ["attention_rollout", "rollout"]


def attention_rollout(blocks: Sequence[torch.Tensor], *, residual: float = 0.5) -> torch.Tensor:
    """The rollout ``[N, T, T]`` of ``blocks``' weights, first block first: each ``[N, heads, T, T]`` or, already
    averaged over the heads, ``[N, T, T]``; computed in float64."""
    rollout = None
    for weights in blocks:
        mixing = weights.double()
        if mixing.dim() == 4:
            mixing = mixing.mean(dim=1)
        eye = torch.eye(mixing.shape[-1], dtype=mixing.dtype, device=mixing.device)
        mixing = (1 - residual) * mixing + residual * eye
        mixing = mixing / mixing.sum(dim=-1, keepdim=True)
        rollout = mixing if rollout is None else mixing @ rollout
    if rollout is None:
        raise ValueError("a rollout needs the attention of one block at least")
    return rollout


def rollout(
    source: str | os.PathLike[str] | FeatureReader,
    keys: str | Sequence[str] = (),
    *,
    residual: float = 0.5,
    output: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Features | Path:
    """The attention rollout of the blocks a file of ``extract --capture attention`` holds, as a map per image: the
    first (class) token's row of :func:`attention_rollout` over ``keys``, stored as ``rollout@attention``
    ``[N, tokens]`` with the file's metadata, so that ``hookcli.grid`` draws it (over the photo with
    ``overlay=True``). ``keys``: the blocks' ``@attention`` keys, or patterns of them as ``grid`` takes; by default
    every one. They are taken in the file's order, which is the model's (``extract`` keeps the layers in the model's
    order), first block first. The weights
    must be every token's (``--attention mean``, or ``all``); they are read an image at a time. With ``output``, the
    file written (refused when it exists, unless ``force``), whose path is returned: ``hookcli rollout``.
    """
    if output is not None:
        check_writable(output, force=force)
        refuse_other_format(str(output), folders=False)
    if not 0 <= residual <= 1:
        raise UsageProblem(
            f"residual={residual}: a rollout keeps a share of each token, between 0 and 1", hint="0.5 is the paper's"
        )
    opened = open_features(source) if isinstance(source, str | os.PathLike) else contextlib.nullcontext(source)
    with opened as features:
        capture = str(features.metadata.get("capture", "output"))
        if not capture.startswith("attention"):
            raise UsageProblem(
                f"'{features.name}' holds no attention weights (its capture is {capture})",
                hint="capture them with hookcli extract --capture attention",
            )
        if features.metadata.get("prefix_tokens") == "0":
            raise UsageProblem(
                f"'{features.name}' is of a model with no class token before its patches, so its first token's row is "
                "a patch's",
                hint="a rollout maps the class token's row: give a file of a model that has one",
            )
        kept = capture.partition(":")[2] or "all"
        if kept.startswith("class"):
            raise UsageProblem(
                f"a rollout needs every token's attention, and '{features.name}' keeps the class token's row only "
                f"(--attention {kept})",
                hint="capture with --attention all or mean",
            )
        blocks = [key for key in features.keys() if key.endswith("@attention")]
        if not blocks:
            raise UsageProblem(
                f"'{features.name}' has no @attention key", hint="capture them with hookcli extract --capture attention"
            )
        patterns = [keys] if isinstance(keys, str) else list(keys)
        chosen = select_keys(blocks, patterns, features.name, what="@attention key")
        chosen.sort(key=blocks.index)  # the model's order, first block first, whatever the patterns' order
        shapes = {(features.shape(key)[0], *features.shape(key)[-2:]) for key in chosen}
        ranks = {len(features.shape(key)) for key in chosen}
        (rows, queries, tokens), *others = sorted(shapes)
        if others or not ranks <= {3, 4} or queries != tokens:
            raise UsageProblem(
                f"the blocks of '{features.name}' are not each image's weights over one set of tokens: "
                f"{', '.join(str(list(features.shape(key))) for key in chosen)}",
                hint="give the @attention keys of one model's blocks",
            )
        prefix = features.metadata.get("prefix_tokens")
        if prefix is not None and not (prefix.isascii() and prefix.isdecimal() and int(prefix) < tokens):
            raise FeatureFileError(
                f"'{features.name}' records {json.dumps(prefix)} tokens before its patches, and its blocks attend "
                f"over {tokens} tokens",
                hint="the file is damaged: capture the attention again with hookcli extract --capture attention",
            )
        maps = torch.empty(rows, tokens)
        for row in range(rows):  # a row of each block at a time: memory for one image's weights
            weights = [_weights(features, key, row) for key in chosen]
            maps[row] = attention_rollout(weights, residual=residual)[0, 0].float()
        metadata = {
            **features.metadata,
            "format": FORMAT_VERSION,  # one dense row an image
            "capture": "attention:class-mean",
            "rollout": json.dumps({"blocks": chosen, "residual": residual}),
        }
    if output is None:
        return Features({"rollout@attention": maps}, metadata, name=f"rollout of {features.name}")
    write_safetensors({"rollout@attention": maps}, metadata, output, force=force)
    return Path(output)


def _weights(features: FeatureReader, key: str, row: int) -> torch.Tensor:
    """Row ``row`` of block ``key``'s attention weights ``[1, ...]``, refused unless each query's weights are finite,
    not negative, and sum to 1 (to the rounding of the dtype stored), as a softmax's are."""
    weights = torch.as_tensor(np.asarray(features.read(key, row)))[None]
    if not weights.is_floating_point():
        problem = f"holds {str(weights.dtype).removeprefix('torch.')} values"
    elif not bool(torch.isfinite(weights).all()):
        problem = "holds NaN or infinite values"
    elif bool((weights < 0).any()):
        problem = "holds negative values"
    elif not torch.allclose(weights.double().sum(dim=-1), torch.ones((), dtype=torch.float64), atol=1e-2):
        problem = "holds weights that do not sum to 1 over the tokens"
    else:
        return weights
    raise FeatureFileError(
        f"'{key}' of '{features.name}' {problem} at row {row}: no attention weights",
        hint="the file is damaged: capture the attention again with hookcli extract --capture attention",
    )
