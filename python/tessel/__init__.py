"""tessel: sparse attention for diffusion transformers and long-context prefill.

Importing tessel needs no GPU: CUDA kernels are used when the build has them and the tensors are
on a GPU. With torch installed, the ops are also registered as torch.ops.tessel.*. WanPipeline
generates Wan videos from a diffusers model directory (tessel.testing writes tiny random ones).
"""
from ._tessel import TesselError, cuda_available, cuda_compiled
from . import planners
from .block_mask import BlockMask
from .estimators import estimate_threshold, estimate_topk
from .functional import attention, block_sparse_attention, merge_states
from .pipeline import WanPipeline
from .planners import plan_arrow, plan_local, plan_radial, plan_sliding_window_3d
from .sparse_config import SparseAttentionConfig

try:
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None
if _torch is not None:
    from . import torch_ops  # noqa: F401  (registers torch.ops.tessel.*)
    from .sparse_module import PlanCache, SparseAttention, denoising_step  # noqa: F401

__all__ = [
    "BlockMask",
    "TesselError",
    "WanPipeline",
    "attention",
    "block_sparse_attention",
    "cuda_available",
    "cuda_compiled",
    "estimate_threshold",
    "estimate_topk",
    "merge_states",
    "plan_arrow",
    "plan_local",
    "plan_radial",
    "plan_sliding_window_3d",
    "planners",
    "SparseAttentionConfig",
]
