"""Attention masks tessel's integrations can honour: key padding (the same kept keys for every query
of a batch entry), read from the forms diffusers and vLLM-Omni send."""
from __future__ import annotations

import torch


def key_padding(mask: torch.Tensor, batch: int, seq_q: int, seq_kv: int):
    """A (batch, seq_kv) boolean of kept keys when `mask` is a key-padding mask; None when it keeps
    every key. Raises ValueError for masks that differ between queries or carry biases."""
    if mask.dtype == torch.bool:
        keep = mask
    else:
        finite = torch.isfinite(mask)
        if bool((mask[finite] != 0).any()) or bool((mask[~finite] > 0).any()):
            raise ValueError("tessel: attn_mask with bias values (an additive float mask other than 0 / -inf) is not "
                             "supported by tessel")
        keep = finite
    if keep.dim() == 2:  # (B or 1, S_kv)
        keep = keep[:, None, None, :]
    elif keep.dim() == 3:  # (B, S_q, S_kv)
        keep = keep[:, None]
    if keep.dim() != 4:
        raise ValueError(f"tessel: attn_mask of shape {tuple(mask.shape)}: expected 2 to 4 dimensions")
    keep = keep.expand(batch, keep.shape[1], seq_q, seq_kv)
    rows = keep[:, :1, :1, :]
    if not bool((keep == rows).all()):
        raise ValueError(f"tessel: attn_mask of shape {tuple(mask.shape)} differs between queries or heads; only "
                         "key-padding masks are supported")
    rows = rows[:, 0, 0, :]
    return None if bool(rows.all()) else rows


def attend_kept_keys(attend, q, k, v, keep):
    """Runs attend(q, k, v) per batch entry on its kept keys: q, k, v (B, S, H, D), keep (B, S_kv) bool."""
    return torch.cat([attend(q[b:b + 1], k[b:b + 1, keep[b]], v[b:b + 1, keep[b]]) for b in range(q.shape[0])])


def kept_prefix(keep_row) -> int | None:
    """How many keys a (S_kv,) keep row keeps when they are its first ones (padding at the end, as
    sequence-parallel auto-padding appends it); None when padding sits elsewhere."""
    kept = int(keep_row.sum())
    return kept if bool(keep_row[:kept].all()) else None
