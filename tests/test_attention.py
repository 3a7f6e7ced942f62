"""--capture attention: an attention module's weights, recomputed from its inputs, against each library's own."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from torch import nn

import hookcli
from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem
from hookcli.run.attention import attention_kind, attention_weights
from hookcli.run.capture import FeatureCapture


def _relative(found, expected) -> float:
    return ((found - expected).norm() / expected.norm()).item()


def _caught(module, run):
    """The weights computed from what ``module`` receives while ``run()`` runs, by a hook written here."""
    kept = {}

    def hook(module, args, kwargs, output):
        kept["weights"] = attention_weights(module, args, kwargs)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            result = run()
    finally:
        handle.remove()
    return kept["weights"], result


@pytest.mark.parametrize("batch_first", [True, False])
def test_torch_multihead_attention_equals_its_own_weights_with_masks(batch_first):
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    x = torch.randn(3, 7, 16) if batch_first else torch.randn(7, 3, 16)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, -2:] = True
    causal = torch.ones(7, 7, dtype=torch.bool).triu(1)
    with torch.no_grad():
        expected = attention(x, x, x, key_padding_mask=padding, attn_mask=causal, average_attn_weights=False)[1]
    found = attention_weights(attention, (x, x, x), {"key_padding_mask": padding, "attn_mask": causal})
    assert found.shape == (3, 4, 7, 7) and _relative(found, expected) < 1e-6
    torch.testing.assert_close(found.sum(-1), torch.ones(3, 4, 7))


def test_timm_attention_fused_equals_its_unfused_weights():
    from timm.layers import Attention

    torch.manual_seed(0)
    attention = Attention(16, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm).eval()
    x = torch.randn(2, 9, 16)
    attention.fused_attn = True
    fused, fused_out = _caught(attention, lambda: attention(x))
    attention.fused_attn = False
    unfused = {}
    handle = attention.attn_drop.register_forward_hook(lambda m, i, o: unfused.__setitem__("weights", i[0].clone()))
    with torch.no_grad():
        attention(x)
    handle.remove()
    assert attention_kind(attention) == "timm" and fused.shape == (2, 4, 9, 9)
    assert _relative(fused, unfused["weights"]) < 1e-6
    with torch.no_grad():
        attention.fused_attn = True
        assert torch.equal(attention(x), fused_out)  # asking changes nothing of the module's output


@pytest.mark.parametrize("family", ["vit", "clip"])
def test_hugging_face_attention_equals_output_attentions_of_eager_attention(family):
    import transformers

    torch.manual_seed(0)
    size = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32,
            "image_size": 16, "patch_size": 8}  # fmt: skip
    if family == "vit":
        model = transformers.ViTModel(transformers.ViTConfig(**size, attn_implementation="eager")).eval()
    else:
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**size, attn_implementation="eager")).eval()
    layer = next(module for name, module in model.named_modules() if name.endswith("layers.1.self_attn")
                 or name.endswith("layers.1.attention"))  # fmt: skip
    pixels = torch.randn(2, 3, 16, 16)
    found, output = _caught(layer, lambda: model(pixel_values=pixels, output_attentions=True))
    assert attention_kind(layer) == "hf" and found.shape == (2, 4, 5, 5)
    assert _relative(found, output.attentions[1]) < 1e-6


class _SelfAttention4(nn.Module):
    """Self-attention as transformers 4 writes it (ViTSelfAttention's eager path): query, key and value projections."""

    def __init__(self, hidden=16, heads=4):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, hidden // heads
        self.query, self.key, self.value = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        def heads(x):
            return x.view(*x.shape[:2], self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

        q, k, v = heads(self.query(hidden_states)), heads(self.key(hidden_states)), heads(self.value(hidden_states))
        probs = (q @ k.transpose(-1, -2) / self.attention_head_size**0.5).softmax(dim=-1)
        probs = probs if head_mask is None else probs * head_mask
        context = (probs @ v).permute(0, 2, 1, 3).reshape(hidden_states.shape)
        return (context, probs) if output_attentions else (context,)


def test_transformers_4_self_attention_equals_its_own_eager_weights_with_a_head_mask():
    torch.manual_seed(0)
    layer, x = _SelfAttention4().eval(), torch.randn(2, 5, 16)
    for head_mask in (None, torch.tensor([1.0, 0.0, 0.5, 1.0]).reshape(4, 1, 1)):
        found, (_, expected) = _caught(layer, lambda: layer(x, head_mask=head_mask, output_attentions=True))  # noqa: B023
        assert attention_kind(layer) == "hf4" and found.shape == (2, 4, 5, 5)
        assert _relative(found, expected) < 1e-6
    first = attention_weights(layer, (x,), {}, keep="class")
    torch.testing.assert_close(first, layer(x, output_attentions=True)[1][:, :, 0], rtol=1e-6, atol=1e-7)


def test_open_clip_towers_attention_equals_torchs_own_weights():
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(0)
    tower = VisionTransformer(image_size=16, patch_size=8, width=16, layers=2, heads=2, mlp_ratio=2.0,
                              ls_init_value=None, output_dim=8).eval()  # fmt: skip
    attention = tower.transformer.resblocks[1].attn
    inputs = {}
    handle = attention.register_forward_pre_hook(lambda m, args: inputs.__setitem__("x", args[0].clone()))
    found, _ = _caught(attention, lambda: tower(torch.randn(2, 3, 16, 16)))
    handle.remove()
    x = inputs["x"]
    with torch.no_grad():
        expected = attention(x, x, x, average_attn_weights=False)[1]
    assert _relative(found, expected) < 1e-6 and found.shape == (2, 2, 5, 5)


def _vit():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16).eval()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attention")
    paths = []
    for seed in range(3):
        paths.append(folder / f"{seed}.png")
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def test_extract_stores_each_blocks_weights_and_leaves_the_models_output_as_it_was(photos, tmp_path):
    vit = _vit()
    layers = [f"encoder.layers.encoder_layer_{n}.self_attention" for n in range(2)]
    out = hookcli.extract(
        vit, layers, photos, capture="attention", resize=16, crop=16, output=tmp_path / "a.safetensors"
    )
    with safe_open(str(out), "pt") as handle:
        keys, metadata = sorted(handle.keys()), handle.metadata()
        weights = handle.get_tensor(f"{layers[1]}@attention")
    assert keys == [f"{layer}@attention" for layer in layers]
    assert weights.shape == (3, 2, 5, 5) and metadata["capture"] == "attention"
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 5))
    # The weights equal torch's own, on the inputs the block gives its attention; the logits are not changed.
    batch = hookcli.extract(vit, "conv_proj", photos, capture="input", resize=16, crop=16)["conv_proj@input"]
    inputs = hookcli.extract(vit, layers[1], photos, capture="input", resize=16, crop=16)[f"{layers[1]}@input#0"]
    attention = vit.get_submodule(layers[1])
    with torch.no_grad():
        expected = attention(inputs, inputs, inputs, average_attn_weights=False)[1]
        plain = vit(batch)
    assert _relative(weights, expected) < 1e-6
    kept = {}
    with FeatureCapture(vit, layers, capture="attention", stop_early=False) as capture:
        handle = vit.heads.register_forward_hook(lambda m, i, o: kept.__setitem__("logits", o.clone()))
        with torch.no_grad():
            capture.run(batch)
        handle.remove()
    assert torch.equal(kept["logits"], plain)
    assert json.loads(metadata["layers"])[layers[0]]["keys"] == [f"{layers[0]}@attention"]


