"""vLLM-Omni's current plugin contract (its SPARSE_ATTN dispatcher): the `tessel` entry point of the
`vllm_omni.sparse_attn` group is one callable with capabilities. Driven through a stand-in of the
dispatcher written from PR #4493's code (the role's backend_kwargs nested or flat, BSND only, merge
static < per-forward < extra params dropping None, its default geometry resolver, refuse an
attn_mask or full_attn_spans the plugin does not advertise, call fn(q, k, v, params,
is_causal=..., softmax_scale=...)); vLLM-Omni itself is not installed here.
Results against tessel's own ops and torch's attention."""
import math
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tessel.functional import attention  # noqa: E402
from tessel.integrations import vllm_omni_plugin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def entry_point_target() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return project["project"]["entry-points"]["vllm_omni.sparse_attn"]["tessel"]


def load_entry():
    module, attribute = entry_point_target().split(":")
    return getattr(__import__(module, fromlist=[attribute]), attribute)


class StandInDispatcher:
    """What vLLM-Omni's _SparseAttentionImpl (PR #4493) does with a plugin, reduced to its contract:
    the role's backend_kwargs ({"backend": name, "params": {...}} or flat), the BSND layout, the
    capabilities read once, the three-tier merge dropping None, the default geometry resolver
    (total_latent_frames / patches_per_frame from latent_shape and patch_size, dropped when their
    product is not the sequence length), mask and spans refused unless advertised."""

    def __init__(self, static_params, causal=False, softmax_scale=None, qkv_layout=None, flat=False):
        if qkv_layout not in (None, "BSND"):
            raise ValueError(f"SPARSE_ATTN requires the BSND qkv layout; got {qkv_layout!r}")
        backend_kwargs = ({"backend": "tessel", **static_params} if flat
                          else {"backend": "tessel", "params": static_params})
        self.name = backend_kwargs["backend"]
        if "params" in backend_kwargs:
            self.static_params = dict(backend_kwargs["params"] or {})
        else:
            self.static_params = {key: value for key, value in backend_kwargs.items() if key != "backend"}
        self.fn = load_entry()
        caps = getattr(self.fn, "capabilities", None)
        caps = caps if isinstance(caps, dict) else {}
        self.supports_mask = bool(caps.get("supports_attention_mask", False))
        self.supports_spans = bool(caps.get("supports_full_attn_spans", False))
        self.causal, self.softmax_scale = causal, softmax_scale

    @staticmethod
    def default_geometry(params, seq_len):
        if params.get("total_latent_frames") is not None or "latent_shape" not in params or "patch_size" not in params:
            return
        (t, h, w), (pt, ph, pw) = (tuple(int(x) for x in torch.as_tensor(params[key]).reshape(-1, 3)[0])
                                   for key in ("latent_shape", "patch_size"))
        if pt and ph and pw and (t // pt) * (h // ph) * (w // pw) == seq_len:
            params["total_latent_frames"], params["patches_per_frame"] = t // pt, (h // ph) * (w // pw)

    def forward(self, q, k, v, per_forward=None, extra=None, attn_mask=None, full_attn_spans=None):
        merged = {**(self.static_params or {}), **(per_forward or {}), **(extra or {})}
        params = {key: value for key, value in merged.items() if value is not None}
        self.default_geometry(params, q.shape[1])
        if attn_mask is not None:
            if not self.supports_mask:
                raise ValueError("plugin does not advertise supports_attention_mask")
            params["attn_mask"] = attn_mask
        if full_attn_spans is not None:
            if not self.supports_spans:
                raise ValueError("plugin does not advertise supports_full_attn_spans")
            params["full_attn_spans"] = full_attn_spans
        scale = self.softmax_scale if self.softmax_scale is not None else q.shape[-1] ** -0.5
        return self.fn(q, k, v, params, is_causal=self.causal, softmax_scale=scale)


def qkv(batch=1, seq=300, heads=2, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, seq, heads, dim, generator=g) for _ in range(3))


def torch_attention(q, k, v, mask=None, causal=False, scale=None):
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           attn_mask=mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def test_the_entry_point_is_a_callable_with_capabilities_and_the_rfc_interface():
    fn = load_entry()
    assert callable(fn) and fn is vllm_omni_plugin.sparse_attn
    assert fn.capabilities == {"supports_attention_mask": True, "supports_full_attn_spans": False}
    # The seed RFC's backend interface is still there for dispatchers of that contract.
    assert fn.get_name() == "tessel"
    assert fn.get_impl_cls().__name__ == "TesselSparseImpl"


def test_dense_equals_torch_attention_with_scale_and_causal():
    q, k, v = qkv()
    torch.testing.assert_close(StandInDispatcher({}).forward(q, k, v), torch_attention(q, k, v), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(StandInDispatcher({"pattern": "dynamic_topk"}, causal=True).forward(q, k, v),
                               torch_attention(q, k, v, causal=True), atol=2e-6, rtol=1e-5)
    scaled = StandInDispatcher({"pattern": "dynamic_topk"}, softmax_scale=0.05).forward(q, k, v)
    torch.testing.assert_close(scaled, torch_attention(q, k, v, scale=0.05), atol=2e-6, rtol=1e-5)


def test_sparse_follows_the_step_from_per_forward_state():
    q, k, v = qkv(seq=512)
    dispatcher = StandInDispatcher({"pattern": "dynamic_topk", "topk_ratio": 0.25, "block_q": 64, "block_kv": 64,
                                    "similarity_threshold": -2, "dense_steps": 2})
    dense = attention(q, k, v)
    step = lambda i: {"denoise_step_idx": torch.tensor([i]), "total_denoise_steps": torch.tensor([10])}  # noqa: E731
    torch.testing.assert_close(dispatcher.forward(q, k, v, per_forward=step(1)), dense)  # warm-up: dense
    sparse = dispatcher.forward(q, k, v, per_forward=step(5))
    assert (sparse - dense).abs().max() > 1e-3
    # The call's extras win over the static config (the dispatcher's third tier).
    torch.testing.assert_close(dispatcher.forward(q, k, v, per_forward=step(5), extra={"topk_ratio": 1.0}), dense,
                               atol=2e-6, rtol=1e-5)


def test_static_patterns_read_the_latent_grid():
    q, k, v = qkv(seq=4 * 8 * 10)
    dispatcher = StandInDispatcher({"config": {"pattern": {"type": "radial"}, "geometry": {"block_q": 16, "block_kv": 16}}})
    geometry = {"latent_shape": torch.tensor([[4, 16, 20]]), "patch_size": torch.tensor([[1, 2, 2]])}
    out = dispatcher.forward(q, k, v, per_forward=geometry)
    assert out.shape == q.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="grid"):
        dispatcher.forward(q, k, v, per_forward={"latent_shape": torch.tensor([[4, 16, 22]]),
                                                 "patch_size": torch.tensor([[1, 2, 2]])})


