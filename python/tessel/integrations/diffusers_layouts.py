"""Where each known diffusers DiT puts its tokens, read from the transformer's forward arguments:
the text's place in its self-shaped attention calls, and the latent grid (frames, height, width) of
its image tokens after patchifying (raster order, the order of tessel's static patterns).

The text's place: "text_first" / "text_last" (joint text+image attention: the processor
concatenates the text and image tokens), or "image_only" (the text reaches the image through
cross-attention). The grid: from the latents' shape and the config's patch sizes, from the
position ids (Flux), or from the arguments that carry it (Qwen-Image's img_shapes, LTX's
num_frames / height / width); None when this forward's image tokens are not one raster grid
(reference images appended, ids out of raster order), so static patterns are refused for it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch

Grid = Optional[tuple]


@dataclass(frozen=True)
class ModelLayout:
    text: str  # "text_first", "text_last" or "image_only"
    grid: Callable[[object, dict], Grid]  # (transformer, the forward's arguments by name) -> grid or None


def _pair(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _grid_5d(frames_axis: int) -> Callable[[object, dict], Grid]:
    """Latents (B, C, F, H, W) (frames_axis 2) or (B, F, C, H, W) (frames_axis 1), patched by the
    config's patch_size (an int, or Wan's (p_t, p_h, p_w)) and patch_size_t."""

    def grid(transformer, arguments) -> Grid:
        latents = arguments.get("hidden_states")
        if not isinstance(latents, torch.Tensor) or latents.dim() != 5:
            return None
        config = transformer.config
        if isinstance(config.patch_size, (tuple, list)):
            p_t, p_h, p_w = config.patch_size
        else:
            p_t, (p_h, p_w) = getattr(config, "patch_size_t", None) or 1, _pair(config.patch_size)
        frames, height, width = latents.shape[frames_axis], latents.shape[-2], latents.shape[-1]
        return frames // p_t, height // p_h, width // p_w

    return grid


def _grid_image(transformer, arguments) -> Grid:
    """Latents (B, C, H, W) patched by patch_size (SD3)."""
    latents = arguments.get("hidden_states")
    if not isinstance(latents, torch.Tensor) or latents.dim() != 4:
        return None
    p_h, p_w = _pair(transformer.config.patch_size)
    return 1, latents.shape[-2] // p_h, latents.shape[-1] // p_w


def _grid_from_ids(transformer, arguments) -> Grid:
    """Flux's packed tokens: img_ids (S, A) or (B, S, A), axis 0 the image index (one image: all
    equal), axes 1 and 2 its row and column, in raster order."""
    ids = arguments.get("img_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() not in (2, 3) or ids.shape[-1] < 3:
        return None
    ids = (ids[0] if ids.dim() == 3 else ids).to(torch.int64)
    rows, columns = ids[:, 1] - ids[:, 1].min(), ids[:, 2] - ids[:, 2].min()
    height, width = int(rows.max()) + 1, int(columns.max()) + 1
    order = torch.arange(ids.shape[0], device=ids.device)
    if (height * width != ids.shape[0] or bool((ids[:, 0] != ids[0, 0]).any()) or bool((rows != order // width).any())
            or bool((columns != order % width).any())):
        return None
    return 1, height, width


def _grid_from_img_shapes(transformer, arguments) -> Grid:
    """Qwen-Image: img_shapes, per batch entry a (F, H, W) of tokens or a list of them (one image:
    the grid; with reference images: no grid)."""
    shapes = arguments.get("img_shapes")
    if not shapes:
        return None
    entry = shapes[0]
    if isinstance(entry, list):
        if len(entry) != 1:
            return None
        entry = entry[0]
    return tuple(int(x) for x in entry) if len(entry) == 3 else None


def _grid_from_sizes(transformer, arguments) -> Grid:
    """LTX-Video: packed tokens with the latent num_frames / height / width given beside them."""
    sizes = [arguments.get(name) for name in ("num_frames", "height", "width")]
    if any(not isinstance(size, int) for size in sizes):
        return None
    config = transformer.config
    p_t, (p_h, p_w) = config.patch_size_t, _pair(config.patch_size)
    return sizes[0] // p_t, sizes[1] // p_h, sizes[2] // p_w


MODEL_LAYOUTS = {
    "FluxTransformer2DModel": ModelLayout("text_first", _grid_from_ids),
    "Flux2Transformer2DModel": ModelLayout("text_first", _grid_from_ids),
    "QwenImageTransformer2DModel": ModelLayout("text_first", _grid_from_img_shapes),
    "CogVideoXTransformer3DModel": ModelLayout("text_first", _grid_5d(frames_axis=1)),
    "SD3Transformer2DModel": ModelLayout("text_last", _grid_image),
    "HunyuanVideoTransformer3DModel": ModelLayout("text_last", _grid_5d(frames_axis=2)),
    "LTXVideoTransformer3DModel": ModelLayout("image_only", _grid_from_sizes),
    "WanTransformer3DModel": ModelLayout("image_only", _grid_5d(frames_axis=2)),
    "WanVACETransformer3DModel": ModelLayout("image_only", _grid_5d(frames_axis=2)),
}


def forward_arguments(transformer, args: tuple, kwargs: dict) -> dict:
    """The forward's arguments by name, however the caller passed them."""
    return dict(inspect.signature(transformer.forward).bind_partial(*args, **kwargs).arguments)


__all__ = ["MODEL_LAYOUTS", "ModelLayout", "forward_arguments"]