def test_what_is_not_attention_is_refused_in_one_line(photos):
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(_vit(), "encoder.layers.encoder_layer_0.ln_1", photos, capture="attention", resize=16, crop=16)
    assert refused.value.message.startswith(
        "--capture attention: 'encoder.layers.encoder_layer_0.ln_1' is a LayerNorm, not an attention module hookcli "
        "knows (torch.nn.MultiheadAttention"
    )
    with pytest.raises(UsageProblem) as refused:  # the model itself, by the name the command line gives it
        hookcli.extract(_vit(), ".", photos, capture="attention", resize=16, crop=16)
    assert refused.value.message.startswith("--capture attention: '.' is a VisionTransformer, not an attention module")
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(_vit(), "encoder.layers.encoder_layer_0.self_attention", photos, capture="attention",
                        pool="avg", resize=16, crop=16)  # fmt: skip
    assert refused.value.message == "--pool avg pools maps and tokens, and attention weights are neither"
    biased = nn.Sequential(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(UsageProblem) as refused, FeatureCapture(biased, ["0"], capture="attention"):
        pass
    assert refused.value.message == (
        "--capture attention: '0' (MultiheadAttention) adds key biases or zero attention, or projects keys of another "
        "size, which hookcli does not recompute"
    )


@pytest.mark.parametrize(
    ("keep", "shape"), [("class", (3, 2, 5)), ("mean", (3, 5, 5)), ("class-mean", (3, 5))], ids=lambda v: str(v)
)
def test_what_is_kept_of_the_weights_is_cut_from_all_of_them(photos, keep, shape):
    layer = "encoder.layers.encoder_layer_1.self_attention"
    every = hookcli.extract(_vit(), layer, photos, capture="attention", resize=16, crop=16)[f"{layer}@attention"]
    kept = hookcli.extract(_vit(), layer, photos, capture="attention", attention=keep, resize=16, crop=16)
    expected = every[:, :, 0] if keep.startswith("class") else every
    expected = expected.mean(dim=1) if keep.endswith("mean") else expected
    assert kept[f"{layer}@attention"].shape == shape and kept.metadata["capture"] == f"attention:{keep}"
    torch.testing.assert_close(kept[f"{layer}@attention"], expected, rtol=1e-6, atol=1e-7)


def test_a_row_too_large_to_compute_is_refused_with_the_option_that_keeps_less(monkeypatch):
    import hookcli.run.attention as attention_module

    monkeypatch.setattr(attention_module, "MAX_ROW_BYTES", 2 * 5 * 5 * 4 - 1)
    vit = _vit()
    layer = "encoder.layers.encoder_layer_0.self_attention"
    batch = torch.randn(1, 3, 16, 16)
    with pytest.raises(UsageProblem) as refused, FeatureCapture(vit, [layer], capture="attention") as capture:
        capture.run(batch)
    assert refused.value.message == (
        f"--capture attention: one image's weights of '{layer}' (2 heads x 5 queries x 5 keys) take 200 B, more than "
        "hookcli computes a row (199 B)"
    )
    assert refused.value.hint == "keep the first token's row: --attention class (or class-mean)"
    with FeatureCapture(vit, [layer], capture="attention", attention="class") as capture:
        assert capture.run(batch)[f"{layer}@attention"].shape == (1, 2, 5)


def test_rollout_equals_a_direct_product_on_three_blocks_built_by_hand():
    from hookcli.statistics.rollout import attention_rollout

    torch.manual_seed(3)
    blocks = [torch.randn(2, 4, 5, 5).softmax(-1) for _ in range(3)]  # [N, heads, T, T] each
    expected = torch.eye(5, dtype=torch.float64).expand(2, 5, 5)
    for weights in blocks:  # Abnar and Zuidema: (A + I) / 2 of the heads' mean, rows to 1, the later block on the left
        mixed = (weights.double().mean(1) + torch.eye(5, dtype=torch.float64)) / 2
        expected = (mixed / mixed.sum(-1, keepdim=True)) @ expected
    found = attention_rollout(blocks)
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(found.sum(-1), torch.ones(2, 5, dtype=torch.float64))


def test_a_runs_blocks_give_a_rollout_map_an_image_that_grid_draws_over_the_photo(photos, tmp_path):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=3, hidden_dim=12, mlp_dim=16).eval()
    layers = [f"encoder.layers.encoder_layer_{n}.self_attention" for n in range(3)]
    out = hookcli.extract(vit, layers, photos, capture="attention", attention="mean", resize=32, crop=32,
                          output=tmp_path / "a.safetensors")  # fmt: skip
    found = hookcli.rollout(out)
    assert list(found.keys()) == ["rollout@attention"] and found["rollout@attention"].shape == (3, 17)
    assert json.loads(found.metadata["rollout"]) == {"blocks": [f"{layer}@attention" for layer in layers],
                                                     "residual": 0.5}  # fmt: skip
    with hookcli.open_features(out) as read:
        blocks = [torch.from_numpy(read.read(f"{layer}@attention")) for layer in layers]
    from hookcli.statistics.rollout import attention_rollout

    torch.testing.assert_close(found["rollout@attention"], attention_rollout(blocks)[:, 0].float())
    named = hookcli.rollout(out, keys=[f"{layers[2]}@attention", "**encoder_layer_[01]**"])  # patterns, any order
    assert json.loads(named.metadata["rollout"])["blocks"] == [f"{layer}@attention" for layer in layers]
    torch.testing.assert_close(named["rollout@attention"], found["rollout@attention"], rtol=0, atol=0)
    last = hookcli.rollout(out, keys=f"{layers[2]}@attention")  # one key, as a string
    assert json.loads(last.metadata["rollout"])["blocks"] == [f"{layers[2]}@attention"]
    drawn = hookcli.grid(found, overlay=True)
    assert sorted(drawn) == [f"rollout@attention__{n:05d}_{n}.overlay.png" for n in range(3)]
    pictures = hookcli.grid(out, images="0")  # each head's class-token attention over the 4x4 patches
    assert sorted(pictures) == [f"{layer}@attention__00000_0.png" for layer in layers]
    with pytest.raises(UsageProblem) as refused:
        hookcli.rollout(hookcli.extract(vit, layers[0], photos, capture="attention", attention="class", resize=32,
                                        crop=32))  # fmt: skip
    assert refused.value.message == (
        "a rollout needs every token's attention, and 'memory' keeps the class token's row only (--attention class)"
    )


