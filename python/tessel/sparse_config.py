"""The sparse-attention settings of the Python integrations: which pattern, its parameters, and
when attention stays dense (warm-up steps, first layers). Field names follow the C++ config
(block_size_q, block_size_kv, topk_ratio, ...); `from_dict` also takes the RFC's `pattern_type`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PATTERNS = ("dense", "dynamic_topk", "threshold", "radial", "local", "sliding_window_3d")


@dataclass(frozen=True)
class SparseAttentionConfig:
    pattern: str = "dense"
    block_size_q: int = 128
    block_size_kv: int = 64
    # dynamic_topk
    topk_ratio: float = 0.5
    cdf_threshold: float = 0.0
    similarity_threshold: float = 0.1
    # threshold (XAttention)
    threshold: float = 0.95
    stride: int = 8
    # static patterns on the latent grid
    decay_factor: float = 1.0
    local_window_size: int = 6
    window_3d: tuple = (1, 4, 4)  # frame, height, width radii
    keep_diagonal: bool = True
    # dense warm-up: the first steps and the first layers attend densely
    dense_warmup_steps: int = 0
    dense_layers: int = 0

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern: expected one of {', '.join(PATTERNS)}, got {self.pattern!r}")
        if self.block_size_q < 1 or self.block_size_kv < 1:
            raise ValueError(f"block sizes: expected >= 1, got {self.block_size_q} and {self.block_size_kv}")
        if not 0.0 < self.topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio: expected a value in (0, 1], got {self.topk_ratio}")
        if self.dense_warmup_steps < 0 or self.dense_layers < 0:
            raise ValueError("dense_warmup_steps, dense_layers: expected >= 0, got "
                             f"{self.dense_warmup_steps} and {self.dense_layers}")

    @classmethod
    def from_any(cls, config) -> "SparseAttentionConfig":
        """A config from None (dense), an instance, or a dict of the fields above."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls.from_dict(config)
        raise TypeError(f"config: expected a SparseAttentionConfig, a dict or None, got {type(config).__name__}")

    @classmethod
    def from_dict(cls, values: dict) -> "SparseAttentionConfig":
        values = dict(values)
        if "pattern_type" in values:
            values["pattern"] = values.pop("pattern_type")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "window_3d" in values:
            values["window_3d"] = tuple(values["window_3d"])
        return cls(**values)

    def is_dense_at(self, step: int, layer: int) -> bool:
        return self.pattern == "dense" or step < self.dense_warmup_steps or layer < self.dense_layers
