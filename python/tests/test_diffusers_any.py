"""tessel in diffusers transformers other than Wan, through the scoped dispatch hook
(tessel.integrations.diffusers_dispatch), on small random-weight models built from their configs
(CPU, fp32): dense output against diffusers' own SDPA for Flux, SD3, CogVideoX (1.0's layout and
1.5's patched frames with rotary positions), HunyuanVideo (its text padding mask), Qwen-Image and
LTX; disable restores the original processors and torch's function, bit for bit; joint attention
keeps the text rows and columns dense while image x image is sparse; static patterns run on the
latent grid each model's forward gives, and every pattern runs on each family; key-padding masks
are honoured, padded text keys leaving joint attention sparse; what cannot run is refused with an
error naming it."""
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import tessel  # noqa: E402
from tessel.functional import attention  # noqa: E402
from tessel.integrations import diffusers as tessel_diffusers  # noqa: E402
from tessel.integrations import diffusers_dispatch  # noqa: E402
from tessel.integrations.diffusers_layouts import MODEL_LAYOUTS  # noqa: E402
from tessel.sparse_config import SparseAttentionConfig  # noqa: E402

TEXT = 7


def _randn(generator, *shape):
    return torch.randn(*shape, generator=generator)


def _rope_axes(head_dim):  # rotary channels per (frame, row, column) axis, summing to the head dim
    return head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8


def flux(head_dim=16):
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
                                             attention_head_dim=head_dim, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=16, axes_dims_rope=_rope_axes(head_dim))
    g = torch.Generator().manual_seed(1)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(12.0), torch.arange(10.0), indexing="ij"), -1)
    return model, dict(hidden_states=_randn(g, 1, 120, 8), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       pooled_projections=_randn(g, 1, 16), timestep=torch.tensor([0.5]), img_ids=ids.reshape(-1, 3),
                       txt_ids=torch.zeros(TEXT, 3))


def sd3(head_dim=16):
    model = diffusers.SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                            attention_head_dim=head_dim, num_attention_heads=2, joint_attention_dim=32,
                                            caption_projection_dim=2 * head_dim, pooled_projection_dim=16, out_channels=4)
    g = torch.Generator().manual_seed(2)
    return model, dict(hidden_states=_randn(g, 1, 4, 16, 16), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       pooled_projections=_randn(g, 1, 16), timestep=torch.tensor([500]))


def cogvideox(head_dim=16):
    model = diffusers.CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=head_dim, in_channels=4,
                                                  out_channels=4, time_embed_dim=8, text_embed_dim=32, num_layers=2,
                                                  sample_width=16, sample_height=16, sample_frames=9, patch_size=2,
                                                  temporal_compression_ratio=4, max_text_seq_length=TEXT)
    g = torch.Generator().manual_seed(3)
    return model, dict(hidden_states=_randn(g, 1, 3, 4, 16, 16), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       timestep=torch.tensor([500]))


def cogvideox_1_5(head_dim=16):  # frames patched too (patch_size_t), rotary positions
    model = diffusers.CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=head_dim, in_channels=4,
                                                  out_channels=4, time_embed_dim=8, text_embed_dim=32, num_layers=1,
                                                  sample_width=16, sample_height=16, sample_frames=13, patch_size=2,
                                                  patch_size_t=2, temporal_compression_ratio=4,
                                                  max_text_seq_length=TEXT, use_rotary_positional_embeddings=True,
                                                  use_learned_positional_embeddings=False)
    g = torch.Generator().manual_seed(7)
    return model, dict(hidden_states=_randn(g, 1, 4, 4, 16, 16), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       timestep=torch.tensor([500]))


def hunyuan_video(head_dim=16):
    model = diffusers.HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                     attention_head_dim=head_dim, num_layers=1, num_single_layers=1,
                                                     num_refiner_layers=1, patch_size=1, patch_size_t=1,
                                                     text_embed_dim=32, pooled_projection_dim=16,
                                                     rope_axes_dim=_rope_axes(head_dim))
    g = torch.Generator().manual_seed(4)
    padding = torch.ones(1, TEXT, dtype=torch.bool)
    padding[:, 5:] = False  # two padded text tokens: the model masks them as keys
    return model, dict(hidden_states=_randn(g, 1, 4, 3, 8, 8), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       encoder_attention_mask=padding, pooled_projections=_randn(g, 1, 16),
                       timestep=torch.tensor([500]), guidance=torch.tensor([3500.0]))


def qwen_image(head_dim=16):
    model = diffusers.QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                                  attention_head_dim=head_dim, num_attention_heads=2,
                                                  joint_attention_dim=32, axes_dims_rope=_rope_axes(head_dim))
    g = torch.Generator().manual_seed(5)
    return model, dict(hidden_states=_randn(g, 1, 48, 16), encoder_hidden_states=_randn(g, 1, TEXT, 32),
                       encoder_hidden_states_mask=torch.ones(1, TEXT), timestep=torch.tensor([0.5]),
                       img_shapes=[(1, 6, 8)])


