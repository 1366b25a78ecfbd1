"""Any diffusers DiT: tessel attention through a scoped hook on torch's scaled_dot_product_attention.

diffusers' attention backends are a closed enum (`set_attention_backend` refuses other names), its
newer processors call `dispatch_attention_fn`, whose native backend calls
`torch.nn.functional.scaled_dot_product_attention`, and older ones (CogVideoX's, SD3's joint
processor) call that function directly. So the one point every processor reaches is that function.
`enable` wraps each attention module's processor (the public `processor` / `set_processor`) in a
scope: while an enabled model's processor runs, the hooked function sends its attention to tessel;
outside a scope (other models, other code) it is torch's own, untouched. The hook is installed while
at least one model is enabled and removed with the last.

What runs where:
- every call is tessel attention (dense, with the call's scale and causal flag) unless the config
  makes the layer sparse at this step;
- sparse only in self-shaped calls (as many keys as queries) of models whose token layout is known
  (diffusers_layouts.MODEL_LAYOUTS): dynamic_topk / threshold estimate the mask from q and k;
  radial, local and sliding_window are planned once per latent grid, which each forward's
  arguments give (the latents' shape over the model's patch sizes, Flux's position ids,
  Qwen-Image's img_shapes, LTX's sizes). In joint text+image attention (Flux, SD3, HunyuanVideo,
  Qwen-Image, CogVideoX) the text rows and columns stay dense and image x image is sparse (the
  MMDiT arrow, exactly: two attentions merged by their LSE, the pattern on the image tokens alone);
  cross-attention stays dense;
- key-padding masks (boolean, or additive 0 / -inf, the same for every query: what HunyuanVideo and
  sequence-parallel padding send) are honoured by attending to each batch entry's kept keys; in
  joint attention padded text keys leave the image x image part sparse. Other masks, dropout in
  training, another attention backend set on the model, and diffusers' own context parallelism
  are refused with an error naming them.
"""
from __future__ import annotations

import contextvars
import inspect
import math

import torch

from ._masks import attend_kept_keys, key_padding
from .diffusers_layouts import MODEL_LAYOUTS, forward_arguments
from ..functional import attention, merge_states
from ..sparse_attention import SUPPORTED_PATTERNS, SparseAttentionRunner
from ..sparse_config import SparseAttentionConfig

# Where each known model puts its text tokens in its self-shaped attention calls (the latent grid
# beside it: diffusers_layouts). Models not listed run dense only (their layout is not known).
TOKEN_LAYOUTS = {name: layout.text for name, layout in MODEL_LAYOUTS.items()}

_scope = contextvars.ContextVar("tessel_diffusers_scope", default=None)
_torch_sdpa = None  # torch's function while the hook is installed
_enabled_models = 0


def _hooked_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    scope = _scope.get()
    if scope is None:
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    return scope.model.attend(scope.layer, query, key, value, attn_mask, dropout_p, is_causal, scale)


def _install_hook():
    global _torch_sdpa, _enabled_models
    if _enabled_models == 0:
        _torch_sdpa = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = _hooked_sdpa
    _enabled_models += 1


def _remove_hook():
    global _torch_sdpa, _enabled_models
    _enabled_models -= 1
    if _enabled_models == 0:
        torch.nn.functional.scaled_dot_product_attention = _torch_sdpa
        _torch_sdpa = None


class _Scope:
    def __init__(self, model: "_ModelState", layer: int):
        self.model = model
        self.layer = layer


class ScopedAttnProcessor:
    """Runs the processor it wraps with this model's attention calls going to tessel. Made per
    processor class by _scoped (its __call__ keeps the original's signature: diffusers passes a
    processor only the keyword arguments its signature names)."""

    def __init__(self, original, model: "_ModelState", layer: int):
        self.original = original
        self.model = model
        self.layer = layer

    def __getattr__(self, name):  # attributes diffusers reads from processors (_attention_backend, ...)
        original = self.__dict__.get("original")
        if original is None:
            raise AttributeError(name)
        return getattr(original, name)

    def _run(self, *args, **kwargs):
        calls = self.model.calls
        token = _scope.set(_Scope(self.model, self.layer))
        try:
            result = self.original(*args, **kwargs)
        finally:
            _scope.reset(token)
        if self.model.calls == calls:
            raise RuntimeError(f"tessel: the attention of {type(self.original).__name__} did not reach torch's "
                               "scaled_dot_product_attention (the model uses another attention backend): call "
                               "model.reset_attention_backend() or set_attention_backend('native') before enable")
        return result


