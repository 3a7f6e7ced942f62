"""An attention module's weights (after softmax, ``[N, heads, queries, keys]``), computed from what the module
receives and its own projections, so that the model's forward keeps its fused kernel.

The kinds of module known (:func:`attention_kind`):

- ``torch``: :class:`torch.nn.MultiheadAttention` (torchvision's ViT, OpenCLIP's towers), called on batches; its
  ``attn_mask``, ``key_padding_mask`` and ``is_causal`` count as torch's own ``need_weights=True`` counts them;
- ``timm``: timm's ``Attention`` (a ``qkv`` projection, ``q_norm`` and ``k_norm``, ``scale``), fused or not, its
  ``attn_mask`` (True attends, as in SDPA) and ``is_causal`` counted;
- ``rope``: timm's attention with rotary position terms (``EvaAttention``: EVA-02, ``AttentionRope``), the ``rope``
  it is called with turning the queries and keys after its prefix tokens, fewer key heads than query heads shared
  as it shares them;
- ``hf``: Hugging Face's attention modules as transformers 5 writes them (``q_proj`` and ``k_proj`` projections,
  ``head_dim``, ``scaling``): ViT, DeiT, DINOv2, CLIP's towers, whatever attention function the model runs; a
  boolean ``attention_mask`` is SDPA's (True attends), a float one is added, and causal attention counts;
- ``hf4``: Hugging Face's self-attention as transformers 4 writes it (``query`` and ``key`` projections,
  ``num_attention_heads``, ``attention_head_size``): ViT, DeiT, DINOv2; its ``attention_mask`` is added and its
  ``head_mask`` multiplies the weights, as its eager attention does.

Other modules with rotary or relative position terms, windows (Swin), or fewer key heads than query heads are
refused: their weights are not what the queries and keys alone give. Only the queries and keys are projected again (with
``class``, only the first token's query): the values, the output projection and the rest of the model do not run
twice. A projection that something hooks (an edit, the caller's own hook) is called as the forward calls it, on every
token, so that the weights are those of the edited model. The softmax is computed in float32.

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
    "rope": "timm's EvaAttention and AttentionRope",
    "hf": "Hugging Face's attention (q_proj and k_proj: ViT, DeiT, DINOv2, CLIP)",
    "hf4": "transformers 4's self-attention (query and key)",
}


def attention_kind(module: nn.Module) -> str | None:
    """The kind of attention module ``module`` is (a key of :data:`KINDS`), or None."""
    if isinstance(module, nn.MultiheadAttention):
        return "torch"
    linear = nn.Linear
    projects = isinstance(getattr(module, "qkv", None), linear) or isinstance(getattr(module, "q_proj", None), linear)
    if projects and hasattr(module, "num_prefix_tokens") and "rope" in _signature(type(module)).parameters:
        return "rope"
    if isinstance(getattr(module, "qkv", None), linear) and hasattr(module, "num_heads") and hasattr(module, "scale"):
        return "timm"
    if all(isinstance(getattr(module, name, None), linear) for name in ("q_proj", "k_proj")) and isinstance(
        getattr(module, "head_dim", None), int
    ):
        return "hf"
    if all(isinstance(getattr(module, name, None), linear) for name in ("query", "key")) and all(
        isinstance(getattr(module, name, None), int) for name in ("num_attention_heads", "attention_head_size")
    ):
        return "hf4"
    return None


def check_attention(module: nn.Module, path: str) -> str:
    """The kind of ``module`` (the layer at ``path``); refused in one line when it is no attention module known, or
    one whose weights hookcli cannot recompute from its inputs (rotary or relative position terms, windows, keys of
    other sizes, fewer key heads than query heads)."""
    kind = attention_kind(module)
    if kind is None:
        raise UsageProblem(
            f"--capture attention: '{path or '.'}' is a {type(module).__name__}, not an attention module hookcli knows "
            f"({', '.join(KINDS.values())})",
            hint="name the attention module itself (hookcli layers lists them: self_attention, attn, attention…)",
        )
    parameters = set(_signature(type(module)).parameters)
    qkv: Any = getattr(module, "qkv", None)
    problem = None
    if kind == "torch" and (module.bias_k is not None or module.add_zero_attn or not module._qkv_same_embed_dim):
        problem = "adds key biases or zero attention, or projects keys of another size"
    elif kind == "rope" and ("x" not in parameters or not hasattr(module, "q_norm")):
        problem = "projects its queries, keys and values in a way hookcli does not recompute"
    elif kind != "rope" and (
        parameters & {"rope", "position_embeddings", "mask", "freqs_cis"}
        or hasattr(module, "relative_position_bias_table")
    ):
        problem = "adds rotary or relative position terms, or attends within windows"
    elif kind == "timm" and (
        "x" not in parameters
        or getattr(module, "q_bias", None) is not None
        or not hasattr(module, "q_norm")
        or getattr(module, "num_kv_heads", module.num_heads) != module.num_heads
        or qkv.out_features % 3
    ):
        problem = "projects its queries, keys and values in a way hookcli does not recompute"
    elif kind == "hf" and ("hidden_states" not in parameters or getattr(module, "num_key_value_groups", 1) != 1):
        problem = "projects its queries and keys in a way hookcli does not recompute"
    elif kind == "hf4" and getattr(module, "position_embedding_type", "absolute") != "absolute":
        problem = "adds rotary or relative position terms, or attends within windows"
    elif kind == "hf4" and "hidden_states" not in parameters:
        problem = "projects its queries and keys in a way hookcli does not recompute"
    if problem is not None:
        raise UsageProblem(
            f"--capture attention: '{path}' ({type(module).__name__}) {problem}, which hookcli does not recompute",
            hint="capture its output, or its input with --capture input",
        )
    return kind


def attention_weights(
    module: nn.Module, args: tuple, kwargs: Mapping[str, Any], *, keep: str = "all", path: str = "the layer"
) -> torch.Tensor:
    """The weights ``module`` (of a kind :func:`check_attention` accepts) computes from ``args`` and ``kwargs``, the
    inputs of one of its calls: ``[N, heads, queries, keys]``, each row summing to 1 (the softmax in float32, then
    the inputs' dtype); or what ``keep`` keeps of them (:data:`KEEPS`: with ``class`` only the first token's query is
    projected and multiplied). Refused when one image's weights would take more than :data:`MAX_ROW_BYTES`."""
    kind = attention_kind(module)
    assert kind is not None, "checked by check_attention"
    first = keep.startswith("class")
    weights = _COMPUTE[kind](module, _bound(module, args, kwargs), 1 if first else None, path)
    if first:
        weights = weights[:, :, 0]
    return weights.mean(dim=1) if keep.endswith("mean") else weights