def test_grid_draws_each_heads_class_token_attention_as_a_map_of_the_patches(photos, tmp_path):
    layer = "encoder.layers.encoder_layer_1.self_attention"
    out = hookcli.extract(_vit(), layer, photos, capture="attention", resize=16, crop=16, output=tmp_path / "a.st")
    with hookcli.open_features(out) as read:
        from hookcli.pictures.reading import attention_drawn, attention_maps

        assert attention_drawn(read, read.shape(f"{layer}@attention")[1:]) == [2, 2, 2]
        row = read.read(f"{layer}@attention", 0)
        np.testing.assert_array_equal(attention_maps(read, row), row[:, 0, 1:].reshape(2, 2, 2))


def test_statistics_comparisons_and_reports_take_attention_captures(photos, tmp_path):
    layers = [f"encoder.layers.encoder_layer_{n}.self_attention" for n in range(2)]
    out = hookcli.extract(_vit(), layers, photos * 2, capture="attention", attention="class-mean", resize=16, crop=16,
                          output=tmp_path / "a.safetensors")  # fmt: skip
    found = hookcli.stats(features=out, top=2, pca=False)
    key = f"{layers[1]}@attention"
    assert found[f"{key}@mean"].shape == (5,)  # the class token's attention to each of the 5 tokens: 5 units
    heads = hookcli.extract(_vit(), layers, photos * 2, capture="attention", attention="class", resize=16, crop=16)
    each = hookcli.stats(features=heads, top=2, pca=False)  # each head's attention to each token a unit: 2 x 5
    np.testing.assert_allclose(each[f"{key}@mean"], heads[key].double().mean(0).reshape(-1).numpy(), rtol=1e-12)
    patterns = hookcli.compare(features=heads)["linear-cka"]  # rows of weights as they are, not a mean of each
    own = [heads[f"{layer}@attention"].double().reshape(6, -1) for layer in layers]
    centred = [rows - rows.mean(0) for rows in own]
    hsic = [[(a.T @ b).square().sum() for b in centred] for a in centred]
    assert patterns[0, 1].item() == pytest.approx((hsic[0][1] / (hsic[0][0] * hsic[1][1]).sqrt()).item(), rel=1e-9)
    with hookcli.open_features(out) as read:
        np.testing.assert_allclose(found[f"{key}@mean"], read.read(key).astype(np.float64).mean(0), rtol=1e-12)
    cka = hookcli.compare(features=out)["linear-cka"]
    assert cka.shape == (2, 2) and cka[0, 0].item() == pytest.approx(1.0)
    page = hookcli.report(out, output=tmp_path / "r").read_text()
    assert page.count('<img src="data:image/png;base64,') >= 2  # each block's map for the first image