def ltx(head_dim=16):
    model = diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                                 num_attention_heads=2, attention_head_dim=head_dim, cross_attention_dim=2 * head_dim,
                                                 num_layers=1, caption_channels=16)
    g = torch.Generator().manual_seed(6)
    return model, dict(hidden_states=_randn(g, 1, 3 * 8 * 8, 8), encoder_hidden_states=_randn(g, 1, TEXT, 16),
                       timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(1, TEXT), num_frames=3,
                       height=8, width=8)


MODELS = {"flux": flux, "sd3": sd3, "cogvideox": cogvideox, "cogvideox_1_5": cogvideox_1_5,
          "hunyuan_video": hunyuan_video, "qwen_image": qwen_image, "ltx": ltx}


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dense_matches_sdpa_and_disable_restores_bit_for_bit(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    torch_sdpa = torch.nn.functional.scaled_dot_product_attention
    reference = run(model, inputs)
    tessel_diffusers.enable(model)
    assert torch.nn.functional.scaled_dot_product_attention is not torch_sdpa
    calls_before = getattr(model, "_tessel_sparse_attention")[0][0].model.calls
    out = run(model, inputs)
    assert getattr(model, "_tessel_sparse_attention")[0][0].model.calls > calls_before  # tessel ran them
    # fp32 on both sides: summation order only.
    torch.testing.assert_close(out, reference, atol=5e-5, rtol=1e-4)
    tessel_diffusers.disable(model)
    assert torch.nn.functional.scaled_dot_product_attention is torch_sdpa
    assert torch.equal(run(model, inputs), reference)


def _state_of(model):
    return getattr(model, "_tessel_sparse_attention")[0][0].model


def run_with(model, inputs, config):
    """The model's output with tessel enabled under `config`, and the latest sparse call's density."""
    tessel_diffusers.enable(model, config)
    try:
        return run(model, inputs), _state_of(model).last_density
    finally:
        tessel_diffusers.disable(model)


def test_joint_attention_keeps_text_rows_and_columns_dense_and_image_sparse():
    torch.manual_seed(0)
    model, _ = flux()
    config = SparseAttentionConfig.from_any({"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.25},
                                             "geometry": {"block_q": 16, "block_kv": 16},
                                             "options": {"similarity_threshold": "-2"}})
    state = diffusers_dispatch.enable_model(model, config)
    try:
        state.text_tokens = 20  # text first: tokens 0..19 (the second block is half text)
        g = torch.Generator().manual_seed(9)
        q, k, v = (torch.randn(1, 260, 2, 16, generator=g) for _ in range(3))
        out = state._attention(0, q, k, v, False, None)
        dense = attention(q, k, v)
        assert 0.1 < state.last_density < 0.8  # the image x image mask (3 of 15 kv blocks a row)
        # Text queries see every key: their rows equal dense attention's.
        torch.testing.assert_close(out[:, :20], dense[:, :20], atol=2e-6, rtol=1e-5)
        assert not torch.allclose(out[:, 32:], dense[:, 32:], atol=1e-3)  # image rows are sparse
        # Text keys stay in every image row: removing them changes every image row's output.
        v_no_text = v.clone()
        v_no_text[:, :20] = 0
        assert (state._attention(0, q, k, v_no_text, False, None)[:, 32:] - out[:, 32:]).abs().amax(-1).amin() > 0
    finally:
        diffusers_dispatch.disable_model(state)


def test_key_padding_masks_are_honoured_per_batch_entry():
    model, _ = flux()
    state = diffusers_dispatch.enable_model(model, SparseAttentionConfig.from_any(None))
    try:
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))  # (B, H, S, D) as torch's function
        keep = torch.ones(2, 1, 1, 40, dtype=torch.bool)
        keep[0, ..., 31:] = False
        keep[1, ..., ::3] = False
        additive = torch.zeros(2, 1, 1, 40).masked_fill(~keep, float("-inf"))
        for mask in (keep, additive, keep[:, 0, 0, :]):
            expected = diffusers_dispatch._torch_sdpa(q, k, v, attn_mask=mask if mask.dim() == 4 else mask[:, None, None])
            torch.testing.assert_close(state.attend(0, q, k, v, mask, 0.0, False, None), expected, atol=2e-6, rtol=1e-5)
        bias = torch.randn(2, 1, 1, 40, generator=g)
        with pytest.raises(ValueError, match="attn_mask with bias values"):
            state.attend(0, q, k, v, bias, 0.0, False, None)
        per_query = torch.rand(2, 1, 40, 40, generator=g) > 0.5
        with pytest.raises(ValueError, match="differs between queries"):
            state.attend(0, q, k, v, per_query, 0.0, False, None)
    finally:
        diffusers_dispatch.disable_model(state)


