"""The functional API, BSHD like flash_attn_func: q (B, S_q, H_q, D), k and v (B, S_kv, H_kv, D).

torch tensors go through the torch.library ops of tessel.torch_ops (so torch.compile traces them;
eager calls on plain tensors skip the dispatcher; CUDA work runs on torch's current stream); any other DLPack array (numpy on the CPU) is handed
to the extension directly. Outputs are new arrays of the inputs' framework, device and dtype;
inputs are read in place (any strides with a dense head dimension).
"""
from __future__ import annotations

import numpy as np

from . import _tessel
from ._arrays import is_torch_tensor
from .block_mask import BlockMask


def _scale_arg(softmax_scale) -> float:
    if softmax_scale is None:
        return 0.0  # the library's default, 1/sqrt(D)
    if softmax_scale == 0:
        raise ValueError("softmax_scale: expected a nonzero value or None (1/sqrt(head_dim)), got 0")
    return float(softmax_scale)


def _window_args(window) -> tuple:
    left, right = window
    return int(left), int(right)


def _check_arrays(**arrays) -> None:
    for name, x in arrays.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "__dlpack__")):
            raise TypeError(f"{name}: expected a torch tensor or a DLPack array (numpy), got {type(x).__name__}")


def _lse_shape(q) -> tuple:
    # Only meaningful for 4-D q; the extension rejects any other rank before looking at lse.
    return (q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (0, 0, 0)


def attention(q, k, v, *, causal: bool = False, window=(-1, -1), softmax_scale=None, return_lse: bool = False):
    """Dense attention. window = (left, right) tokens, -1 = unbounded; causal is bottom-right
    aligned when S_q != S_kv. Returns out (B, S_q, H_q, D), and lse (B, H_q, S_q) fp32 when asked."""
    scale = _scale_arg(softmax_scale)
    left, right = _window_args(window)
    if is_torch_tensor(q):
        from . import torch_ops

        torch_ops.check_forward_only("attention", q, k, v)
        op = torch_ops.run_attention if torch_ops.eager_call(q) else torch_ops.attention
        out, lse = op(q, k, v, scale, bool(causal), left, right, bool(return_lse))
    else:
        _check_arrays(q=q, k=k, v=v)
        out = np.empty(q.shape, dtype=q.dtype)
        lse = np.empty(_lse_shape(q), dtype=np.float32) if return_lse else None
        _tessel.attention_forward(q, k, v, out, lse, scale, bool(causal), left, right)
    return (out, lse) if return_lse else out


def block_sparse_attention(q, k, v, mask: BlockMask, *, causal: bool = False, window=(-1, -1), softmax_scale=None,
                           return_lse: bool = False):
    """Attention over the kv blocks `mask` keeps for each (batch, head, q block); token-level causal
    and window limits still apply inside kept blocks. Rows with no key give 0 and lse -inf."""
    if not isinstance(mask, BlockMask):
        raise TypeError(f"mask: expected a tessel.BlockMask, got {type(mask).__name__}")
    scale = _scale_arg(softmax_scale)
    left, right = _window_args(window)
    geometry = (mask.mask_batch, mask.mask_heads, mask.block_q, mask.block_kv)
    if is_torch_tensor(q):
        from . import torch_ops

        torch_ops.check_forward_only("block_sparse_attention", q, k, v)
        indptr, indices = mask.csr_on(q.device)
        op = torch_ops.run_block_sparse_attention if torch_ops.eager_call(q) else torch_ops.block_sparse_attention
        out, lse = op(q, k, v, indptr, indices, list(geometry), scale, bool(causal), left, right, bool(return_lse))
    else:
        _check_arrays(q=q, k=k, v=v)
        out = np.empty(q.shape, dtype=q.dtype)
        lse = np.empty(_lse_shape(q), dtype=np.float32) if return_lse else None
        _tessel.block_sparse_attention_forward(q, k, v, mask.indptr, mask.indices, *geometry, out, lse, scale,
                                               bool(causal), left, right)
    return (out, lse) if return_lse else out


def merge_states(out_a, lse_a, out_b, lse_b):
    """Combines two partial attention results over disjoint key sets (max-shifted LSE merge).
    Returns (out, lse) with out in out_a's dtype."""
    if is_torch_tensor(out_a):
        from . import torch_ops

        torch_ops.check_forward_only("merge_states", out_a, lse_a, out_b, lse_b)
        op = torch_ops.merge_states_impl if torch_ops.eager_call(out_a) else torch_ops.merge_states
        return op(out_a, lse_a, out_b, lse_b)
    _check_arrays(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    out = np.empty(out_a.shape, dtype=out_a.dtype)
    lse = np.empty(lse_a.shape, dtype=np.float32)
    _tessel.merge_states_forward(out_a, lse_a, out_b, lse_b, out, lse)
    return out, lse
