"""tessel's kernels as torch.library custom ops (namespace `tessel`), with fake implementations so
torch.compile(fullgraph=True) traces them without graph breaks. Imported by tessel when torch is
installed. Forward only: no autograd formula is registered.

Tensors reach the extension as DLPack capsules of torch.utils.dlpack.to_dlpack, which shares memory
and synchronizes nothing.
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


def _stream_of(x: torch.Tensor) -> int:
    # CUDA work goes on torch's current stream of the tensor's device (captured by CUDA graphs).
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0


def _lse_arg(lse: torch.Tensor, return_lse: bool):
    return to_dlpack(lse) if return_lse and lse.numel() > 0 else None


@torch.library.custom_op("tessel::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, window_left: int,
              window_right: int, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(q.shape)
    lse = _lse_or_placeholder(q, return_lse)
    _tessel.attention_forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), _lse_arg(lse, return_lse),
                              scale, causal, window_left, window_right, _stream_of(q))
    return out, lse


@attention.register_fake
def _(q, k, v, scale, causal, window_left, window_right, return_lse):
    return q.new_empty(q.shape), _lse_or_placeholder(q, return_lse)


@torch.library.custom_op("tessel::block_sparse_attention", mutates_args=())
def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_indptr: torch.Tensor,
                           mask_indices: torch.Tensor, mask_geometry: list[int], scale: float, causal: bool,
                           window_left: int, window_right: int,
                           return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if len(mask_geometry) != 4:
        raise ValueError(f"mask_geometry: expected [mask_batch, mask_heads, block_q, block_kv], got {mask_geometry}")
    if mask_indptr.device.type != "cpu" and not is_validated_device_csr(mask_indptr, mask_indices):
        raise ValueError("mask_indptr, mask_indices: expected the device arrays of a tessel.BlockMask "
                         "(BlockMask.csr_on), got other tensors (a device mask cannot be checked row by row)")
    out = q.new_empty(q.shape)
    lse = _lse_or_placeholder(q, return_lse)
    _tessel.block_sparse_attention_forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(mask_indptr),
                                           to_dlpack(mask_indices), *mask_geometry, to_dlpack(out),
                                           _lse_arg(lse, return_lse), scale, causal, window_left, window_right,
                                           _stream_of(q))
    return out, lse


@block_sparse_attention.register_fake
def _(q, k, v, mask_indptr, mask_indices, mask_geometry, scale, causal, window_left, window_right, return_lse):
    return q.new_empty(q.shape), _lse_or_placeholder(q, return_lse)


@torch.library.custom_op("tessel::merge_states", mutates_args=())
def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                 lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = out_a.new_empty(out_a.shape)
    lse = lse_a.new_empty(lse_a.shape, dtype=torch.float32)
    _tessel.merge_states_forward(to_dlpack(out_a), to_dlpack(lse_a), to_dlpack(out_b), to_dlpack(lse_b),
                                 to_dlpack(out), to_dlpack(lse), _stream_of(out_a))
    return out, lse


@merge_states.register_fake
def _(out_a, lse_a, out_b, lse_b):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