def _fits(heads: int, queries: int, keys: int, path: str) -> None:
    """Refuse one image's weights that would take more than :data:`MAX_ROW_BYTES`."""
    size = heads * queries * keys * 4
    if size > MAX_ROW_BYTES:
        raise UsageProblem(
            f"--capture attention: one image's weights of '{path}' ({heads} heads x {queries:,} queries x {keys:,} "
            f"keys) take {format_bytes(size)}, more than hookcli computes a row ({format_bytes(MAX_ROW_BYTES)})",
            hint="keep the first token's row: --attention class (or class-mean)",
        )


def _first(x: torch.Tensor, queries: int | None) -> torch.Tensor:
    """The tokens ``[N, T, D]`` whose queries are kept: the first ``queries``, or all."""
    return x if queries is None else x[:, :queries]


def _queries(mask: Any, queries: int | None) -> Any:
    """A mask's rows for the queries kept."""
    if mask is None or queries is None or mask.dim() < 2 or mask.shape[-2] <= queries:
        return mask
    return mask[..., :queries, :]


_SIGNATURES: dict[type[nn.Module], inspect.Signature] = {}


def _signature(kind: type[nn.Module]) -> inspect.Signature:
    """The signature of a module class's ``forward``, without ``self``: read once a class, not at each call."""
    if kind not in _SIGNATURES:
        signature = inspect.signature(kind.forward)
        _SIGNATURES[kind] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return _SIGNATURES[kind]