def test_key_padding_masks_are_honoured():
    q, k, v = qkv(batch=2, seq=96)
    keep = torch.ones(2, 96, dtype=torch.bool)
    keep[0, 80:] = False  # sequence-parallel auto-padding: the last keys are padding
    keep[1, 10:20] = False  # padding elsewhere
    out = StandInDispatcher({}, flat=True).forward(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, torch_attention(q, k, v, mask=keep[:, None, None, :]), atol=2e-6, rtol=1e-5)


def test_sequence_parallel_padding_keeps_the_pattern_on_the_real_tokens():
    # A 4 x 8 x 10 grid (320 tokens) padded to 336, as Ulysses auto-padding does for 16 ranks.
    real, padded = 320, 336
    q, k, v = qkv(batch=1, seq=padded, seed=4)
    geometry = {"latent_shape": torch.tensor([[4, 16, 20]]), "patch_size": torch.tensor([[1, 2, 2]])}
    dispatcher = StandInDispatcher({"config": {"pattern": {"type": "sliding_window"},
                                               "geometry": {"block_q": 16, "block_kv": 16},
                                               "options": {"frame_radius": "1", "height_radius": "1",
                                                           "width_radius": "1"}}})
    keep = torch.ones(1, padded, dtype=torch.bool)
    keep[:, real:] = False
    out = dispatcher.forward(q, k, v, per_forward=geometry, attn_mask=keep)
    unpadded = dispatcher.forward(q[:, :real], k[:, :real], v[:, :real], per_forward=geometry)
    torch.testing.assert_close(out[:, :real], unpadded, atol=0, rtol=0)  # the real tokens: the pattern, as unpadded
    assert not torch.allclose(unpadded, attention(q[:, :real], k[:, :real], v[:, :real]), atol=1e-3)  # sparse
    torch.testing.assert_close(out[:, real:], torch_attention(q, k, v, mask=keep[:, None, None, :])[:, real:],
                               atol=2e-6, rtol=1e-5)  # padding rows: dense over the real keys


def test_a_config_is_built_once_per_distinct_params(monkeypatch):
    q, k, v = qkv(seq=128)
    built = []
    original = vllm_omni_plugin.config_from_params
    monkeypatch.setattr(vllm_omni_plugin, "config_from_params", lambda p: built.append(p) or original(p))
    # Values no other test uses: the entry point is one object whose runners outlive a test.
    for static in ({"pattern": "dynamic_topk", "topk_ratio": 0.4375},
                   {"config": {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.3125}}}):
        dispatcher = StandInDispatcher(static)
        first = dispatcher.forward(q, k, v, per_forward={"denoise_step_idx": torch.tensor([3])})
        again = dispatcher.forward(q, k, v, per_forward={"denoise_step_idx": torch.tensor([4])})
        torch.testing.assert_close(first, again)
    assert len(built) == 2  # one per distinct static params, not one per call
    # A cached config form does not let the two forms together through.
    with pytest.raises(ValueError, match="both 'config' and"):
        StandInDispatcher({"config": {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.3125}},
                           "topk_ratio": 0.3}).forward(q, k, v)


def test_bad_params_are_refused_naming_them():
    q, k, v = qkv(seq=64)
    with pytest.raises(ValueError, match="supports_full_attn_spans"):
        StandInDispatcher({}).forward(q, k, v, full_attn_spans=[[(0, 4)]])
    with pytest.raises(ValueError, match="sparse_attn.pattern.type.*'spiral'"):
        StandInDispatcher({"pattern": "spiral"}).forward(q, k, v)
    with pytest.raises(ValueError, match="pattern 'spatial_aware' is not one of"):
        StandInDispatcher({"pattern": "spatial_aware"}).forward(q, k, v)
    with pytest.raises(ValueError, match="both 'config' and"):
        StandInDispatcher({"config": {}, "topk_ratio": 0.3}).forward(q, k, v)
    with pytest.raises(ValueError, match="topk_ratio"):
        StandInDispatcher({"pattern": "dynamic_topk", "topk_ratio": 0}).forward(q, k, v)
    with pytest.raises(ValueError, match="denoise_step_idx"):
        StandInDispatcher({}).forward(q, k, v, per_forward={"denoise_step_idx": "three"})
    with pytest.raises(ValueError, match="BSND"):
        StandInDispatcher({}, qkv_layout="BHSD")
    with pytest.raises(ValueError, match="attn_mask with bias"):
        StandInDispatcher({}).forward(q, k, v, attn_mask=torch.randn(1, 64))
    assert math.isfinite(float(StandInDispatcher({}).forward(q, k, v).sum()))
