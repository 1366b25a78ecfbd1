"""The vLLM-Omni backend against a minimal stand-in of the RFC's base classes (vLLM-Omni itself is
not installed here): the classes derive from the stand-in ABCs, plan/update_step/forward follow the
protocol, and the results match tessel's own ops."""
import enum
import importlib
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessel  # noqa: E402


class SparsePatternType(enum.Enum):
    BLOCK_SPARSE = "block_sparse"
    SLIDING_WINDOW = "sliding_window"
    SPATIAL_AWARE = "spatial_aware"
    DYNAMIC_TOPK = "dynamic_topk"
    ARROW = "arrow"
    COMPOSITE = "composite"
    DENSE = "dense"


class AttentionModuleType(enum.Enum):
    DIT_SELF = "dit_self"
    DIT_CROSS = "dit_cross"


@dataclass
class SparsePatternSpec:
    pattern_type: SparsePatternType
    block_size_q: int = 128
    block_size_kv: int = 64
    block_mask: Optional[torch.Tensor] = None
    bsr_indptr: Optional[torch.Tensor] = None
    bsr_indices: Optional[torch.Tensor] = None
    window_size: Optional[int] = None
    topk_ratio: Optional[float] = None


class SparseAttentionMetadata:
    pass


class SparseAttentionImpl(ABC):
    @abstractmethod
    def forward(self, query, key, value, metadata, output=None): ...


class SparseMetadataBuilder(ABC):
    @abstractmethod
    def plan(self, pattern_spec, module_type, num_qo_heads, num_kv_heads, head_dim, seq_len_q, seq_len_kv,
             batch_size=1, dtype=torch.float16, device=torch.device("cuda")): ...

    def update_step(self, metadata, step, total_steps):
        return metadata


class SparseAttentionBackend(ABC):
    for _name in ("get_name", "get_impl_cls", "get_metadata_builder_cls", "supported_patterns",
                  "supported_module_types"):
        locals()[_name] = staticmethod(abstractmethod(lambda: None))


@pytest.fixture
def plugin(monkeypatch):
    base = types.ModuleType("vllm_omni.diffusion.sparse_attn.base")
    base.__dict__.update(AttentionModuleType=AttentionModuleType, SparseAttentionBackend=SparseAttentionBackend,
                         SparseAttentionImpl=SparseAttentionImpl, SparseAttentionMetadata=SparseAttentionMetadata,
                         SparseMetadataBuilder=SparseMetadataBuilder)
    pattern = types.ModuleType("vllm_omni.diffusion.sparse_attn.pattern")
    pattern.SparsePatternType = SparsePatternType
    for name in ("vllm_omni", "vllm_omni.diffusion", "vllm_omni.diffusion.sparse_attn"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.setitem(sys.modules, pattern.__name__, pattern)
    return importlib.reload(importlib.import_module("tessel.integrations.vllm_omni"))


def qkv(seq=96, heads=4, dim=32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, seq, heads, dim, generator=gen) for _ in range(3)]


def test_classes_implement_the_protocol(plugin):
    backend = plugin.TesselSparseBackend
    assert issubclass(backend, SparseAttentionBackend)
    assert issubclass(backend.get_impl_cls(), SparseAttentionImpl)
    assert issubclass(backend.get_metadata_builder_cls(), SparseMetadataBuilder)
    assert isinstance(backend.get_metadata_builder_cls()().plan(SparsePatternSpec(SparsePatternType.DENSE),
                                                                AttentionModuleType.DIT_SELF, 4, 4, 32, 96, 96),
                      SparseAttentionMetadata)
    assert backend.get_name() == "tessel"
    assert SparsePatternType.DYNAMIC_TOPK in backend.supported_patterns()
    assert backend.supported_module_types() == {AttentionModuleType.DIT_SELF}


def test_plan_and_forward(plugin):
    builder, impl = plugin.TesselMetadataBuilder(), plugin.TesselSparseImpl()
    q, k, v = qkv()
    plan = lambda spec: builder.plan(spec, AttentionModuleType.DIT_SELF, 4, 4, 32, 96, 96, device="cpu")  # noqa
    keep = torch.from_numpy(np.random.default_rng(0).random((4, 3, 3)) < 0.5)
    keep[..., 0] = True
    spec = SparsePatternSpec(SparsePatternType.BLOCK_SPARSE, block_size_q=32, block_size_kv=32, block_mask=keep)
    mask = tessel.BlockMask.from_dense(keep[None], seq_q=96, seq_kv=96, block_q=32, block_kv=32)
    torch.testing.assert_close(impl.forward(q, k, v, plan(spec)), tessel.block_sparse_attention(q, k, v, mask))
    csr = SparsePatternSpec(SparsePatternType.BLOCK_SPARSE, block_size_q=32, block_size_kv=32,
                            bsr_indptr=torch.from_numpy(mask.indptr), bsr_indices=torch.from_numpy(mask.indices))
    assert plan(csr).mask == mask
    window = plan(SparsePatternSpec(SparsePatternType.SLIDING_WINDOW, window_size=8))
    output = torch.empty_like(q)
    assert impl.forward(q, k, v, window, output=output) is output
    torch.testing.assert_close(output, tessel.attention(q, k, v, window=(8, 8)))
    topk = plan(SparsePatternSpec(SparsePatternType.DYNAMIC_TOPK, block_size_q=32, block_size_kv=32, topk_ratio=0.34))
    assert builder.update_step(topk, 3, 50).step == 3
    assert impl.forward(q, k, v, topk).shape == q.shape
    torch.testing.assert_close(impl.forward(q, k, v, plan(SparsePatternSpec(SparsePatternType.DENSE))),
                               tessel.attention(q, k, v))


def test_unsupported_requests_are_refused(plugin):
    builder = plugin.TesselMetadataBuilder()
    with pytest.raises(ValueError, match="ARROW"):
        builder.plan(SparsePatternSpec(SparsePatternType.ARROW), AttentionModuleType.DIT_SELF, 4, 4, 32, 96, 96)
    with pytest.raises(ValueError, match="DIT_CROSS"):
        builder.plan(SparsePatternSpec(SparsePatternType.DENSE), AttentionModuleType.DIT_CROSS, 4, 4, 32, 96, 96)
    with pytest.raises(ValueError, match="window_size"):
        builder.plan(SparsePatternSpec(SparsePatternType.SLIDING_WINDOW), AttentionModuleType.DIT_SELF, 4, 4, 32,
                     96, 96)
    with pytest.raises(ValueError, match="spatial_aware"):
        plugin.TesselSparseBackend.validate_config(types.SimpleNamespace(pattern_type="spatial_aware"))