def _bound(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, as the module's ``forward`` names them (those it takes as ``**kwargs`` too)."""
    signature = _signature(type(module))
    bound = dict(signature.bind_partial(*args, **kwargs).arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            bound.update(bound.pop(name, {}))
    return bound


def _hooked(layer: nn.Module) -> bool:
    """Whether something hooks ``layer`` (an edit, or the caller's own hook), so that what it gives the forward may
    differ from what its weights alone give."""
    return bool(layer._forward_hooks or layer._forward_pre_hooks)


def _projected(layer: nn.Module, x: torch.Tensor, queries: int | None) -> torch.Tensor:
    """``layer(x)`` for the tokens whose queries are kept; on every token, as the forward runs it, when
    :func:`_hooked`, so that what the hook changes is in the weights."""
    return _first(layer(x), queries) if _hooked(layer) else layer(_first(x, queries))


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[N, T, heads·d]`` as ``[N, heads, T, d]``."""
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _causal(queries: int, keys: int, device: Any) -> torch.Tensor:
    """The keys each of the first ``queries`` queries may not see in causal attention (True: left out)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).triu(1)


def _softmax(scores: torch.Tensor, masks: list[Any]) -> torch.Tensor:
    """Softmax over the keys in float32 (then the scores' dtype), after ``masks``: boolean (True is left out) or
    values added."""
    found = scores.float()
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype == torch.bool:
            found = found.masked_fill(mask, float("-inf"))
        else:
            found = found + mask.float()
    return found.softmax(dim=-1).to(scores.dtype)


def _torch(module: nn.MultiheadAttention, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:
    query, key = call["query"], call["key"]
    if query.dim() != 3:
        raise UsageProblem(
            f"--capture attention: '{path}' was called on one sequence, not a batch of them",
            hint="capture its output, or its input with --capture input",
        )
    if not module.batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    length, keys, size, heads = query.shape[1], key.shape[1], module.embed_dim, module.num_heads
    _fits(heads, queries or length, keys, path)
    weight, bias = module.in_proj_weight, module.in_proj_bias
    q = F.linear(_first(query, queries), weight[:size], None if bias is None else bias[:size])
    k = F.linear(key, weight[size : 2 * size], None if bias is None else bias[size : 2 * size])
    q, k = _heads(q, heads), _heads(k, heads)
    scale = math.sqrt(1.0 / q.shape[-1])  # as torch scales the queries before the product
    scores = (q * scale) @ k.transpose(-2, -1)
    attn_mask = call.get("attn_mask")  # torch's own sense: True is left out
    if attn_mask is None and call.get("is_causal"):
        attn_mask = _causal(length, keys, scores.device)
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.reshape(query.shape[0], heads, length, keys)
    padding = call.get("key_padding_mask")
    padding = None if padding is None else padding.reshape(query.shape[0], 1, 1, keys)
    return _softmax(scores, [_queries(attn_mask, queries), padding])


def _allowed(mask: Any) -> Any:
    """A mask in SDPA's sense (boolean: True attends; or values added) in :func:`_softmax`'s."""
    return ~mask if mask is not None and mask.dtype == torch.bool else mask


def _timm(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # timm's Attention
    x = call["x"]
    heads, length = module.num_heads, x.shape[1]
    _fits(heads, queries or length, length, path)
    width = module.qkv.out_features // 3
    weight, bias = module.qkv.weight, module.qkv.bias
    if _hooked(module.qkv):  # run as the forward runs it, so that what the hook changes counts
        projected = module.qkv(x)
        q, k = _first(projected[..., :width], queries), projected[..., width : 2 * width]
    else:
        q = F.linear(_first(x, queries), weight[:width], None if bias is None else bias[:width])
        k = F.linear(x, weight[width : 2 * width], None if bias is None else bias[width : 2 * width])
    q, k = module.q_norm(_heads(q, heads)), module.k_norm(_heads(k, heads))
    scores = (q * module.scale) @ k.transpose(-2, -1)
    causal = _causal(q.shape[2], length, scores.device) if call.get("is_causal") else None
    return _softmax(scores, [causal, _queries(_allowed(call.get("attn_mask")), queries)])


def _rope(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # timm's, rotary
    from timm.layers import apply_rot_embed_cat  # the module is timm's: timm is there

    x, rope, heads = call["x"], call.get("rope"), module.num_heads
    batch, length = x.shape[:2]
    _fits(heads, queries or length, length, path)
    if module.qkv is not None:
        biases = getattr(module, "q_bias", None)
        if biases is None:
            projected = module.qkv(x)
        else:  # EVA's own biases, the keys' a buffer of zeros
            biases = torch.cat((module.q_bias, module.k_bias, module.v_bias))
            separate = getattr(module, "qkv_bias_separate", False)
            projected = module.qkv(x) + biases if separate else F.linear(x, module.qkv.weight, biases)
        q, k, _ = projected.reshape(batch, length, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q = _heads(module.q_proj(x), heads)
        k = _heads(module.k_proj(x), getattr(module, "num_kv_heads", heads))
    q, k = module.q_norm(q), module.k_norm(k)
    if rope is not None:  # the prefix tokens (class, registers) are not turned
        skip, half = module.num_prefix_tokens, getattr(module, "rotate_half", False)
        q = torch.cat([q[:, :, :skip], apply_rot_embed_cat(q[:, :, skip:], rope, half=half)], dim=2).type_as(q)
        k = torch.cat([k[:, :, :skip], apply_rot_embed_cat(k[:, :, skip:], rope, half=half)], dim=2).type_as(k)
    k = k.repeat_interleave(heads // k.shape[1], dim=1)  # a key head for each group of query heads
    q = q if queries is None else q[:, :, :queries]
    scores = (q * module.scale) @ k.transpose(-2, -1)
    causal = _causal(q.shape[2], length, scores.device) if call.get("is_causal") else None
    return _softmax(scores, [causal, _queries(_allowed(call.get("attn_mask")), queries)])


def _hf(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # transformers
    hidden = call["hidden_states"]
    size, length = module.head_dim, hidden.shape[1]
    heads = module.q_proj.out_features // size
    _fits(heads, queries or length, length, path)
    scale = getattr(module, "scaling", getattr(module, "scale", size**-0.5))
    q, k = _heads(_projected(module.q_proj, hidden, queries), heads), _heads(module.k_proj(hidden), heads)
    scores = (q @ k.transpose(-2, -1)) * scale
    causal = call.get("is_causal", getattr(module, "is_causal", False))
    mask = call.get("attention_mask")
    # A boolean mask is SDPA's (True attends); a float one is added. Causal attention may come as a flag alone.
    return _softmax(
        scores, [_causal(q.shape[2], length, scores.device) if causal else None, _queries(_allowed(mask), queries)]
    )


def _hf4(module: Any, call: dict[str, Any], queries: int | None, path: str) -> torch.Tensor:  # transformers 4
    hidden = call["hidden_states"]
    heads, size, length = module.num_attention_heads, module.attention_head_size, hidden.shape[1]
    _fits(heads, queries or length, length, path)
    q, k = _heads(_projected(module.query, hidden, queries), heads), _heads(module.key(hidden), heads)
    scores = (q @ k.transpose(-2, -1)) * getattr(module, "scaling", size**-0.5)
    weights = _softmax(scores, [_queries(_allowed(call.get("attention_mask")), queries)])
    head_mask = call.get("head_mask")  # [heads, 1, 1] or [N, heads, 1, 1], as its eager attention multiplies them
    return weights if head_mask is None else weights * head_mask.to(weights.dtype)


_COMPUTE: dict[str, Callable[[Any, dict[str, Any], int | None, str], torch.Tensor]] = {
    "torch": _torch,
    "timm": _timm,
    "rope": _rope,
    "hf": _hf,
    "hf4": _hf4,
}
