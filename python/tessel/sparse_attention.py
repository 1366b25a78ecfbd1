"""One sparse-attention call per (step, layer) under a SparseAttentionConfig: dense, a static
pattern planned once per grid (cached), or a dynamic mask estimated from q and k every call."""
from __future__ import annotations

from . import planners
from .estimators import estimate_threshold, estimate_topk
from .functional import attention, block_sparse_attention
from .sparse_config import SparseAttentionConfig


class SparseAttentionRunner:
    """Holds the config, the latent grid of the current call and the static plan cache."""

    def __init__(self, config: SparseAttentionConfig):
        self.config = config
        self.grid = None  # (frames, height, width) of latent patches, set by the integration
        self.step = 0
        self._static_masks = {}

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

    def _dynamic_mask(self, q, k):
        c = self.config
        if c.pattern == "dynamic_topk":
            return estimate_topk(q, k, topk_ratio=c.topk_ratio, cdf_threshold=c.cdf_threshold,
                                 similarity_threshold=c.similarity_threshold, block_q=c.block_size_q,
                                 block_kv=c.block_size_kv, keep_diagonal=c.keep_diagonal)
        return estimate_threshold(q, k, threshold=c.threshold, stride=c.stride, block_q=c.block_size_q,
                                  block_kv=c.block_size_kv, keep_diagonal=c.keep_diagonal)

    def __call__(self, q, k, v, layer: int):
        """q, k, v (B, S, H, D) self-attention of layer `layer` at the current step."""
        if self.config.is_dense_at(self.step, layer):
            return attention(q, k, v)
        if self.config.pattern in ("dynamic_topk", "threshold"):
            mask = self._dynamic_mask(q, k)
        else:
            mask = self._static_mask(q.shape[1])
        return block_sparse_attention(q, k, v, mask)