def _scoped(original, model: "_ModelState", layer: int) -> ScopedAttnProcessor:
    base = type(original)
    scoped = _scoped_classes.get(base)
    if scoped is None:
        def __call__(self, *args, **kwargs):
            return self._run(*args, **kwargs)

        __call__.__signature__ = inspect.signature(base.__call__)
        scoped = type(f"TesselScoped{base.__name__}", (ScopedAttnProcessor,), {"__call__": __call__})
        _scoped_classes[base] = scoped
    return scoped(original, model, layer)


_scoped_classes = {}


class _ModelState:
    """One enabled transformer: its config, step, text-token count and latent grid of the current
    forward, and the wrapped processors."""

    def __init__(self, transformer, config: SparseAttentionConfig):
        self.config = config
        self.step = 0
        self.calls = 0
        self.torch_calls = 0  # calls left to torch's attention (text-only masked self-attention)
        self.text_tokens = 0
        self.model_layout = MODEL_LAYOUTS.get(type(transformer).__name__)
        self.layout = self.model_layout.text if self.model_layout is not None else None
        self.last_density = None  # of the latest sparse call
        self.runner = SparseAttentionRunner(config)  # the image x image part: its grid, masks and modules
        modules = [m for m in transformer.modules() if _is_attention(m)]
        if not modules:
            raise TypeError(f"pipe_or_transformer: {type(transformer).__name__} has no diffusers attention modules")
        # Checked before anything changes: a refused model is left as it was.
        if any(getattr(m.processor, "_parallel_config", None) is not None for m in modules):
            raise ValueError("tessel: the model runs diffusers' own context parallelism (enable_parallelism); "
                             "tessel's sequence parallelism is separate")
        self.processors = [(m, m.processor) for m in modules]
        for layer, (module, original) in enumerate(self.processors):
            module.set_processor(_scoped(original, self, layer))
        self.hook = transformer.register_forward_pre_hook(self._read_forward, with_kwargs=True)

    def _read_forward(self, module, args, kwargs):
        arguments = forward_arguments(module, args, kwargs)
        text = arguments.get("encoder_hidden_states")
        self.text_tokens = text.shape[1] if isinstance(text, torch.Tensor) and text.dim() == 3 else 0
        self.runner.grid = self.model_layout.grid(module, arguments) if self.model_layout is not None else None

    def restore(self):
        self.hook.remove()
        for module, original in self.processors:
            module.set_processor(original)

    # ---- the attention call -------------------------------------------------------------------
    def attend(self, layer, query, key, value, attn_mask, dropout_p, is_causal, scale):
        self.calls += 1
        if dropout_p and torch.is_grad_enabled():
            raise ValueError(f"tessel: attention dropout {dropout_p} in training is not supported (tessel is forward only)")
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, S, D) -> (B, S, H, D) views
        try:
            keep = None if attn_mask is None else key_padding(attn_mask, q.shape[0], q.shape[1], k.shape[1])
        except ValueError:
            # A mask per query over text tokens alone (HunyuanVideo's token refiner): a few hundred
            # tokens where tessel adds nothing, so torch's own attention runs it, as without tessel.
            if q.shape[1] != k.shape[1] or q.shape[1] > self.text_tokens:
                raise
            self.torch_calls += 1
            return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                               scale=scale)
        if keep is None:
            out = self._attention(layer, q, k, v, is_causal, scale)
        elif self._sparse_here(layer, q, k, is_causal, scale) and self._pads_text_only(keep, q.shape[1]):
            # Joint attention with padded text (HunyuanVideo's prompts): the image x image part
            # stays sparse, each batch entry leaving out its padded text keys.
            text_part = self._parts(q.shape[1])[0]
            out = torch.cat([self._attention(layer, q[b:b + 1], k[b:b + 1], v[b:b + 1], is_causal, scale,
                                             text_keep=keep[b, text_part]) for b in range(q.shape[0])])
        else:  # each batch entry attends to its kept keys, densely
            out = attend_kept_keys(lambda q, k, v: self._attention(layer, q, k, v, is_causal, scale), q, k, v, keep)
        return out.transpose(1, 2)

    def _joint_text(self) -> int:
        return self.text_tokens if self.layout in ("text_first", "text_last") else 0

    def _parts(self, seq: int) -> tuple:
        """(text, image) slices of a joint sequence of `seq` tokens."""
        text = self._joint_text()
        if self.layout == "text_first":
            return slice(0, text), slice(text, seq)
        return slice(seq - text, seq), slice(0, seq - text)

    def _pads_text_only(self, keep, seq: int) -> bool:
        return self._joint_text() > 0 and bool(keep[:, self._parts(seq)[1]].all())

    def _sparse_here(self, layer, q, k, causal, scale) -> bool:
        """Whether this call runs the config's sparse pattern: a self-shaped call (as many keys as
        queries) with the default scale, not causal, past the warm-up, with image tokens."""
        default_scale = scale is None or math.isclose(scale, q.shape[-1] ** -0.5, rel_tol=1e-6)
        return (self.config.pattern.type != "dense" and not causal and default_scale and k.shape[1] == q.shape[1]
                and self._joint_text() < q.shape[1] and not self.config.is_dense_at(self.step, layer))

    def _image_attention(self, q, k, v, return_lse=False):
        # The library's runner: a static mask planned on this forward's grid, or a dynamic one
        # estimated from q and k (on the device for CUDA tensors).
        out = self.runner.sparse(q.contiguous(), k.contiguous(), v.contiguous(), return_lse=return_lse)
        self.last_density = (self.runner.last_report or {}).get("density")
        return out

    def _attention(self, layer, q, k, v, causal, scale, text_keep=None):
        """q, k, v (B, S, H, D); text_keep (S_text,) bool: the text keys kept (None: all)."""
        if not self._sparse_here(layer, q, k, causal, scale):
            return attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, softmax_scale=scale)
        if self._joint_text() == 0:
            return self._image_attention(q, k, v)
        # Joint attention, the MMDiT arrow, exactly: text queries attend to every (kept) key; image
        # queries to the text keys densely and to the image keys by the pattern (on the image tokens
        # alone), the two merged by their LSE.
        text_part, image_part = self._parts(q.shape[1])
        q_text, q_image = q[:, text_part].contiguous(), q[:, image_part].contiguous()
        k_text, k_image = k[:, text_part], k[:, image_part].contiguous()
        v_text, v_image = v[:, text_part], v[:, image_part].contiguous()
        if text_keep is None:
            k_all, v_all = k.contiguous(), v.contiguous()
        else:
            k_text, v_text = k_text[:, text_keep], v_text[:, text_keep]
            k_all, v_all = torch.cat([k_text, k_image], dim=1), torch.cat([v_text, v_image], dim=1)
        k_text, v_text = k_text.contiguous(), v_text.contiguous()
        out_text = attention(q_text, k_all, v_all)
        to_text, lse_text = attention(q_image, k_text, v_text, return_lse=True)
        to_image, lse_image = self._image_attention(q_image, k_image, v_image, return_lse=True)
        out_image, _ = merge_states(to_text, lse_text, to_image, lse_image)
        parts = (out_text, out_image) if self.layout == "text_first" else (out_image, out_text)
        return torch.cat(parts, dim=1)


def _is_attention(module) -> bool:
    return hasattr(module, "processor") and callable(getattr(module, "set_processor", None))


def enable_model(transformer, config: SparseAttentionConfig) -> _ModelState:
    """Wraps the transformer's attention processors (see the module doc); the caller keeps the state
    and calls disable_model with it."""
    if config.pattern.type not in SUPPORTED_PATTERNS:
        raise ValueError(f"sparse_attn.pattern.type: on {type(transformer).__name__} this integration runs "
                         f"{', '.join(SUPPORTED_PATTERNS)}, got {config.pattern.type!r}")
    if config.pattern.type != "dense" and type(transformer).__name__ not in MODEL_LAYOUTS:
        raise ValueError(f"sparse_attn.pattern.type {config.pattern.type!r}: the token layout of "
                         f"{type(transformer).__name__} is not known to tessel (sparse patterns run on "
                         f"{', '.join(sorted(MODEL_LAYOUTS))}); dense runs on any model")
    state = _ModelState(transformer, config)
    _install_hook()
    return state


def disable_model(state: _ModelState) -> None:
    state.restore()
    _remove_hook()


__all__ = ["TOKEN_LAYOUTS", "ScopedAttnProcessor", "enable_model", "disable_model"]
