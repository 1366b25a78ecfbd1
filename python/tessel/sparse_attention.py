"""One sparse-attention call per (step, layer) under a SparseAttentionConfig (the C++ schema): dense,
a static pattern planned once per grid (cached), or a dynamic mask estimated from q and k every call
by the library's dynamic_topk / threshold backend (through tessel.SparseAttention: host estimation
for CPU tensors, device estimation on torch's stream for CUDA tensors).

The fields read: pattern.type (dense, dynamic_topk, threshold, radial, local, sliding_window on the
latent grid), pattern.decay_factor / local_window_size / spatial_radius, options frame_radius /
height_radius / width_radius (sliding_window, as the C++ static pattern reads them) and frame0_sink
(radial), geometry.block_q / block_kv, selection.keep_diagonal / sink_blocks, warmup.dense_steps /
dense_layers and backend "none" (dense)."""
from __future__ import annotations

import json

from . import planners
from .functional import attention, block_sparse_attention
from .sparse_config import SparseAttentionConfig

DYNAMIC_PATTERNS = ("dynamic_topk", "threshold")
STATIC_PATTERNS = ("radial", "local", "sliding_window")
SUPPORTED_PATTERNS = ("dense",) + DYNAMIC_PATTERNS + STATIC_PATTERNS


def _option_int(config: SparseAttentionConfig, key: str, default: int) -> int:
    value = config.options.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"sparse_attn.options.{key}: expected an integer, got {value!r}") from None


def _static_pattern(c: SparseAttentionConfig):
    if c.pattern.type == "radial":
        frame0_sink = str(c.options.get("frame0_sink", "true")).lower() not in ("false", "0")
        return planners.radial(c.pattern.decay_factor, frame0_sink)
    if c.pattern.type == "local":
        return planners.local(c.pattern.local_window_size)
    radius = c.pattern.spatial_radius if c.pattern.spatial_radius is not None else 4
    return planners.sliding_window_3d(_option_int(c, "frame_radius", 1), _option_int(c, "height_radius", radius),
                                      _option_int(c, "width_radius", radius))


class SparseAttentionRunner:
    """Holds the config, the latent grid of the current call and the static plan cache."""

    def __init__(self, config: SparseAttentionConfig):
        if config.pattern.type not in SUPPORTED_PATTERNS:
            raise ValueError(f"sparse_attn.pattern.type: this integration runs {', '.join(SUPPORTED_PATTERNS)}, "
                             f"got {config.pattern.type!r}")
        self.config = config
        self.grid = None  # (frames, height, width) of latent patches, set by the integration
        self.step = 0
        self.last_report = None  # of the latest sparse call (the library module's, for dynamic patterns)
        self._static_masks = {}
        self._library_modules = {}
        self._plan_cache = None

    def _static_mask(self, seq: int):
        c = self.config
        kind = c.pattern.type
        if self.grid is None:
            raise RuntimeError(f"pattern {kind}: the latent grid is unknown (no transformer forward seen, or its "
                               "image tokens are not one raster grid)")
        frames, height, width = self.grid
        if frames * height * width != seq:
            raise ValueError(f"pattern {kind}: grid {self.grid} has {frames * height * width} tokens, "
                             f"the sequence has {seq}")
        if self.grid not in self._static_masks:
            self._static_masks[self.grid] = planners.plan(
                _static_pattern(c), self.grid, block_q=c.geometry.block_q, block_kv=c.geometry.block_kv,
                keep_diagonal=c.selection.keep_diagonal, sink_blocks=c.selection.sink_blocks)
        return self._static_masks[self.grid]

    def _library_config(self) -> str:
        # The config as is, except: the backend is the pattern's own when "auto", and no warm-up
        # (decided here, per step and layer).
        values = self.config.to_dict()
        if values["backend"] == "auto":
            values["backend"] = self.config.pattern.type
        values["warmup"] = {"dense_steps": 0, "dense_layers": 0}
        return json.dumps(values)

    def _dynamic(self, q, k, v, return_lse: bool = False):
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
        out = module(q, k, v, return_lse=return_lse)
        self.last_report = module.last_report
        return out

    def sparse(self, q, k, v, return_lse: bool = False):
        """q, k, v (B, S, H, D) self-attention by the config's pattern, whatever the step (the
        caller decides warm-up); last_report says what ran."""
        if self.config.pattern.type in DYNAMIC_PATTERNS:
            return self._dynamic(q, k, v, return_lse=return_lse)
        mask = self._static_mask(q.shape[1])
        self.last_report = {"backend": self.config.pattern.type, "dense": False, "density": mask.density()}
        return block_sparse_attention(q, k, v, mask, return_lse=return_lse)

    def __call__(self, q, k, v, layer: int):
        """q, k, v (B, S, H, D) self-attention of layer `layer` at the current step."""
        if self.config.is_dense_at(self.step, layer):
            return attention(q, k, v)
        return self.sparse(q, k, v)
