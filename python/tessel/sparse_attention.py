"""One sparse-attention call per (step, layer) under a SparseAttentionConfig: dense, a static
pattern planned once per grid (cached), or a dynamic mask estimated from q and k every call by the
library's dynamic_topk / threshold backend (through tessel.SparseAttention: host estimation for CPU
tensors, device estimation on torch's stream for CUDA tensors)."""
from __future__ import annotations

import json

from . import planners
from .functional import attention, block_sparse_attention
from .sparse_config import SparseAttentionConfig


class SparseAttentionRunner:
    """Holds the config, the latent grid of the current call and the static plan cache."""

    def __init__(self, config: SparseAttentionConfig):
        self.config = config
        self.grid = None  # (frames, height, width) of latent patches, set by the integration
        self.step = 0
        self.last_report = None  # the library module's report of the latest dynamic call
        self._static_masks = {}
        self._library_modules = {}
        self._plan_cache = None

    def _static_mask(self, seq: int):
        c = self.config
        if self.grid is None:
            raise RuntimeError(f"pattern {c.pattern}: the latent grid is unknown (no transformer forward seen)")
        frames, height, width = self.grid
        if frames * height * width != seq:
            raise ValueError(f"pattern {c.pattern}: grid {self.grid} has {frames * height * width} tokens, "
                             f"the sequence has {seq}")
        key = (c.pattern, self.grid)
        if key not in self._static_masks:
            pattern = {
                "radial": lambda: planners.radial(c.decay_factor),
                "local": lambda: planners.local(c.local_window_size),
                "sliding_window_3d": lambda: planners.sliding_window_3d(*c.window_3d),
            }[c.pattern]()
            self._static_masks[key] = planners.plan(pattern, self.grid, block_q=c.block_size_q,
                                                    block_kv=c.block_size_kv, keep_diagonal=c.keep_diagonal)
        return self._static_masks[key]

    def _library_config(self) -> str:
        c = self.config
        return json.dumps({"backend": c.pattern, "pattern_type": c.pattern, "block_size_q": c.block_size_q,
                           "block_size_kv": c.block_size_kv, "topk_ratio": c.topk_ratio, "threshold": c.threshold,
                           "stride": c.stride, "keep_diagonal": c.keep_diagonal,
                           "options": {"cdf": str(c.cdf_threshold),
                                       "similarity_threshold": str(c.similarity_threshold)}})

    def _dynamic(self, q, k, v):
        # One library module per (shape, dtype, device), sharing one plan cache; warm-up is decided
        # here, so the module runs without a step (the config's topk_ratio / threshold every call).
        from .sparse_module import PlanCache, SparseAttention

        key = (q.shape[2], k.shape[2], q.shape[3], q.dtype, q.device)
        if key not in self._library_modules:
            if self._plan_cache is None:
                self._plan_cache = PlanCache()
            self._library_modules[key] = SparseAttention(q.shape[2], q.shape[3], k.shape[2],
                                                         config=self._library_config(), dtype=q.dtype,
                                                         device=q.device, plan_cache=self._plan_cache)
        module = self._library_modules[key]
        out = module(q, k, v)
        self.last_report = module.last_report
        return out

    def __call__(self, q, k, v, layer: int):
        """q, k, v (B, S, H, D) self-attention of layer `layer` at the current step."""
        if self.config.is_dense_at(self.step, layer):
            return attention(q, k, v)
        if self.config.pattern in ("dynamic_topk", "threshold"):
            return self._dynamic(q, k, v)
        return block_sparse_attention(q, k, v, self._static_mask(q.shape[1]))