def test_an_edit_of_a_projection_is_in_the_weights_as_the_edited_model_attends(photos):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=4).eval()
    sizes, edit = {"resize": 32, "crop": 32}, "blocks.0.attn.qkv:0:51=zero"  # the first 51 units of the queries
    pixels = hookcli.extract(model, "patch_embed", photos, capture="input", **sizes)["patch_embed@input"]

    def zeroed(module, args, output):
        output = output.clone()
        output[..., :51] = 0
        return output

    own, attention = [], model.blocks[0].attn
    attention.fused_attn = False
    handles = [attention.qkv.register_forward_hook(zeroed),
               attention.attn_drop.register_forward_hook(lambda module, args, output: own.append(args[0]))]  # fmt: skip
    with torch.no_grad():
        model(pixels)
    for handle in handles:
        handle.remove()
    attention.fused_attn = True
    key = "blocks.0.attn@attention"
    for keep, expected in (("all", own[0]), ("class", own[0][:, :, 0])):
        edited = hookcli.extract(model, "blocks.0.attn", photos, capture="attention", attention=keep, intervene=[edit],
                                 **sizes)[key]  # fmt: skip
        plain = hookcli.extract(model, "blocks.0.attn", photos, capture="attention", attention=keep, **sizes)[key]
        assert edited.shape == expected.shape and _relative(edited, expected) < 1e-6
        assert _relative(plain, expected) > 1e-2  # the edit matters
    assert not attention.qkv._forward_hooks  # the model comes back as it was given


