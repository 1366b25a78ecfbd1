"""tessel.BlockMask: a validated BSR block mask with conversions to and from dense maps, FlashInfer's
BSR arrays and FlexAttention's block tensors (or its BlockMask object)."""
from __future__ import annotations

import sys
import weakref

import numpy as np

from . import _tessel
from ._arrays import dense_keep_map, host_array

# CUDA copies of validated masks, keyed by (indptr, indices) data pointers. The kernels cannot check
# a device mask row by row, so CUDA block-sparse calls accept only masks made by BlockMask.csr_on.
_validated_device_csr: dict = {}


def is_validated_device_csr(indptr, indices) -> bool:
    return _validated_device_csr.get((indptr.data_ptr(), indices.data_ptr())) == (indptr.numel(), indices.numel())


class BlockMask:
    """Query blocks of `block_q` tokens, kv blocks of `block_kv` tokens; per (batch, head, q block) row
    the sorted kept kv-block ids. `mask_batch` is 1 or B, `mask_heads` 1, H_kv or H_q (broadcast).

    Every constructor validates the mask (sorted, unique, in range, consistent indptr) and raises
    tessel.TesselError naming the first bad row.
    """

    def __init__(self, impl: _tessel.BlockMask):
        if not isinstance(impl, _tessel.BlockMask):
            raise TypeError("BlockMask is made by its from_* class methods, got " + type(impl).__name__)
        self._impl = impl
        self._device_csr = {}
        # Plain Python ints, so torch.compile traces calls that read them without a graph break.
        self._geometry = (impl.mask_batch, impl.mask_heads, impl.seq_q, impl.seq_kv, impl.block_q, impl.block_kv)
        if "torch" in sys.modules:  # zero-copy CPU tensors, ready for traced calls
            self._device_csr["cpu"] = self._make_csr(sys.modules["torch"].device("cpu"))

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, dense, *, seq_q: int, seq_kv: int, block_q: int = 128, block_kv: int = 64) -> "BlockMask":
        """From a (mask_batch, mask_heads, q_blocks, kv_blocks) map, nonzero/True = kept."""
        return cls(_tessel.BlockMask.from_dense(dense_keep_map(dense), seq_q, seq_kv, block_q, block_kv))

    @classmethod
    def from_csr(cls, indptr, indices, *, mask_batch: int, mask_heads: int, seq_q: int, seq_kv: int,
                 block_q: int = 128, block_kv: int = 64) -> "BlockMask":
        """From tessel's own layout: indptr (mask_batch·mask_heads·q_blocks + 1), indices (nnz)."""
        return cls(_tessel.BlockMask.from_csr(host_array(indptr, np.int32), host_array(indices, np.int32),
                                              mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv))

    @classmethod
    def from_flashinfer(cls, per_batch_head, *, mask_batch: int, mask_heads: int, seq_q: int, seq_kv: int,
                        block_q: int = 128, block_kv: int = 64) -> "BlockMask":
        """From one FlashInfer BSR (indptr (q_blocks + 1), indices) per (batch, head), row-major."""
        pairs = [(host_array(ip, np.int32), host_array(ix, np.int32)) for ip, ix in per_batch_head]
        return cls(_tessel.BlockMask.from_flashinfer(pairs, mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv))

    @classmethod
    def from_flex(cls, kv_num_blocks, kv_indices, *, seq_q: int, seq_kv: int, block_q: int = 128,
                  block_kv: int = 64) -> "BlockMask":
        """From FlexAttention's kv_num_blocks (B, H, Qb) and kv_indices (B, H, Qb, KVb) tensors."""
        return cls(_tessel.BlockMask.from_flex(host_array(kv_num_blocks, np.int32), host_array(kv_indices, np.int32),
                                               seq_q, seq_kv, block_q, block_kv))

    @classmethod
    def from_flex_attention(cls, block_mask) -> "BlockMask":
        """From a torch.nn.attention.flex_attention.BlockMask: its partial and full blocks together
        (tessel computes kept blocks whole; a mask_mod inside partial blocks is not carried over)."""
        seq_q, seq_kv = block_mask.seq_lengths
        block_q, block_kv = block_mask.BLOCK_SIZE
        kv_blocks = -(-seq_kv // block_kv)
        keep = _flex_dense(block_mask.kv_num_blocks, block_mask.kv_indices, kv_blocks)
        if block_mask.full_kv_num_blocks is not None:
            keep |= _flex_dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, kv_blocks)
        return cls.from_dense(keep, seq_q=seq_q, seq_kv=seq_kv, block_q=block_q, block_kv=block_kv)

    @classmethod
    def full(cls, *, mask_batch: int = 1, mask_heads: int = 1, seq_q: int, seq_kv: int, block_q: int = 128,
             block_kv: int = 64) -> "BlockMask":
        return cls(_tessel.BlockMask.full(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv))

    @classmethod
    def random(cls, *, density: float, seed: int = 0, mask_batch: int = 1, mask_heads: int = 1, seq_q: int,
               seq_kv: int, block_q: int = 128, block_kv: int = 64) -> "BlockMask":
        """round(density · kv_blocks) random blocks per row (at least one), diagonal blocks always kept."""
        return cls(_tessel.BlockMask.random(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv, density, seed))

    # ---- conversions --------------------------------------------------------------------------
    def to_dense(self) -> np.ndarray:
        """(mask_batch, mask_heads, q_blocks, kv_blocks) bool map."""
        return self._impl.to_dense().astype(bool)

    def to_flashinfer(self) -> list:
        """One (indptr, indices) int32 pair per (batch, head), row-major."""
        return self._impl.to_flashinfer()

    def to_flex(self) -> tuple:
        """FlexAttention's (kv_num_blocks (B, H, Qb), kv_indices (B, H, Qb, KVb)) int32 arrays."""
        return self._impl.to_flex()

    def to_flex_attention(self, device="cpu"):
        """A torch FlexAttention BlockMask keeping the same blocks (every token pair inside them)."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask as FlexBlockMask

        kv_num_blocks, kv_indices = (torch.from_numpy(a).to(device) for a in self.to_flex())
        return FlexBlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=(self.block_q, self.block_kv),
                                            seq_lengths=(self.seq_q, self.seq_kv))

    def csr_on(self, device):
        """(indptr, indices) as int32 torch tensors on `device`, made once and cached. Under
        torch.compile or CUDA-graph capture only cached copies can be used: call csr_on(device)
        for a CUDA device before compiling or capturing (CPU copies exist from the start)."""
        import torch

        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        cached = self._device_csr.get(str(device))
        if cached is None:
            cached = self._device_csr[str(device)] = self._make_csr(device)
        return cached

    def _make_csr(self, device):
        import torch

        indptr = torch.from_numpy(self._impl.indptr).to(device)
        indices = torch.from_numpy(self._impl.indices).to(device)
        if device.type != "cpu":
            entry = (indptr.data_ptr(), indices.data_ptr())
            _validated_device_csr[entry] = (indptr.numel(), indices.numel())
            weakref.finalize(indptr, _validated_device_csr.pop, entry, None)
        return indptr, indices

    # ---- properties ---------------------------------------------------------------------------
    indptr = property(lambda self: self._impl.indptr, doc="int32 (mask_batch·mask_heads·q_blocks + 1)")
    indices = property(lambda self: self._impl.indices, doc="int32 (nnz), kept kv-block ids row after row")
    mask_batch = property(lambda self: self._geometry[0])
    mask_heads = property(lambda self: self._geometry[1])
    seq_q = property(lambda self: self._geometry[2])
    seq_kv = property(lambda self: self._geometry[3])
    block_q = property(lambda self: self._geometry[4])
    block_kv = property(lambda self: self._geometry[5])
    q_blocks = property(lambda self: -(-self.seq_q // self.block_q))
    kv_blocks = property(lambda self: -(-self.seq_kv // self.block_kv))
    nnz = property(lambda self: self._impl.nnz)

    def density(self) -> float:
        """Kept blocks / all blocks."""
        return self._impl.density()

    def token_density(self) -> float:
        """Kept (query, key) pairs / all pairs, partial last blocks weighted by their size."""
        return self._impl.token_density()

    def __eq__(self, other) -> bool:
        if not isinstance(other, BlockMask):
            return NotImplemented
        return (self.geometry() == other.geometry() and np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.indices, other.indices))

    __hash__ = None

    def geometry(self) -> tuple:
        """(mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv)."""
        return self._geometry

    def __repr__(self) -> str:
        return (f"BlockMask(mask_batch={self.mask_batch}, mask_heads={self.mask_heads}, seq_q={self.seq_q}, "
                f"seq_kv={self.seq_kv}, block_q={self.block_q}, block_kv={self.block_kv}, "
                f"density={self.density():.4f})")


def _flex_dense(num_blocks, indices, kv_blocks: int) -> np.ndarray:
    """Dense keep map of one FlexAttention (num_blocks, indices) pair; indices may be padded wider."""
    num = host_array(num_blocks, np.int64)
    idx = host_array(indices, np.int64)
    if num.ndim != 3 or idx.ndim != 4 or idx.shape[:3] != num.shape:
        raise ValueError(f"flex block tensors: expected num_blocks (B, H, Qb) and indices (B, H, Qb, N), "
                         f"got {num.shape} and {idx.shape}")
    keep = np.zeros(num.shape + (kv_blocks,), dtype=bool)
    slot = np.arange(idx.shape[3])
    used = slot[None, None, None, :] < num[..., None]
    if np.any(idx[used] < 0) or np.any(idx[used] >= kv_blocks):
        raise ValueError(f"flex block indices: expected values in [0, {kv_blocks}) in the used slots")
    b, h, r, s = np.nonzero(used)
    keep[b, h, r, idx[b, h, r, s]] = True
    return keep
