"""tessel.SparseAttention: the library's drop-in sparse-attention module as a torch nn.Module.

The config is the C++ SparseAttnConfig (include/tessel/sparse/config.h): a tessel.SparseAttentionConfig,
JSON text, a .json file, a dict in its nested (or flat) keys, or an object with the fields of
vLLM-Omni's DiffusionSparseAttnConfig. Backend resolution (env TESSEL_SPARSE_ATTN_BACKEND or
DIFFUSION_SPARSE_ATTN_BACKEND > config > auto > none), step schedules, dense warm-up steps and layers
(warmup.dense_steps / dense_layers), and a plan cache that layers of one shape share. The denoising
step reaches forward through `denoising_step(step, total_steps)`:

    config = {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.2},
              "warmup": {"dense_steps": 10}}
    layers = [tessel.SparseAttention(40, 128, config=config, layer_index=i, plan_cache=cache)
              for i in range(30)]
    with tessel.denoising_step(step, total_steps=50):
        out = layers[i](q, k, v)

forward runs eagerly (it is not a torch.library op); CUDA work goes on torch's current stream.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os

import torch
from torch.utils.dlpack import to_dlpack

from . import _tessel
from .sparse_config import SparseAttentionConfig, translate_legacy_names
from .torch_ops import check_forward_only

_step_info = contextvars.ContextVar("tessel_step_info", default=None)
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_plugin_dirs_applied = False

PlanCache = _tessel.PlanCache


@contextlib.contextmanager
def denoising_step(step: int, total_steps: int, cfg_branch: int = 0):
    """Sets the step (and CFG branch) every SparseAttention forward in the block sees."""
    token = _step_info.set((int(step), int(total_steps), int(cfg_branch)))
    try:
        yield
    finally:
        _step_info.reset(token)


def config_json(config) -> str:
    """JSON text of a config given as None, a SparseAttentionConfig, JSON text, a path to a .json file,
    a dict (the C++ keys, nested or flat; the older Python names warn and are mapped) or a dataclass
    with the C++ flat fields (vLLM-Omni's DiffusionSparseAttnConfig). The library parses and checks it."""
    if config is None:
        return "{}"
    if isinstance(config, SparseAttentionConfig):
        return config.to_json()
    if isinstance(config, str):
        if config.lstrip().startswith("{"):
            return config
        with open(config) as f:
            return f.read()
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if isinstance(config, dict):
        return json.dumps(translate_legacy_names({key: value for key, value in config.items() if value is not None}))
    raise TypeError(f"config: expected None, a SparseAttentionConfig, JSON text, a file path, a dict or a dataclass, "
                    f"got {type(config).__name__}")


def _backend_override() -> str:
    return os.environ.get("TESSEL_SPARSE_ATTN_BACKEND") or os.environ.get("DIFFUSION_SPARSE_ATTN_BACKEND") or ""


def _apply_plugin_dirs() -> None:
    global _plugin_dirs_applied
    if not _plugin_dirs_applied:
        paths = os.environ.get("TESSEL_PLUGIN_PATH", "")
        _tessel.set_plugin_dirs([p for p in paths.split(":") if p])
        _plugin_dirs_applied = True


class SparseAttention(torch.nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int | None = None, *, config=None,
                 layer_index: int = 0, dtype: torch.dtype = torch.bfloat16, device="cpu",
                 plan_cache: PlanCache | None = None):
        super().__init__()
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype: expected one of {list(_DTYPE_NAMES)}, got {dtype}")
        _apply_plugin_dirs()
        self.layer_index = layer_index
        self.dtype = dtype
        self._module = _tessel.SparseAttentionModule(num_heads, head_dim, num_kv_heads or num_heads,
                                                     config_json(config), _backend_override(), _DTYPE_NAMES[dtype],
                                                     str(torch.device(device)), layer_index, plan_cache)
        self.last_report = None

    @property
    def backend(self) -> str:
        """The resolved backend's name ("none": dense attention)."""
        return self._module.backend

    @property
    def resolution_source(self) -> str:
        """Where the backend came from: env, config, auto or none."""
        return self._module.resolution_source

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool = False):
        """out (B, S_q, H, D); with return_lse, (out, lse) with lse (B, H, S_q) fp32, for merging with
        attention over other keys (tessel.functional.merge_states)."""
        check_forward_only("SparseAttention", q, k, v)
        step, total_steps, cfg_branch = _step_info.get() or (None, 0, 0)
        out = q.new_empty(q.shape)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_lse else None
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
        self.last_report = self._module.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out),
                                                None if lse is None else to_dlpack(lse), step, total_steps,
                                                self.layer_index, cfg_branch, stream)
        return (out, lse) if return_lse else out

    def extra_repr(self) -> str:
        return f"layer_index={self.layer_index}, backend={self.backend}, source={self.resolution_source}"