def test_a_hugging_face_query_projection_that_is_hooked_runs_on_every_token_as_the_forward_runs_it():
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=4, intermediate_size=32,
                                    image_size=16, patch_size=8, attn_implementation="eager")  # fmt: skip
    model = transformers.ViTModel(config).eval()
    layer = next(module for name, module in model.named_modules() if name.endswith("layers.0.attention")
                 or name.endswith("layer.0.attention.attention"))  # fmt: skip
    projection = getattr(layer, "q_proj", None) or layer.query
    seen = []
    projection.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[1]) or output * 2)
    kept = {}

    def weights(module, args, kwargs, output) -> None:
        kept["class"] = attention_weights(module, args, kwargs, keep="class")

    layer.register_forward_hook(weights, with_kwargs=True)
    with torch.no_grad():
        output = model(pixel_values=torch.randn(2, 3, 16, 16), output_attentions=True)
    assert seen == [5, 5]  # the forward's call, then the weights' own: every token, the hook's doubling in both
    torch.testing.assert_close(kept["class"], output.attentions[0][:, :, 0], rtol=1e-5, atol=1e-6)


def test_an_edit_of_the_attention_layer_itself_is_said_to_change_no_weights_kept(photos):
    import timm

    from hookcli.events import Note

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=4).eval()
    stops = "it applies after the last value kept is captured, so it changes nothing kept"

    def late(edit: str, edited: bool) -> list[str]:
        heard: list = []
        hookcli.extract(model, "blocks.0.attn", photos, capture="attention", intervene=[edit], capture_edited=edited,
                        resize=32, crop=32, batch_size=1, progress=heard.append)  # fmt: skip
        return [event.text for event in heard if isinstance(event, Note) and "nothing kept" in event.text]

    for edited in (False, True):
        assert late("blocks.0.attn:3=zero", edited) == [f"--intervene 'blocks.0.attn:3=zero': {stops}"]
        assert late("blocks.0.attn.qkv:3=zero", edited) == []  # the queries it projects make the weights
    # Another block's weights kept after it: they take the edit, and the edited block's own do not.
    heard: list = []
    plain, edited = (
        hookcli.extract(
            model,
            ["blocks.0.attn", "blocks.1.attn"],
            photos,
            capture="attention",
            intervene=edits,
            resize=32,
            crop=32,
            progress=heard.append,
        )  # fmt: skip
        for edits in ((), ["blocks.0.attn:3=zero"])
    )
    assert torch.equal(plain["blocks.0.attn@attention"], edited["blocks.0.attn@attention"])
    assert not torch.equal(plain["blocks.1.attn@attention"], edited["blocks.1.attn@attention"])
    assert [event.text for event in heard if isinstance(event, Note) and "@attention" in event.text] == [
        "--intervene 'blocks.0.attn:3=zero': blocks.0.attn@attention comes from what blocks.0.attn receives, so this "
        "edit of what it returns changes none of it (the attention of the layers after it takes the edit)"
    ]


def test_eva02s_rotary_attention_equals_its_unfused_weights_and_leaves_its_output_as_it_was(photos):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=28).eval()
    attention, own = model.blocks[1].attn, []
    attention.attn_drop.register_forward_hook(lambda module, args, output: own.append(args[0]))  # unfused only
    pixels = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        alone = model(pixels)
    found, asked = _caught(attention, lambda: model(pixels))
    assert torch.equal(asked, alone)  # asking changes nothing of the model's output
    for block in model.blocks:
        block.attn.fused_attn = False
    with torch.no_grad():
        model(pixels)
    assert attention_kind(attention) == "rope" and found.shape == (2, 3, 5, 5)  # a class token and 2 x 2 patches
    assert _relative(found, own[-1]) < 1e-6
    given = (model, hookcli.Preprocess(resize=28, crop=28))
    features = hookcli.extract(given, "blocks.1.attn", photos, capture="attention", attention="class")
    assert features["blocks.1.attn@attention"].shape == (3, 3, 5)


