"""An attention module's weights (after softmax, ``[N, heads, queries, keys]``), computed from what the module
receives and its own projections, so that the model's forward keeps its fused kernel.

The kinds of module known (:func:`attention_kind`):

- ``torch``: :class:`torch.nn.MultiheadAttention` (torchvision's ViT and Swin-free blocks, OpenCLIP's towers);
  its ``attn_mask`` and ``key_padding_mask`` count, as torch's own ``need_weights=True`` counts them;
- ``timm``: timm's ``Attention`` (a ``qkv`` projection, ``q_norm`` and ``k_norm``, ``scale``), fused or not;
- ``hf``: Hugging Face's attention modules as transformers 5 writes them (``q_proj`` and ``k_proj`` projections,
  ``head_dim``, ``scaling``): ViT, DeiT, DINOv2, CLIP's towers, whatever attention function the model runs.

Only the queries and keys are projected again: the values, the output projection and the rest of the model are
not run twice.

>>> import torch
>>> attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
>>> x = torch.randn(3, 5, 8)
>>> weights = attention_weights(attention, (x, x, x), {})
>>> weights.shape, torch.allclose(weights.sum(-1), torch.ones(3, 2, 5))
(torch.Size([3, 2, 5, 5]), True)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hookcli.errors import UsageProblem
from hookcli.files import format_bytes
from hookcli.options.run import ATTENTION_KEEPS

__all__ = ["KEEPS", "KINDS", "MAX_ROW_BYTES", "attention_kind", "attention_weights", "check_attention"]

#: What of the weights a run keeps (``--attention``): all of them ``[heads, queries, keys]`` a row, the class
#: token's query only (``class``: ``[heads, keys]``, the first token's, where ViTs put their class token), the mean
#: over the heads (``mean``: ``[queries, keys]``), or both (``class-mean``: ``[keys]``).
KEEPS = ATTENTION_KEEPS
#: The most bytes of weights one row (one image) may compute, before what is kept is cut from them.
MAX_ROW_BYTES = 1 << 30

#: What each kind of attention module is, in words (for the refusal of a module of none of them).
KINDS = {
    "torch": "torch.nn.MultiheadAttention (torchvision's ViT, OpenCLIP)",
    "timm": "timm's Attention",
    "hf": "Hugging Face's attention (q_proj and k_proj: ViT, DeiT, DINOv2, CLIP)",
}


def attention_kind(module: nn.Module) -> str | None:
    """The kind of attention module ``module`` is (a key of :data:`KINDS`), or None."""
    if isinstance(module, nn.MultiheadAttention):
        return "torch"
    linear = nn.Linear
    if isinstance(getattr(module, "qkv", None), linear) and hasattr(module, "num_heads") and hasattr(module, "scale"):
        return "timm"
    if all(isinstance(getattr(module, name, None), linear) for name in ("q_proj", "k_proj")) and isinstance(
        getattr(module, "head_dim", None), int
    ):
        return "hf"
    return None


def check_attention(module: nn.Module, path: str) -> str:
    """The kind of ``module`` (the layer at ``path``); refused in one line when it is no attention module known, or
    one whose weights cannot be recomputed from its inputs."""
    kind = attention_kind(module)
    if kind is None:
        raise UsageProblem(
            f"--capture attention: '{path}' is a {type(module).__name__}, not an attention module hookcli knows "
            f"({', '.join(KINDS.values())})",
            hint="name the attention module itself (hookcli layers lists them: self_attention, attn, attention…)",
        )
    if kind == "torch" and (module.bias_k is not None or module.add_zero_attn or not module._qkv_same_embed_dim):
        raise UsageProblem(
            f"--capture attention: '{path}' adds key biases or zero attention, or projects keys of another size, "
            "which hookcli does not recompute",
            hint="capture its output, or its input with --capture input",
        )
    qkv: Any = getattr(module, "qkv", None)
    if kind == "timm" and (getattr(module, "q_bias", None) is not None or qkv.out_features % 3):
        raise UsageProblem(
            f"--capture attention: '{path}' projects its queries, keys and values in a way hookcli does not recompute",
            hint="capture its output, or its input with --capture input",
        )
    return kind


def attention_weights(
    module: nn.Module, args: tuple, kwargs: Mapping[str, Any], *, keep: str = "all", path: str = "the layer"
) -> torch.Tensor:
    """The weights ``module`` (of a kind :func:`check_attention` accepts) computes from ``args`` and ``kwargs``, the
    inputs of one of its calls: ``[N, heads, queries, keys]``, each row summing to 1; or what ``keep`` keeps of them
    (:data:`KEEPS`: with ``class`` only the first query is computed). Refused when one row's weights would take more
    than :data:`MAX_ROW_BYTES`."""
    kind = attention_kind(module)
    assert kind is not None, "checked by check_attention"
    first = keep.startswith("class")
    weights = _COMPUTE[kind](module, _bound(module, args, kwargs), 1 if first else None, path)
    if first:
        weights = weights[:, :, 0]
    return weights.mean(dim=1) if keep.endswith("mean") else weights


def _scores(q: torch.Tensor, k: torch.Tensor, queries: int | None, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries kept (the first ``queries``, or all) and the keys, once a row's weights are known to fit."""
    if queries is not None:
        q = q[..., :queries, :]
    heads, rows, keys = q.shape[1], q.shape[2], k.shape[2]
    size = heads * rows * keys * 4
    if size > MAX_ROW_BYTES:
        raise UsageProblem(
            f"--capture attention: one image's weights of '{path}' ({heads} heads x {rows:,} queries x {keys:,} keys) "
            f"take {format_bytes(size)}, more than hookcli computes a row ({format_bytes(MAX_ROW_BYTES)})",
            hint="keep the class token's row: --attention class (or class-mean)",
        )
    return q, k


