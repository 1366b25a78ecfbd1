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
from tessel.sparse_config import Geometry, Pattern  # noqa: E402
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


def blocks(size):
    return {"block_q": size, "block_kv": size}


@pytest.mark.parametrize("config", [
    {"pattern": {"type": "radial"}, "geometry": blocks(16)},
    {"pattern": {"type": "local", "local_window_size": 2}, "geometry": blocks(24)},
    {"pattern": {"type": "sliding_window"}, "options": {"frame_radius": 1, "height_radius": 1, "width_radius": 1},
     "geometry": blocks(8)},
    # similarity_threshold -1: every block counts as self-similar, so each row keeps its top half.
    {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.5}, "options": {"similarity_threshold": -1.0},
     "geometry": blocks(16)},
    {"pattern": {"type": "threshold"}, "selection": {"threshold": 0.8}, "geometry": blocks(16)},
])
def test_sparse_patterns_stay_close_to_dense(model, inputs, config):
    reference = run(model, inputs)
    tessel_diffusers.enable(model, config)
    try:
        sparse = run(model, inputs)
        report = model.blocks[0].attn1.processor.runner.last_report
    finally:
        tessel_diffusers.disable(model)
    if config["pattern"]["type"] in ("dynamic_topk", "threshold"):  # the library's backend ran, sparsely
        assert report["backend"] == config["pattern"]["type"] and not report["dense"] and report["density"] < 1
    assert sparse.shape == reference.shape and torch.isfinite(sparse).all()
    assert 0 < relative_error(sparse, reference) < 0.5


def test_window_covering_the_grid_equals_dense(model, inputs):
    reference = run(model, inputs)
    config = tessel.SparseAttentionConfig(pattern=Pattern(type="sliding_window"), geometry=Geometry(16, 16),
                                          options={"frame_radius": "5", "height_radius": "4", "width_radius": "6"})
    tessel.diffusers.enable_sparse_attention(model, config)
    try:
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    finally:
        tessel_diffusers.disable(model)


def test_dense_warmup_follows_the_scheduler(model, inputs):
    reference = run(model, inputs)
    scheduler = FlowMatchEulerDiscreteScheduler()
    pipe = types.SimpleNamespace(transformer=model, scheduler=scheduler)
    tessel_diffusers.enable(pipe, {"pattern": {"type": "radial"}, "warmup": {"dense_steps": 1}, "geometry": blocks(16)})
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


def test_dense_layers_and_older_names(model, inputs):
    reference = run(model, inputs)
    # warmup.dense_layers covering every block: dense whatever the pattern.
    tessel_diffusers.enable(model, {"pattern": {"type": "radial"}, "warmup": {"dense_layers": 3},
                                    "geometry": blocks(16)})
    try:
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    finally:
        tessel_diffusers.disable(model)
    # The older Python names still work (DeprecationWarning), mapped onto the C++ fields.
    with pytest.warns(DeprecationWarning):
        tessel_diffusers.enable(model, {"pattern": "sliding_window_3d", "window_3d": (5, 4, 6), "block_size_q": 16,
                                        "block_size_kv": 16, "dense_warmup_steps": 0})
    try:
        config = model.blocks[0].attn1.processor.runner.config
        assert config.pattern.type == "sliding_window" and config.options["width_radius"] == "6"
        torch.testing.assert_close(run(model, inputs), reference, atol=2e-5, rtol=1e-4)
    finally:
        tessel_diffusers.disable(model)


def test_config_errors(model):
    with pytest.raises(ValueError, match="sparse_attn.pattern.type"):
        tessel_diffusers.enable(model, {"pattern": {"type": "spiral"}})
    with pytest.raises(ValueError, match="unknown"):
        tessel_diffusers.enable(model, {"pattern": {"type": "radial", "radius": 3}})
    with pytest.raises(ValueError, match="sparse_attn.selection.topk_ratio"):
        tessel_diffusers.enable(model, {"selection": {"topk_ratio": 0}})
    with pytest.raises(ValueError, match="pattern.type"):  # a C++ pattern this integration does not run
        tessel_diffusers.enable(model, {"pattern": {"type": "spatial_aware"}})
    with pytest.raises(TypeError, match="Linear has no diffusers attention modules"):
        tessel_diffusers.enable(types.SimpleNamespace(transformer=torch.nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="expected a diffusers transformer"):
        tessel_diffusers.enable(types.SimpleNamespace(unet=torch.nn.Linear(2, 2)))
    assert not any(isinstance(b.attn1.processor, tessel_diffusers.TesselWanAttnProcessor) for b in model.blocks)
