"""Dynamic (data-dependent) block masks estimated from q and k on the CPU: dynamic top-k
(SpargeAttn-style pooled scores) and threshold (XAttention's strided antidiagonal scores).
Each returns a tessel.BlockMask with mask_batch = B (and mask_heads = H_q unless aggregated)."""
from __future__ import annotations

from ._arrays import is_torch_tensor
from . import _tessel
from .block_mask import BlockMask


def _host_input(x):
    if is_torch_tensor(x):
        from torch.utils.dlpack import to_dlpack

        return to_dlpack(x.detach())
    return x


def _scale(softmax_scale) -> float:
    return 0.0 if softmax_scale is None else float(softmax_scale)


def estimate_topk(q, k, *, topk_ratio: float = 0.5, cdf_threshold: float = 0.0, per_head=None,
                  similarity_threshold: float = 0.1, block_q: int = 128, block_kv: int = 64, softmax_scale=None,
                  keep_diagonal: bool = False, sink_blocks: int = 0, return_time: bool = False):
    """Keeps, per (batch, head, q block), the kv blocks with the highest pooled-score softmax:
    round(topk_ratio · kv_blocks) of them, or (cdf_threshold > 0) the fewest reaching that mass.
    Blocks that are not self-similar (mean cosine <= similarity_threshold) are kept whole.
    return_time=True also returns the estimation time in ms."""
    mask, ms = _tessel.estimate_topk(_host_input(q), _host_input(k), topk_ratio, cdf_threshold, list(per_head or []),
                                     similarity_threshold, block_q, block_kv, _scale(softmax_scale), keep_diagonal,
                                     sink_blocks)
    return (BlockMask(mask), ms) if return_time else BlockMask(mask)


def estimate_threshold(q, k, *, threshold: float = 0.95, per_head_threshold=None, stride: int = 8,
                       block_q: int = 128, block_kv: int = 64, softmax_scale=None, keep_diagonal: bool = True,
                       keep_first: bool = True, gqa_any: bool = False, vote: str = "none",
                       vote_threshold: float = 0.5, return_time: bool = False):
    """XAttention: per row, the fewest highest-mass kv blocks reaching `threshold` of the row's
    antidiagonal-score mass (block sizes multiples of `stride`). vote = 'heads' or 'columns'
    aggregates over heads; gqa_any merges each kv head's query heads."""
    mask, ms = _tessel.estimate_threshold(_host_input(q), _host_input(k), threshold, list(per_head_threshold or []),
                                          stride, block_q, block_kv, _scale(softmax_scale), keep_diagonal, keep_first,
                                          gqa_any, vote, vote_threshold)
    return (BlockMask(mask), ms) if return_time else BlockMask(mask)
