"""Static sparse patterns on a latent video grid (frames, height, width), planned into a BlockMask.

A block is kept when at least one token pair inside it is kept by the rule, so block-sparse
attention never drops a pair the rule keeps. Text tokens (text_tokens > 0) outside an arrow pattern
attend only to text unless keep_text widens them; arrow makes them global.
"""
from __future__ import annotations

from . import _tessel
from .block_mask import BlockMask

dense = _tessel.dense_pattern


def sliding_window(window: int = 256):
    """1-D window over sequence positions: keep iff |i - j| <= window."""
    return _tessel.sliding_window_pattern(window)


def sliding_window_3d(frame_radius: int = 1, height_radius: int = 4, width_radius: int = 4):
    """Box on the latent grid: keep iff |Δframe|, |Δrow|, |Δcolumn| are within the radii."""
    return _tessel.sliding_window_3d_pattern(frame_radius, height_radius, width_radius)


def radial(decay_factor: float = 1.0, frame0_sink: bool = True):
    """Radial Attention: neighbouring frames dense, a spatial window halving with each doubling of
    frame distance, frame 0 as a sink."""
    return _tessel.radial_pattern(decay_factor, frame0_sink)


def local(local_window_size: int = 6):
    """Each query frame attends to a centred window of local_window_size frames."""
    return _tessel.local_pattern(local_window_size)


def arrow(inner):
    """MMDiT joint attention: text rows and columns dense, image pairs by `inner`."""
    return _tessel.arrow_pattern(inner)


def plan(pattern, grid, *, text_tokens: int = 0, text_first: bool = True, block_q: int = 128, block_kv: int = 64,
         keep_diagonal: bool = False, sink_blocks: int = 0, keep_text: bool = False) -> BlockMask:
    """The block mask of `pattern` over grid = (frames, height, width) plus text_tokens, one mask
    for all heads (mask_batch = mask_heads = 1)."""
    frames, height, width = grid
    return BlockMask(_tessel.plan_static_pattern(pattern, frames, height, width, text_tokens, text_first, block_q,
                                                 block_kv, keep_diagonal, sink_blocks, keep_text))


def plan_radial(grid, *, decay_factor: float = 1.0, frame0_sink: bool = True, **options) -> BlockMask:
    return plan(radial(decay_factor, frame0_sink), grid, **options)


def plan_local(grid, *, local_window_size: int = 6, **options) -> BlockMask:
    return plan(local(local_window_size), grid, **options)


def plan_sliding_window_3d(grid, *, frame_radius: int = 1, height_radius: int = 4, width_radius: int = 4,
                           **options) -> BlockMask:
    return plan(sliding_window_3d(frame_radius, height_radius, width_radius), grid, **options)


def plan_arrow(grid, *, inner, text_tokens: int, **options) -> BlockMask:
    """Text rows and columns dense, image↔image pairs by the pattern `inner` (e.g. radial())."""
    return plan(arrow(inner), grid, text_tokens=text_tokens, **options)
