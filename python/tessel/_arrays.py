"""How tessel's Python layer tells torch tensors from other arrays, and moves host arrays in."""
from __future__ import annotations

import sys

import numpy as np


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch when the caller never did."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def host_array(x, dtype) -> np.ndarray:
    """A C-contiguous numpy copy (or view) of `x` with element type `dtype`, from numpy, torch or lists."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def dense_keep_map(x) -> np.ndarray:
    """A (B_m, H_m, Qb, KVb) map as uint8 (1 = kept) from a bool or numeric array."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x) != 0, dtype=np.uint8)
