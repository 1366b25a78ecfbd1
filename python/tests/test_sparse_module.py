"""tessel.SparseAttention (the library's module through the binding): config forms, backend
resolution, dense warm-up by step, the shared plan cache and config errors."""
import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

import tessel  # noqa: E402


def qkv(seq=256, heads=4, dim=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, seq, heads, dim, generator=gen) for _ in range(3)]


WINDOW = {"backend": "sliding_window", "pattern_type": "sliding_window", "window_size": 32, "block_size_q": 32, "block_size_kv": 32,
          "dense_timesteps": 2}


def test_no_backend_is_dense_attention():
    module = tessel.SparseAttention(4, 32, config={"backend": "none"}, dtype=torch.float32)
    q, k, v = qkv()
    assert (module.backend, module.resolution_source) == ("none", "config")
    torch.testing.assert_close(module(q, k, v), tessel.attention(q, k, v))
    assert module.last_report["dense"]


def test_dense_warmup_then_sparse_by_step():
    module = tessel.SparseAttention(4, 32, config=WINDOW, dtype=torch.float32)
    q, k, v = qkv()
    dense = tessel.attention(q, k, v)
    with tessel.denoising_step(1, 10):
        torch.testing.assert_close(module(q, k, v), dense)
        assert module.last_report["dense"]
    with tessel.denoising_step(5, 10):
        sparse = module(q, k, v)
    report = module.last_report
    assert report["backend"] == "sliding_window" and not report["dense"] and report["density"] < 0.6
    assert (sparse - dense).abs().max() > 1e-3


def test_layers_of_one_shape_share_a_plan():
    cache = tessel.PlanCache()
    layers = [tessel.SparseAttention(4, 32, config=WINDOW, dtype=torch.float32, layer_index=i, plan_cache=cache)
              for i in range(3)]
    q, k, v = qkv()
    with tessel.denoising_step(4, 10):
        outs = [layer(q, k, v) for layer in layers]
    assert (cache.misses, cache.hits, len(cache)) == (1, 2, 1)
    torch.testing.assert_close(outs[0], outs[2])


def test_config_forms(tmp_path):
    @dataclasses.dataclass
    class DiffusionSparseAttnConfig:  # the fields of vLLM-Omni's config
        backend: str = "sliding_window"
        pattern_type: str = "sliding_window"
        topk_ratio: float = 0.5
        block_size_q: int = 32
        block_size_kv: int = 32
        window_size: int = 32
        spatial_radius: int = None
        schedule: str = "constant"

    path = tmp_path / "sparse.json"
    path.write_text(json.dumps(WINDOW))
    for config in (DiffusionSparseAttnConfig(), str(path), json.dumps(WINDOW)):
        assert tessel.SparseAttention(4, 32, config=config, dtype=torch.float32).backend == "sliding_window"


def test_environment_override(monkeypatch):
    monkeypatch.setenv("DIFFUSION_SPARSE_ATTN_BACKEND", "dense")
    module = tessel.SparseAttention(4, 32, config=WINDOW, dtype=torch.float32)
    assert (module.backend, module.resolution_source) == ("dense", "env")


def test_config_errors_name_the_field():
    with pytest.raises(tessel.TesselError, match="topk_ratio"):
        tessel.SparseAttention(4, 32, config={"topk_ratio": 2.0})
    with pytest.raises(tessel.TesselError, match="no_such_key"):
        tessel.SparseAttention(4, 32, config={"no_such_key": 1})
    with pytest.raises(TypeError, match="config"):
        tessel.SparseAttention(4, 32, config=42)
    module = tessel.SparseAttention(4, 32, config=WINDOW, dtype=torch.float32)
    q, k, v = qkv()
    with pytest.raises(tessel.TesselError):
        module(q.half(), k.half(), v.half())
    with pytest.raises(tessel.TesselError):
        with tessel.denoising_step(10, 10):
            module(q, k, v)


def test_python_config_is_the_module_config():
    config = tessel.SparseAttentionConfig.from_dict(WINDOW)
    assert (config.pattern.window_size, config.geometry.block_q, config.warmup.dense_steps) == (32, 32, 2)
    module = tessel.SparseAttention(4, 32, config=config, dtype=torch.float32)
    assert module.backend == "sliding_window"
    assert json.loads(module._module.config_json) == config.to_dict()
    nested = {"backend": "sliding_window", "pattern": {"type": "sliding_window", "window_size": 32},
              "geometry": {"block_q": 32, "block_kv": 32}, "warmup": {"dense_steps": 2}}
    assert tessel.SparseAttentionConfig.from_dict(nested) == config
    assert json.loads(tessel.SparseAttention(4, 32, config=nested, dtype=torch.float32)._module.config_json) == \
        config.to_dict()