def test_refusals_name_what_cannot_run():
    model, _ = ltx()
    with pytest.raises(ValueError, match="this integration runs dense, .*got 'arrow'"):
        tessel_diffusers.enable(model, {"pattern": {"type": "arrow"}})
    unknown, _ = ltx()
    unknown.__class__ = type("SomeOtherTransformer", (type(unknown),), {})
    with pytest.raises(ValueError, match="token layout of SomeOtherTransformer is not known"):
        tessel_diffusers.enable(unknown, {"pattern": {"type": "dynamic_topk"}})
    tessel_diffusers.enable(unknown)  # dense runs on any model
    tessel_diffusers.disable(unknown)
    # diffusers' own context parallelism on a processor: refused, nothing left installed.
    torch_sdpa = torch.nn.functional.scaled_dot_product_attention
    blocks = [m for m in model.modules() if diffusers_dispatch._is_attention(m)]
    blocks[-1].processor._parallel_config = object()
    with pytest.raises(ValueError, match="context parallelism"):
        tessel_diffusers.enable(model)
    del blocks[-1].processor._parallel_config
    assert torch.nn.functional.scaled_dot_product_attention is torch_sdpa
    assert not any(isinstance(m.processor, diffusers_dispatch.ScopedAttnProcessor) for m in blocks)


def test_a_processor_that_bypasses_torch_attention_is_reported():
    model, inputs = ltx()
    attn = next(m for m in model.modules() if diffusers_dispatch._is_attention(m))

    class ManualAttention:  # computes attention itself (as another backend would): tessel never sees it
        def __init__(self, original):
            self.original = original

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            with diffusers_dispatch_scope_off():
                return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)

    attn.set_processor(ManualAttention(attn.processor))
    tessel_diffusers.enable(model)
    try:
        with pytest.raises(RuntimeError, match="did not reach torch's scaled_dot_product_attention"):
            run(model.eval(), inputs)
    finally:
        tessel_diffusers.disable(model)


class diffusers_dispatch_scope_off:
    """Runs its body outside tessel's scope, as a processor calling another attention backend does."""

    def __enter__(self):
        self.token = diffusers_dispatch._scope.set(None)

    def __exit__(self, *exc):
        diffusers_dispatch._scope.reset(self.token)


# The latent grid of each family's test input: its image tokens after patchifying.
GRIDS = {"flux": (1, 12, 10), "sd3": (1, 8, 8), "cogvideox": (3, 8, 8), "cogvideox_1_5": (2, 8, 8),
         "hunyuan_video": (3, 8, 8), "qwen_image": (1, 6, 8), "ltx": (3, 8, 8)}
BLOCKS = {"block_q": 16, "block_kv": 16}


def covering_window(blocks):
    """A box covering every grid above: it keeps every pair, so the static path must equal dense."""
    return {"pattern": {"type": "sliding_window"}, "geometry": blocks,
            "options": {"frame_radius": "3", "height_radius": "12", "width_radius": "12"}}