def test_rotary_attention_with_fewer_key_heads_shares_them_as_timm_does():
    import inspect

    from timm.layers import AttentionRope, RotaryEmbeddingCat

    if "num_kv_heads" not in inspect.signature(AttentionRope).parameters:
        pytest.skip("this timm's AttentionRope has as many key heads as query heads")
    torch.manual_seed(0)
    attention = AttentionRope(32, num_heads=4, num_kv_heads=2, qkv_fused=False, qk_norm=True, norm_layer=nn.LayerNorm)
    attention.eval().fused_attn = False
    rope = RotaryEmbeddingCat(8, in_pixels=False, feat_shape=[2, 2]).get_embed()  # 4 patches after a class token
    own = []
    attention.attn_drop.register_forward_hook(lambda module, args, output: own.append(args[0]))
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        attention(x, rope=rope)
        weights = attention_weights(attention, (x,), {"rope": rope})
        first = attention_weights(attention, (x,), {"rope": rope}, keep="class")
    assert weights.shape == (2, 4, 5, 5) and _relative(weights, own[0]) < 1e-6
    torch.testing.assert_close(first, own[0][:, :, 0], rtol=1e-6, atol=1e-7)


def test_masks_count_in_each_librarys_own_sense():
    from timm.layers import Attention

    torch.manual_seed(0)
    attention = Attention(16, num_heads=4).eval()
    x = torch.randn(2, 6, 16)
    allowed = torch.ones(6, 6, dtype=torch.bool)
    allowed[:, -1] = False  # SDPA's sense: True attends, so no query sees the last key
    found = attention_weights(attention, (x,), {"attn_mask": allowed})
    assert (found[..., -1] == 0).all() and torch.allclose(found.sum(-1), torch.ones(2, 4, 6))
    causal = attention_weights(attention, (x,), {"is_causal": True})
    assert torch.equal(causal[..., 0, 1:], torch.zeros(2, 4, 5))  # the first query sees the first key alone


