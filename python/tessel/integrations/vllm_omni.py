"""A vLLM-Omni sparse-attention backend (entry point group `vllm_omni.sparse_attn`, name `tessel`)
written against the plugin protocol that vLLM-Omni's DiT sparse-attention RFC describes:
SparseAttentionBackend (factory of static methods), SparseMetadataBuilder.plan / update_step and
SparseAttentionImpl.forward on (B, S, H, D) tensors.

Patterns: DENSE, BLOCK_SPARSE (spec.block_mask (H, Qb, KVb) or spec.bsr_indptr / bsr_indices with
one BSR per head), SLIDING_WINDOW (token window of spec.window_size each side) and DYNAMIC_TOPK
(spec.topk_ratio, the mask estimated from q and k at every forward). Module type: DiT self-attention.

The classes derive from vLLM-Omni's base classes when vLLM-Omni is installed and from `object`
otherwise, so this module imports (and its plan/forward run) without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..block_mask import BlockMask
from ..estimators import estimate_topk
from ..functional import attention, block_sparse_attention

try:
    from vllm_omni.diffusion.sparse_attn.base import (AttentionModuleType, SparseAttentionBackend,
                                                      SparseAttentionImpl, SparseAttentionMetadata,
                                                      SparseMetadataBuilder)
    from vllm_omni.diffusion.sparse_attn.pattern import SparsePatternType
except ImportError:  # vLLM-Omni not installed: the same classes without its bases
    AttentionModuleType = SparsePatternType = None
    SparseAttentionBackend = SparseAttentionImpl = SparseAttentionMetadata = SparseMetadataBuilder = object

SUPPORTED_PATTERNS = ("DENSE", "BLOCK_SPARSE", "SLIDING_WINDOW", "DYNAMIC_TOPK")
SUPPORTED_MODULE_TYPES = ("DIT_SELF",)


@dataclass
class TesselSparseMetadata(SparseAttentionMetadata):
    """What plan() decided: the pattern's name, a static BlockMask or the top-k ratio, the window."""

    pattern: str = "DENSE"
    mask: Optional[BlockMask] = None
    window: int = -1
    topk_ratio: float = 1.0
    block_q: int = 128
    block_kv: int = 64
    step: int = 0
    total_steps: int = 0
    extra: dict = field(default_factory=dict)


def _enum_name(value: Any) -> str:
    return getattr(value, "name", str(value)).upper()


def _static_block_mask(spec, seq_len_q: int, seq_len_kv: int) -> BlockMask:
    geometry = dict(seq_q=seq_len_q, seq_kv=seq_len_kv, block_q=spec.block_size_q, block_kv=spec.block_size_kv)
    if spec.block_mask is not None:
        dense = spec.block_mask
        return BlockMask.from_dense(dense.reshape((1,) + tuple(dense.shape)), **geometry)
    if spec.bsr_indptr is not None and spec.bsr_indices is not None:
        q_blocks = -(-seq_len_q // spec.block_size_q)
        rows = spec.bsr_indptr.shape[0] - 1
        heads = rows // q_blocks if q_blocks else 1
        return BlockMask.from_csr(spec.bsr_indptr, spec.bsr_indices, mask_batch=1, mask_heads=heads, **geometry)
    raise ValueError("BLOCK_SPARSE: expected spec.block_mask (H, Qb, KVb) or spec.bsr_indptr and spec.bsr_indices")


class TesselMetadataBuilder(SparseMetadataBuilder):
    def plan(self, pattern_spec, module_type, num_qo_heads, num_kv_heads, head_dim, seq_len_q, seq_len_kv,
             batch_size=1, dtype=None, device=None):
        pattern = _enum_name(pattern_spec.pattern_type)
        if pattern not in SUPPORTED_PATTERNS:
            raise ValueError(f"tessel backend: pattern {pattern} is not supported ({', '.join(SUPPORTED_PATTERNS)})")
        if _enum_name(module_type) not in SUPPORTED_MODULE_TYPES:
            raise ValueError(f"tessel backend: module type {_enum_name(module_type)} is not supported")
        metadata = TesselSparseMetadata(pattern=pattern, block_q=pattern_spec.block_size_q,
                                        block_kv=pattern_spec.block_size_kv)
        if pattern == "BLOCK_SPARSE":
            metadata.mask = _static_block_mask(pattern_spec, seq_len_q, seq_len_kv)
            if device is not None and str(device).startswith("cuda"):
                metadata.mask.csr_on(device)  # device copy made at plan time, outside any capture
        elif pattern == "SLIDING_WINDOW":
            if pattern_spec.window_size is None or pattern_spec.window_size < 0:
                raise ValueError(f"SLIDING_WINDOW: expected window_size >= 0, got {pattern_spec.window_size}")
            metadata.window = int(pattern_spec.window_size)
        elif pattern == "DYNAMIC_TOPK":
            ratio = pattern_spec.topk_ratio if pattern_spec.topk_ratio is not None else 0.5
            if not 0.0 < ratio <= 1.0:
                raise ValueError(f"DYNAMIC_TOPK: expected topk_ratio in (0, 1], got {ratio}")
            metadata.topk_ratio = float(ratio)
        return metadata

    def update_step(self, metadata, step, total_steps):
        metadata.step, metadata.total_steps = step, total_steps
        return metadata


class TesselSparseImpl(SparseAttentionImpl):
    def forward(self, query, key, value, metadata, output=None):
        if metadata.pattern == "BLOCK_SPARSE":
            result = block_sparse_attention(query, key, value, metadata.mask)
        elif metadata.pattern == "SLIDING_WINDOW":
            result = attention(query, key, value, window=(metadata.window, metadata.window))
        elif metadata.pattern == "DYNAMIC_TOPK":
            mask = estimate_topk(query, key, topk_ratio=metadata.topk_ratio, block_q=metadata.block_q,
                                 block_kv=metadata.block_kv, keep_diagonal=True)
            result = block_sparse_attention(query, key, value, mask)
        else:
            result = attention(query, key, value)
        if output is not None:
            output.copy_(result)
            return output
        return result


class TesselSparseBackend(SparseAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "tessel"

    @staticmethod
    def get_impl_cls():
        return TesselSparseImpl

    @staticmethod
    def get_metadata_builder_cls():
        return TesselMetadataBuilder

    @staticmethod
    def supported_patterns() -> set:
        if SparsePatternType is None:
            return set(SUPPORTED_PATTERNS)
        return {SparsePatternType[name] for name in SUPPORTED_PATTERNS}

    @staticmethod
    def supported_module_types() -> set:
        if AttentionModuleType is None:
            return set(SUPPORTED_MODULE_TYPES)
        return {AttentionModuleType[name] for name in SUPPORTED_MODULE_TYPES}

    @staticmethod
    def validate_config(config) -> None:
        pattern = str(getattr(config, "pattern_type", "dense")).upper()
        if pattern not in SUPPORTED_PATTERNS:
            raise ValueError(f"tessel backend: pattern_type {pattern.lower()} is not supported "
                             f"({', '.join(p.lower() for p in SUPPORTED_PATTERNS)})")