def _queries(mask: Any, queries: int | None) -> Any:
    """A mask's rows for the queries kept."""
    if mask is None or queries is None or mask.dim() < 2 or mask.shape[-2] <= queries:
        return mask
    return mask[..., :queries, :]


def _bound(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, as the module's ``forward`` names them."""
    return dict(inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[N, T, heads·d]`` as ``[N, heads, T, d]``."""
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _softmax(scores: torch.Tensor, mask: Any = None) -> torch.Tensor:
    """Softmax over the keys, after ``mask`` (boolean: True is left out; or values added) where there is one."""
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)
    return scores.softmax(dim=-1)


def _torch(module: nn.MultiheadAttention, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:
    query, key = call["query"], call["key"]
    unbatched = query.dim() == 2
    if unbatched:
        query, key = (
            query.unsqueeze(1 if not module.batch_first else 0),
            key.unsqueeze(1 if not module.batch_first else 0),
        )
    if not module.batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    size, heads = module.embed_dim, module.num_heads
    weight, bias = module.in_proj_weight, module.in_proj_bias
    q = F.linear(query, weight[:size], None if bias is None else bias[:size])
    k = F.linear(key, weight[size : 2 * size], None if bias is None else bias[size : 2 * size])
    q, k = _scores(_heads(q, heads), _heads(k, heads), queries, path)
    scale = math.sqrt(1.0 / q.shape[-1])  # as torch scales the queries before the product
    scores = (q * scale) @ k.transpose(-2, -1)
    mask = _torch_mask(call, scores, query.shape[1])
    weights = _softmax(scores, mask)
    return weights[0] if unbatched else weights


def _torch_mask(call: dict[str, Any], scores: torch.Tensor, length: int) -> Any:
    """``attn_mask`` and ``key_padding_mask`` (and ``is_causal``'s mask) as one mask over ``scores`` (of the first
    queries of ``length``)."""
    batch, heads, queries, keys = scores.shape
    masks = []
    attn_mask = call.get("attn_mask")
    if attn_mask is None and call.get("is_causal"):
        attn_mask = torch.ones(length, keys, dtype=torch.bool, device=scores.device).triu(1)
    if attn_mask is not None:
        whole = attn_mask.reshape(batch, heads, length, keys) if attn_mask.dim() == 3 else attn_mask
        masks.append(_queries(whole, queries))
    padding = call.get("key_padding_mask")
    if padding is not None:
        masks.append(padding.reshape(batch, 1, 1, keys))
    if not masks:
        return None
    floats = [m if m.dtype != torch.bool else torch.zeros_like(m, dtype=scores.dtype).masked_fill(m, float("-inf"))
              for m in masks]  # fmt: skip
    return sum(floats[1:], floats[0])


def _timm(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # timm's Attention
    x = call["x"]
    heads = module.num_heads
    width = module.qkv.out_features // 3
    bias = module.qkv.bias
    qk = F.linear(x, module.qkv.weight[: 2 * width], None if bias is None else bias[: 2 * width])
    q, k = _heads(qk[..., :width], heads), _heads(qk[..., width:], heads)
    q, k = _scores(module.q_norm(q), module.k_norm(k), queries, path)
    scores = (q * module.scale) @ k.transpose(-2, -1)
    mask = call.get("attn_mask")
    if mask is None and call.get("is_causal"):
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=scores.device).triu(1)
    return _softmax(scores, _queries(mask, queries))


def _hf(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # transformers
    hidden = call["hidden_states"]
    size = module.head_dim
    heads = module.q_proj.out_features // size
    scale = getattr(module, "scaling", getattr(module, "scale", size**-0.5))
    q, k = _scores(_heads(module.q_proj(hidden), heads), _heads(module.k_proj(hidden), heads), queries, path)
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = _queries(call.get("attention_mask"), queries)
    if mask is not None and mask.dtype != torch.bool:
        scores, mask = scores + mask, None
    return _softmax(scores.float(), mask).to(q.dtype)  # in float32, as Hugging Face's eager attention


_COMPUTE: dict[str, Callable[[Any, dict[str, Any], int | None, str], torch.Tensor]] = {
    "torch": _torch,
    "timm": _timm,
    "hf": _hf,
}
