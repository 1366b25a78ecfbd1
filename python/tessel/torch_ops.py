"""tessel's kernels as torch.library custom ops (namespace `tessel`), with fake implementations so
torch.compile(fullgraph=True) traces them without graph breaks. Imported by tessel when torch is
installed. Forward only: no autograd formula is registered.

Tensors reach the extension as DLPack capsules of torch.utils.dlpack.to_dlpack, which shares memory
and synchronizes nothing. `eager_call(q)` tells tessel.functional when it may call the
implementations below directly instead of through the dispatcher (plain tensors outside tracing):
the same work without the custom-op machinery's per-call cost.
"""
from __future__ import annotations

import torch
from torch.utils.dlpack import to_dlpack

from . import _tessel
from .block_mask import is_validated_device_csr


def _lse_or_placeholder(q: torch.Tensor, return_lse: bool) -> torch.Tensor:
    if return_lse and q.dim() == 4:
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return q.new_empty((0,), dtype=torch.float32)


# torch's current CUDA stream of a device as a raw handle. The private accessor returns the integer
# directly; torch.cuda.current_stream builds a Stream object first, several microseconds per call.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(x: torch.Tensor) -> int:
    # CUDA work goes on torch's current stream of the tensor's device (captured by CUDA graphs).
    if not x.is_cuda:
        return 0
    if _current_raw_stream is not None:
        return _current_raw_stream(x.get_device())
    return torch.cuda.current_stream(x.device).cuda_stream


def check_forward_only(name: str, *tensors) -> None:
    """tessel registers no autograd formula: refuse inputs that would need one, rather than return
    outputs that silently carry no gradient."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(f"tessel.{name} is forward only (no autograd formula): call it under torch.no_grad() or "
                           "torch.inference_mode(), or pass detached tensors")


_is_compiling = torch.compiler.is_compiling


def eager_call(q) -> bool:
    return type(q) is torch.Tensor and not q.is_meta and not _is_compiling()


def run_attention(q, k, v, scale: float, causal: bool, window_left: int, window_right: int, return_lse: bool):
    """The work of tessel::attention; lse is None unless asked for (eager callers skip the op)."""
    out = q.new_empty(q.shape)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_lse and q.dim() == 4 else None
    _tessel.attention_forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out),
                              None if lse is None else to_dlpack(lse), scale, causal, window_left, window_right,
                              _stream_of(q))
    return out, lse


def attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, window_left: int,
                   window_right: int, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = run_attention(q, k, v, scale, causal, window_left, window_right, return_lse)
    return out, lse if lse is not None else _lse_or_placeholder(q, False)


attention = torch.library.custom_op("tessel::attention", attention_impl, mutates_args=())


@attention.register_fake
def _(q, k, v, scale, causal, window_left, window_right, return_lse):
    return q.new_empty(q.shape), _lse_or_placeholder(q, return_lse)


def run_block_sparse_attention(q, k, v, mask_indptr, mask_indices, mask_geometry, scale: float, causal: bool,
                               window_left: int, window_right: int, return_lse: bool):
    """The work of tessel::block_sparse_attention; lse is None unless asked for."""
    if len(mask_geometry) != 4:
        raise ValueError(f"mask_geometry: expected [mask_batch, mask_heads, block_q, block_kv], got {mask_geometry}")
    if mask_indptr.device.type != "cpu" and not is_validated_device_csr(mask_indptr, mask_indices):
        raise ValueError("mask_indptr, mask_indices: expected the device arrays of a tessel.BlockMask "
                         "(BlockMask.csr_on), got other tensors (a device mask cannot be checked row by row)")
    out = q.new_empty(q.shape)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_lse and q.dim() == 4 else None
    _tessel.block_sparse_attention_forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(mask_indptr),
                                           to_dlpack(mask_indices), *mask_geometry, to_dlpack(out),
                                           None if lse is None else to_dlpack(lse), scale, causal, window_left,
                                           window_right, _stream_of(q))
    return out, lse


def block_sparse_attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_indptr: torch.Tensor,
                                mask_indices: torch.Tensor, mask_geometry: list[int], scale: float, causal: bool,
                                window_left: int, window_right: int,
                                return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = run_block_sparse_attention(q, k, v, mask_indptr, mask_indices, mask_geometry, scale, causal,
                                          window_left, window_right, return_lse)
    return out, lse if lse is not None else _lse_or_placeholder(q, False)


block_sparse_attention = torch.library.custom_op("tessel::block_sparse_attention", block_sparse_attention_impl,
                                                 mutates_args=())


@block_sparse_attention.register_fake
def _(q, k, v, mask_indptr, mask_indices, mask_geometry, scale, causal, window_left, window_right, return_lse):
    return q.new_empty(q.shape), _lse_or_placeholder(q, return_lse)


def merge_states_impl(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                      lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = out_a.new_empty(out_a.shape)
    lse = lse_a.new_empty(lse_a.shape, dtype=torch.float32)
    _tessel.merge_states_forward(to_dlpack(out_a), to_dlpack(lse_a), to_dlpack(out_b), to_dlpack(lse_b),
                                 to_dlpack(out), to_dlpack(lse), _stream_of(out_a))
    return out, lse


merge_states = torch.library.custom_op("tessel::merge_states", merge_states_impl, mutates_args=())


@merge_states.register_fake
def _(out_a, lse_a, out_b, lse_b):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
