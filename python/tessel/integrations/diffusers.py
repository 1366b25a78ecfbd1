"""diffusers integration: tessel attention in any diffusers transformer (Wan's self-attention with
every pattern; Flux, SD3, HunyuanVideo, Qwen-Image, CogVideoX, LTX and the rest through a scoped
dispatch hook: diffusers_dispatch).

    from tessel.integrations import diffusers as tessel_diffusers
    tessel_diffusers.enable(pipe, {"pattern": {"type": "radial"}, "warmup": {"dense_steps": 10}})
    video = pipe(...)
    tessel_diffusers.disable(pipe)

`enable` installs a TesselWanAttnProcessor on every self-attention (`attn1`) of a
WanTransformer3DModel (Wan 2.1 / 2.2; given the pipeline, both transformers of Wan 2.2), leaves
cross-attention dense (the original processor runs it), reads the latent grid from each
transformer forward, and follows the denoising step through the pipeline's scheduler
(`set_timesteps` resets it, each `step` advances it). Given a transformer alone, the step stays
where `set_step` puts it. `disable` restores the original processors and the scheduler.

The config is tessel.SparseAttentionConfig, the C++ SparseAttnConfig schema (a dict of its nested or
flat keys works too): pattern.type is dense, dynamic_topk, threshold (the library's estimators),
radial, local or sliding_window (static patterns on the latent grid); warmup.dense_steps and
warmup.dense_layers keep the first steps and layers dense; selection.keep_diagonal and sink_blocks
widen the static masks; geometry.block_q / block_kv set the blocks.
"""
from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import WanTransformer3DModel, _get_qkv_projections

from . import diffusers_dispatch
from ..sparse_attention import SparseAttentionRunner
from ..sparse_config import SparseAttentionConfig

_STATE_ATTRIBUTE = "_tessel_sparse_attention"


def _apply_rotary_emb(hidden_states: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    # Wan's rotary embedding on interleaved (even, odd) channel pairs, as WanAttnProcessor applies it.
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


class TesselWanAttnProcessor:
    """Self-attention of one Wan block through tessel; anything else (cross-attention, an image
    branch, an attention mask) goes to the processor it replaced."""

    def __init__(self, original, runner: SparseAttentionRunner, layer: int):
        self.original = original
        self.runner = runner
        self.layer = layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or attention_mask is not None or attn.add_k_proj is not None:
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query = _apply_rotary_emb(query, *rotary_emb)
            key = _apply_rotary_emb(key, *rotary_emb)
        hidden_states = self.runner(query, key, value, self.layer).flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)


class _TransformerState:
    def __init__(self, transformer, runner: SparseAttentionRunner):
        self.runner = runner
        self.processors = []
        for layer, block in enumerate(transformer.blocks):
            original = block.attn1.processor
            self.processors.append((block.attn1, original))
            block.attn1.set_processor(TesselWanAttnProcessor(original, runner, layer))
        patch = transformer.config.patch_size
        self.hook = transformer.register_forward_pre_hook(self._read_grid(patch), with_kwargs=True)

    def _read_grid(self, patch):
        def hook(module, args, kwargs):
            latents = args[0] if args else kwargs["hidden_states"]
            _, _, frames, height, width = latents.shape
            self.runner.grid = (frames // patch[0], height // patch[1], width // patch[2])

        return hook

    def restore(self):
        self.hook.remove()
        for attn, original in self.processors:
            attn.set_processor(original)


class _SchedulerTracker:
    """Counts scheduler.step calls (one per denoising step, whatever the CFG batch)."""

    def __init__(self, scheduler, runners):
        self.scheduler = scheduler
        self.runners = runners
        original_step, original_set_timesteps = scheduler.step, scheduler.set_timesteps

        def set_timesteps(*args, **kwargs):
            self._set_step(0)
            return original_set_timesteps(*args, **kwargs)

        def step(*args, **kwargs):
            result = original_step(*args, **kwargs)
            self._set_step(self.runners[0].step + 1)
            return result

        scheduler.step, scheduler.set_timesteps = step, set_timesteps

    def _set_step(self, step: int):
        for runner in self.runners:
            runner.step = step

    def restore(self):
        del self.scheduler.step, self.scheduler.set_timesteps  # the instance wrappers; class methods remain


def _transformers_of(pipe_or_transformer):
    if isinstance(pipe_or_transformer, torch.nn.Module):
        return [pipe_or_transformer], None
    found = [getattr(pipe_or_transformer, name, None) for name in ("transformer", "transformer_2")]
    found = [t for t in found if isinstance(t, torch.nn.Module)]
    if not found:
        raise TypeError("pipe_or_transformer: expected a diffusers transformer (torch.nn.Module) or a pipeline holding "
                        f"one as .transformer, got {type(pipe_or_transformer).__name__}")
    return found, getattr(pipe_or_transformer, "scheduler", None)


class _DispatchState:
    """A non-Wan transformer under the scoped dispatch hook (diffusers_dispatch)."""

    def __init__(self, transformer, config):
        self.model = diffusers_dispatch.enable_model(transformer, config)
        self.runner = self.model  # the scheduler tracker advances .step

    def restore(self):
        diffusers_dispatch.disable_model(self.model)


def enable(pipe_or_transformer, config=None):
    """Installs tessel attention (see the module doc). `config`: SparseAttentionConfig, a dict of the C++
    keys, JSON text, or None (dense). Calling it again replaces the previous installation. Wan
    transformers get tessel's Wan processor; any other diffusers transformer goes through the scoped
    dispatch hook (diffusers_dispatch: every pattern where the model's token layout is known, dense
    on any model)."""
    disable(pipe_or_transformer)
    config = SparseAttentionConfig.from_any(config)
    transformers, scheduler = _transformers_of(pipe_or_transformer)
    states = []
    try:
        for transformer in transformers:
            if isinstance(transformer, WanTransformer3DModel):
                states.append(_TransformerState(transformer, SparseAttentionRunner(config)))
            else:
                states.append(_DispatchState(transformer, config))
    except BaseException:
        for state in states:
            state.restore()
        raise
    runners = [state.runner for state in states]
    tracker = _SchedulerTracker(scheduler, runners) if scheduler is not None else None
    setattr(pipe_or_transformer, _STATE_ATTRIBUTE, (states, tracker))
    return pipe_or_transformer


def disable(pipe_or_transformer):
    """Restores the original processors (and scheduler); a no-op when tessel is not installed."""
    installed = getattr(pipe_or_transformer, _STATE_ATTRIBUTE, None)
    if installed is None:
        return pipe_or_transformer
    states, tracker = installed
    for state in states:
        state.restore()
    if tracker is not None:
        tracker.restore()
    delattr(pipe_or_transformer, _STATE_ATTRIBUTE)
    return pipe_or_transformer


def set_step(pipe_or_transformer, step: int):
    """Sets the denoising step seen by tessel (for a transformer driven without a pipeline)."""
    states, _ = getattr(pipe_or_transformer, _STATE_ATTRIBUTE)
    for state in states:
        state.runner.step = step


enable_sparse_attention = enable
