"""The diffusers integration on a small random-weight WanTransformer3DModel (CPU, fp32): the tessel
dense processor against diffusers' own SDPA processor, sparse patterns, dense warm-up through the
scheduler, and disable() restoring the original processors."""
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel  # noqa: E402

import tessel  # noqa: E402
import tessel.diffusers  # noqa: E402,F401  (the short alias module)
from tessel.integrations import diffusers as tessel_diffusers  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4,
                                 out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=3,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=256).eval()


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, 4, 5, 8, 12, generator=gen),  # latent grid (5, 4, 6): 120 tokens
                timestep=torch.tensor([500]), encoder_hidden_states=torch.randn(1, 7, 32, generator=gen))


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_dense_processor_matches_sdpa_and_disable_restores(model, inputs):
    reference = run(model, inputs)
    originals = [block.attn1.processor for block in model.blocks]
    tessel_diffusers.enable(model)
    assert all(isinstance(b.attn1.processor, tessel_diffusers.TesselWanAttnProcessor) for b in model.blocks)
    assert not any(isinstance(b.attn2.processor, tessel_diffusers.TesselWanAttnProcessor) for b in model.blocks)
    torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    tessel_diffusers.disable(model)
    assert [block.attn1.processor for block in model.blocks] == originals
    torch.testing.assert_close(run(model, inputs), reference, atol=0, rtol=0)


@pytest.mark.parametrize("config", [
    {"pattern": "radial", "block_size_q": 16, "block_size_kv": 16},
    {"pattern": "local", "local_window_size": 2, "block_size_q": 24, "block_size_kv": 24},
    {"pattern": "sliding_window_3d", "window_3d": (1, 1, 1), "block_size_q": 8, "block_size_kv": 8},
    # similarity_threshold -1: every block counts as self-similar, so each row keeps its top half.
    {"pattern": "dynamic_topk", "topk_ratio": 0.5, "similarity_threshold": -1.0, "block_size_q": 16,
     "block_size_kv": 16},
    {"pattern": "threshold", "threshold": 0.8, "block_size_q": 16, "block_size_kv": 16},
])
def test_sparse_patterns_stay_close_to_dense(model, inputs, config):
    reference = run(model, inputs)
    tessel_diffusers.enable(model, config)
    try:
        sparse = run(model, inputs)
        report = model.blocks[0].attn1.processor.runner.last_report
    finally:
        tessel_diffusers.disable(model)
    if config["pattern"] in ("dynamic_topk", "threshold"):  # the library's backend ran, sparsely
        assert report["backend"] == config["pattern"] and not report["dense"] and report["density"] < 1
    assert sparse.shape == reference.shape and torch.isfinite(sparse).all()
    assert 0 < relative_error(sparse, reference) < 0.5


def test_window_covering_the_grid_equals_dense(model, inputs):
    reference = run(model, inputs)
    tessel.diffusers.enable_sparse_attention(model, {"pattern": "sliding_window_3d", "window_3d": (5, 4, 6),
                                                     "block_size_q": 16, "block_size_kv": 16})
    try:
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    finally:
        tessel_diffusers.disable(model)


def test_dense_warmup_follows_the_scheduler(model, inputs):
    reference = run(model, inputs)
    scheduler = FlowMatchEulerDiscreteScheduler()
    pipe = types.SimpleNamespace(transformer=model, scheduler=scheduler)
    tessel_diffusers.enable(pipe, {"pattern": "radial", "dense_warmup_steps": 1, "block_size_q": 16,
                                   "block_size_kv": 16})
    try:
        scheduler.set_timesteps(4)
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)  # step 0: dense
        sample = torch.zeros(1, 4, 5, 8, 12)
        scheduler.step(sample, scheduler.timesteps[0], sample)
        assert relative_error(run(model, inputs), reference) > 1e-4  # step 1: radial
        scheduler.set_timesteps(4)
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    finally:
        tessel_diffusers.disable(pipe)
    assert "step" not in vars(scheduler)


def test_config_errors(model):
    with pytest.raises(ValueError, match="pattern"):
        tessel_diffusers.enable(model, {"pattern": "spiral"})
    with pytest.raises(ValueError, match="unknown"):
        tessel_diffusers.enable(model, {"pattern": "radial", "radius": 3})
    with pytest.raises(TypeError, match="WanTransformer3DModel"):
        tessel_diffusers.enable(types.SimpleNamespace(transformer=torch.nn.Linear(2, 2)))
    assert not any(isinstance(b.attn1.processor, tessel_diffusers.TesselWanAttnProcessor) for b in model.blocks)