def top_k(blocks):  # similarity threshold -2: every block ranked (random weights make incoherent tokens)
    return {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.25}, "geometry": blocks,
            "options": {"similarity_threshold": "-2"}}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_pattern_runs_on_each_family_on_its_latent_grid(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    reference = run(model, inputs)
    tessel_diffusers.enable(model, covering_window(BLOCKS))
    try:
        covered = run(model, inputs)
        state = _state_of(model)
        assert state.runner.grid == GRIDS[name]  # read from this forward's arguments
        assert state.last_density == 1.0  # the static path ran, keeping every block
    finally:
        tessel_diffusers.disable(model)
    torch.testing.assert_close(covered, reference, atol=5e-5, rtol=1e-4)  # fp32: summation order only
    for config in ({"pattern": {"type": "sliding_window"}, "geometry": BLOCKS,
                    "options": {"frame_radius": "0", "height_radius": "1", "width_radius": "1"}},
                   {"pattern": {"type": "radial"}, "geometry": BLOCKS}, top_k(BLOCKS)):
        sparse, density = run_with(model, inputs, config)
        assert sparse.shape == reference.shape and torch.isfinite(sparse).all()
        if config["pattern"]["type"] != "radial":  # radial keeps these tiny grids whole
            assert density < 1, config
            assert not torch.allclose(sparse, reference, atol=1e-6), config


def _token_mask(block_mask, tokens):
    """The (tokens, tokens) bool pairs a single-head BlockMask keeps."""
    blocks = torch.from_numpy(block_mask.to_dense()).reshape(block_mask.q_blocks, block_mask.kv_blocks)
    return blocks.repeat_interleave(block_mask.block_q, 0)[:tokens].repeat_interleave(block_mask.block_kv, 1)[:, :tokens]


@pytest.mark.parametrize("factory,text_first", [(flux, True), (hunyuan_video, False)])
@pytest.mark.parametrize("padded_text", [0, 5])
def test_static_joint_attention_is_the_arrow_exactly(factory, text_first, padded_text):
    model, _ = factory()
    config = SparseAttentionConfig.from_any({"pattern": {"type": "sliding_window"}, "geometry": {"block_q": 8,
                                             "block_kv": 8}, "options": {"frame_radius": "0", "height_radius": "1",
                                                                         "width_radius": "1"}})
    state = diffusers_dispatch.enable_model(model, config)
    try:
        text, grid = 20, (2, 4, 5)
        image = 40
        state.text_tokens, state.runner.grid = text, grid
        g = torch.Generator().manual_seed(11)
        q, k, v = (torch.randn(2, 2, text + image, 16, generator=g) for _ in range(3))  # (B, H, S, D)
        text_part = slice(0, text) if text_first else slice(image, text + image)
        image_part = slice(text, text + image) if text_first else slice(0, image)
        keep = torch.ones(2, text + image, dtype=torch.bool)
        if padded_text:
            keep[1, range(text + image)[text_part][-padded_text:]] = False  # the second prompt is shorter
        out = state.attend(0, q, k, v, keep[:, None, None, :] if padded_text else None, 0.0, False, None)
        assert state.last_density < 1  # the image x image part ran sparse, padding or not
        # Reference: torch's attention over the token pairs the MMDiT arrow keeps.
        allowed = torch.ones(text + image, text + image, dtype=torch.bool)
        allowed[image_part, image_part] = _token_mask(state.runner._static_mask(image), image)
        allowed = allowed[None, None] & keep[:, None, None, :]
        expected = diffusers_dispatch._torch_sdpa(q, k, v, attn_mask=allowed)
        torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)
    finally:
        diffusers_dispatch.disable_model(state)


def test_image_tokens_that_are_not_one_grid_refuse_static_patterns():
    model, inputs = flux()
    ids = inputs["img_ids"].clone()
    inputs["img_ids"] = ids[torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(0))]  # not raster
    tessel_diffusers.enable(model, {"pattern": {"type": "radial"}, "geometry": BLOCKS})
    try:
        with pytest.raises(RuntimeError, match="not one raster grid"):
            run(model.eval(), inputs)
    finally:
        tessel_diffusers.disable(model)
    # Qwen-Image with a reference image beside the generated one: no single grid.
    grid_of = MODEL_LAYOUTS["QwenImageTransformer2DModel"].grid
    assert grid_of(None, {"img_shapes": [[(1, 6, 8), (1, 6, 8)]]}) is None
    assert grid_of(None, {"img_shapes": [[(1, 6, 8)]]}) == (1, 6, 8)


CUDA = tessel.cuda_compiled() and tessel.cuda_available() and torch.cuda.is_available()


def _rel_l2(x, reference):
    return float((x.double() - reference.double()).norm() / reference.double().norm())


@pytest.mark.skipif(not CUDA, reason="needs a GPU and a CUDA build of tessel")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_cuda_bf16_dense_meets_the_flash_attention_rule_and_patterns_run(name):
    """The families with head dim 64 in bf16 on the GPU: tessel dense within the FlashAttention rule,
    every pattern kind through the CUDA kernels, disable bit-equal."""
    torch.manual_seed(0)
    model, inputs = MODELS[name](head_dim=64)  # the CUDA kernels' head dims: 64, 128
    model = model.cuda().eval()
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    reference = run(model, inputs)  # fp32, torch's attention
    model = model.to(torch.bfloat16)
    inputs = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in inputs.items()}
    sdpa = run(model, inputs)
    tessel_diffusers.enable(model)
    try:
        dense = run(model, inputs)
    finally:
        tessel_diffusers.disable(model)
    # FlashAttention's rule: tessel's bf16 error against fp32 at most twice torch's bf16 error.
    assert _rel_l2(dense, reference) <= 2 * _rel_l2(sdpa, reference)
    blocks = {"block_q": 64, "block_kv": 64}  # the CUDA block-sparse kernel's smallest blocks
    for config in (covering_window(blocks), {"pattern": {"type": "radial"}, "geometry": blocks}, top_k(blocks)):
        sparse, density = run_with(model, inputs, config)
        assert torch.isfinite(sparse).all() and density is not None, config
        if config["pattern"]["type"] == "sliding_window":  # every pair kept: dense's result up to bf16 rounding
            assert _rel_l2(sparse, dense) <= _rel_l2(sdpa, reference), config
    assert torch.equal(run(model, inputs), sdpa)  # disable restores torch's attention, bit for bit