def test_a_causal_text_tower_under_sdpa_equals_its_eager_weights():
    import transformers

    torch.manual_seed(0)
    config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 32,
              "vocab_size": 50, "max_position_embeddings": 8}  # fmt: skip
    tokens = torch.randint(0, 50, (2, 7))
    eager = transformers.CLIPTextModel(transformers.CLIPTextConfig(**config, attn_implementation="eager")).eval()
    sdpa = transformers.CLIPTextModel(transformers.CLIPTextConfig(**config, attn_implementation="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    layer = next(module for name, module in sdpa.named_modules() if name.endswith("layers.0.self_attn"))
    found, _ = _caught(layer, lambda: sdpa(input_ids=tokens))
    with torch.no_grad():
        expected = eager(input_ids=tokens, output_attentions=True).attentions[0]
    assert _relative(found, expected) < 1e-6 and (found[:, :, 0, 1:] == 0).all()


def test_attention_with_relative_position_terms_in_windows_or_one_sequence_is_refused():
    from timm.models.swin_transformer import WindowAttention

    windows = nn.Sequential(WindowAttention(16, num_heads=4, window_size=(4, 4)))
    with pytest.raises(UsageProblem) as refused, FeatureCapture(windows, ["0"], capture="attention"):
        pass
    assert refused.value.message == (
        "--capture attention: '0' (WindowAttention) adds rotary or relative position terms, or attends within "
        "windows, which hookcli does not recompute"
    )
    attention = nn.MultiheadAttention(8, 2).eval()
    x = torch.randn(5, 8)  # one sequence, no batch
    with pytest.raises(UsageProblem) as refused:
        attention_weights(attention, (x, x, x), {}, path="attn")
    assert refused.value.message == "--capture attention: 'attn' was called on one sequence, not a batch of them"


def test_the_first_tokens_row_of_a_model_without_a_class_token_is_refused(photos):
    import dataclasses

    from hookcli.models.sources.given import loaded_from_module

    loaded = dataclasses.replace(loaded_from_module(_vit()), prefix_tokens=0)  # as timm's class_token=False models
    layer = "encoder.layers.encoder_layer_0.self_attention"
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(loaded, layer, photos, capture="attention", attention="class", resize=16, crop=16)
    assert refused.value.message.startswith("--attention class keeps the first token's row, and ")
    assert refused.value.message.endswith("has no class token before its patches (the first token is a patch)")
    import timm

    registers = timm.create_model("vit_wee_patch16_reg1_gap_256", pretrained=False, img_size=32).eval()  # no class
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract((registers, hookcli.Preprocess(resize=32, crop=32)), "blocks.0.attn", photos,
                        capture="attention", attention="class-mean")  # fmt: skip
    assert refused.value.message == (
        "--attention class-mean keeps the first token's row, and VisionTransformer has no class token before its "
        "patches (the first token is a register)"
    )
    with pytest.raises(UsageProblem) as refused:
        hookcli.rollout(_vit_file(photos), residual=1.5)
    assert refused.value.message == "residual=1.5: a rollout keeps a share of each token, between 0 and 1"


def _vit_file(photos):
    layer = "encoder.layers.encoder_layer_0.self_attention"
    return hookcli.extract(_vit(), layer, photos, capture="attention", resize=16, crop=16)


def test_the_command_line_writes_the_rollout_beside_and_refuses_what_has_none(photos, tmp_path, runner, monkeypatch):
    from hookcli.cli import main

    layers = [f"encoder.layers.encoder_layer_{n}.self_attention" for n in range(2)]
    out = hookcli.extract(_vit(), layers, photos, capture="attention", attention="mean", resize=16, crop=16,
                          output=tmp_path / "a.safetensors")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(main, ["rollout", str(out)])
    assert done.exit_code == 0, done.output
    assert done.stdout == "a.rollout.safetensors\n"
    with hookcli.open_features(tmp_path / "a.rollout.safetensors") as read:
        assert read.keys() == ["rollout@attention"] and read.shape("rollout@attention") == [3, 5]
        np.testing.assert_allclose(read.read("rollout@attention"), hookcli.rollout(out)["rollout@attention"].numpy())
    again = runner.invoke(main, ["rollout", str(out)])
    assert again.exit_code != 0 and "already exists" in again.stderr
    plain = hookcli.extract(_vit(), layers[0], photos, resize=16, crop=16, output=tmp_path / "plain.safetensors")
    refused = runner.invoke(main, ["rollout", str(plain), "-o", "r.safetensors"])
    assert refused.exit_code == 2 and refused.stderr == (
        f"Error: '{plain}' holds no attention weights (its capture is output). Hint: capture them with hookcli extract "
        "--capture attention\n"
    )
    assert not (tmp_path / "r.safetensors").exists()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda w: -w, "holds negative values at row 0"),
        (
            lambda w: np.where(np.arange(w.size).reshape(w.shape) == 3, np.nan, w).astype(w.dtype),
            "holds NaN or infinite values at row 0",
        ),
        (lambda w: w * 2, "holds weights that do not sum to 1 over the tokens at row 0"),
        (lambda w: (w * 100).astype(np.int32), "holds int32 values at row 0"),
    ],
)
def test_rollout_refuses_damaged_attention_weights_in_one_line(photos, tmp_path, change, problem):
    from safetensors.numpy import save_file

    layer = "encoder.layers.encoder_layer_0.self_attention"
    made = hookcli.extract(_vit(), layer, photos, capture="attention", attention="mean", resize=16, crop=16,
                           output=tmp_path / "a.safetensors")  # fmt: skip
    with safe_open(str(made), "np") as read:
        tensors, metadata = {key: read.get_tensor(key) for key in read.keys()}, read.metadata()
    key = f"{layer}@attention"
    save_file({**tensors, key: change(tensors[key])}, str(tmp_path / "damaged.safetensors"), metadata=metadata)
    with pytest.raises(FeatureFileError) as refused:
        hookcli.rollout(tmp_path / "damaged.safetensors", output=tmp_path / "r.safetensors")
    assert str(refused.value) == (
        f"'{key}' of '{tmp_path / 'damaged.safetensors'}' {problem}: no attention weights. Hint: the file is damaged: "
        "capture the attention again with hookcli extract --capture attention"
    )
    assert not (tmp_path / "r.safetensors").exists()
    for prefix in ("5", "abc"):  # 5 tokens in all: none is left for patches
        save_file(tensors, str(tmp_path / "prefix.safetensors"), metadata={**metadata, "prefix_tokens": prefix})
        with pytest.raises(FeatureFileError) as refused:
            hookcli.rollout(tmp_path / "prefix.safetensors")
        assert refused.value.message == (
            f"'{tmp_path / 'prefix.safetensors'}' records \"{prefix}\" tokens before its patches, and its blocks "
            "attend over 5 tokens"
        )
    save_file(tensors, str(tmp_path / "later.safetensors"), metadata={**metadata, "format": "99"})
    with pytest.raises(FeatureFileError) as refused:
        hookcli.rollout(tmp_path / "later.safetensors")
    assert str(refused.value) == (
        f"'{tmp_path / 'later.safetensors'}' is of format \"99\", and this hookcli reads formats 1 to 7. Hint: read it "
        "with the hookcli that wrote it, or make it again"
    )
    with pytest.raises(UsageProblem) as refused:
        hookcli.rollout(made, output=tmp_path / "r.pt")
    assert refused.value.message == f"output '{tmp_path / 'r.pt'}' ends in .pt, the suffix of another format"
    with hookcli.open_features(hookcli.rollout(made, output=tmp_path / "r.safetensors")) as written:
        assert written.metadata["format"] == "1" and written.metadata["prefix_tokens"] == "1"


class _Wide(nn.Module):
    """A ViT-like model of any image size: 8-pixel patches after a class token, one attention module, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.token = nn.Parameter(torch.randn(1, 1, 8))
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, images):
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.token.expand(len(images), -1, -1), tokens], dim=1)
        mixed, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        return self.head(mixed[:, 0])


def test_the_attention_of_images_squashed_to_a_wide_shape_is_drawn_on_their_grid_of_patches(photos, tmp_path):
    model = (_Wide().eval(), hookcli.Preprocess(resize=(16, 24), crop=None))
    out = hookcli.extract(model, "attention", photos, capture="attention", output=tmp_path / "wide.safetensors")
    with hookcli.open_features(out) as read:
        from hookcli.pictures.reading import attention_drawn, attention_maps

        assert read.shape("attention@attention") == [3, 2, 7, 7]  # a class token and 2 x 3 patches
        assert attention_drawn(read, [2, 7, 7]) == [2, 2, 3]
        row = read.read("attention@attention", 1)
        np.testing.assert_array_equal(attention_maps(read, row), row[:, 0, 1:].reshape(2, 2, 3))
    drawn = hookcli.grid(out, output=tmp_path / "grid", overlay=True)
    assert [path.name for path in drawn] == [f"attention@attention__0000{n}_{n}.overlay.png" for n in range(3)]
    with Image.open(drawn[0]) as picture:
        assert picture.width > picture.height  # over the photo as the model saw it: 24 pixels wide, 16 high


def test_the_report_gives_each_attention_block_a_page_of_every_shown_image(photos, tmp_path):
    layers = [f"encoder.layers.encoder_layer_{n}.self_attention" for n in range(2)]
    out = hookcli.extract(_vit(), layers, photos, capture="attention", resize=16, crop=16,
                          output=tmp_path / "a.safetensors")  # fmt: skip
    index = hookcli.report(out, output=tmp_path / "r")
    written = sorted(path.name for path in (tmp_path / "r").iterdir())
    assert written == ["block-001.html", "block-002.html", "index.html"]
    assert f'<li><a href="block-002.html">{layers[1]}@attention</a></li>' in index.read_text()
    page = (tmp_path / "r" / "block-002.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == 3  # the block's picture of each image
    assert "<figcaption>Image 2: 2.png</figcaption>" in page and f"<h2>{layers[1]}@attention</h2>" in page
    over = hookcli.report(out, output=tmp_path / "over", overlay=True).parent / "block-002.html"
    assert over.read_text().count('<img src="data:image/jpeg;base64,') == 3  # over the photo: JPEG, a tenth of PNG
    with pytest.raises(OutputExistsError) as again:
        hookcli.report(out, output=tmp_path / "r")
    assert "index.html" in again.value.message


def test_cross_attention_is_not_drawn_as_if_it_looked_at_the_image(tmp_path):
    from hookcli.pictures.reading import attention_drawn
    from hookcli.pictures.render import NotDrawable

    weights = torch.softmax(torch.randn(2, 2, 4, 5), dim=-1)  # 4 queries over 5 keys of a memory: 1 + 2 x 2 keys
    metadata = {"capture": "attention", "preprocess": json.dumps({"resize": 16, "crop": 16}), "format": "2"}
    with pytest.raises(NotDrawable) as refused:
        attention_drawn(hookcli.Features({"a@attention": weights}, metadata), [2, 4, 5])
    assert str(refused.value) == "its 4 queries attend to 5 other keys (cross-attention), not to the image"
    assert attention_drawn(hookcli.Features({"a@attention": weights}, metadata), [2, 5, 5]) == [2, 2, 2]  # self
