"""vLLM-Omni's current sparse-attention plugin contract (its SPARSE_ATTN dispatcher, PR #4493): the
entry point `tessel` of the group `vllm_omni.sparse_attn` is one callable

    sparse_attn(query, key, value, params: dict, is_causal=False, softmax_scale=None) -> Tensor

on (B, S, H, D) tensors, with a `capabilities` dict (`supports_attention_mask`: key-padding masks,
what sequence-parallel auto-padding sends). `params` is the dispatcher's flat merge of the static
config, the per-forward state and the call's extras. Read here:
- the attention: `config` (a tessel SparseAttentionConfig: dict or JSON, the C++ schema), or the
  flat keys `pattern` (dense, dynamic_topk, threshold, radial, local, sliding_window), `topk_ratio`,
  `threshold`, `block_q`, `block_kv`, `dense_steps`, `similarity_threshold`, `stride`;
- the step: `denoise_step_idx` and `total_denoise_steps` (per-sample tensors or ints; the first
  sample's is used: a batch runs one step), so warm-up steps run dense;
- the latent grid for static patterns: `latent_shape` (T, H, W) and `patch_size` (p_t, p_h, p_w);
- `attn_mask`: a key-padding mask (boolean or 0 / -inf) honoured exactly; with the padding at the
  end (sequence-parallel auto-padding) the real tokens keep the pattern, padding elsewhere runs
  dense; other masks are refused.
The dispatcher's derived geometry (`total_latent_frames`, `patches_per_frame`) is not needed:
static patterns need the grid's height and width, which `latent_shape` / `patch_size` give.
Causal calls and a softmax scale other than 1/sqrt(D) run tessel's dense attention. The object
also carries the seed RFC's backend interface (get_name, get_impl_cls, get_metadata_builder_cls,
...: tessel.integrations.vllm_omni), so a dispatcher of either contract can load the same entry.
"""
from __future__ import annotations

import json
import math

import torch

from ._masks import attend_kept_keys, kept_prefix, key_padding
from .vllm_omni import TesselSparseBackend
from ..functional import attention
from ..sparse_attention import SUPPORTED_PATTERNS, SparseAttentionRunner
from ..sparse_config import SparseAttentionConfig

_FLAT_KEYS = ("pattern", "topk_ratio", "threshold", "block_q", "block_kv", "dense_steps", "similarity_threshold",
              "stride")


def _first_int(value, name: str) -> int:
    if hasattr(value, "reshape"):  # a per-sample tensor
        value = value.reshape(-1)[0].item() if value.numel() else None
    elif isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        raise ValueError(f"tessel plugin: params[{name!r}] is empty")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"tessel plugin: params[{name!r}]: expected an integer, got {value!r}") from None


def _triple(value, name: str) -> tuple:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], (list, tuple)):
        value = value[0]
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"tessel plugin: params[{name!r}]: expected (a, b, c) or [[a, b, c], ...], got {value!r}")
    return tuple(int(x) for x in value)


def config_from_params(params: dict) -> SparseAttentionConfig:
    """The tessel config a call's params ask for: params['config'] as is, else the flat keys."""
    if "config" in params:
        unexpected = [key for key in _FLAT_KEYS if key in params]
        if unexpected:
            raise ValueError(f"tessel plugin: params has both 'config' and {unexpected}: give one form")
        return SparseAttentionConfig.from_any(params["config"])
    values = {"pattern": {"type": str(params.get("pattern", "dense")).lower()}, "selection": {}, "geometry": {},
              "options": {}}
    for key in ("topk_ratio", "threshold"):
        if key in params:
            values["selection"][key] = float(params[key])
    for key in ("block_q", "block_kv"):
        if key in params:
            values["geometry"][key] = int(params[key])
    if "dense_steps" in params:
        values["warmup"] = {"dense_steps": int(params["dense_steps"])}
    for key in ("similarity_threshold", "stride"):
        if key in params:
            values["options"][key] = str(params[key])
    return SparseAttentionConfig.from_any(values)


class TesselSparseAttn:
    """The entry point's object (see the module doc): callable per vLLM-Omni's dispatcher, with the
    seed RFC's backend methods beside it. One runner per distinct config, kept across calls."""

    capabilities = {"supports_attention_mask": True, "supports_full_attn_spans": False}

    # The seed RFC's interface, for dispatchers that load the entry as a backend class.
    get_name = staticmethod(TesselSparseBackend.get_name)
    get_impl_cls = staticmethod(TesselSparseBackend.get_impl_cls)
    get_metadata_builder_cls = staticmethod(TesselSparseBackend.get_metadata_builder_cls)
    supported_patterns = staticmethod(TesselSparseBackend.supported_patterns)
    supported_module_types = staticmethod(TesselSparseBackend.supported_module_types)
    validate_config = staticmethod(TesselSparseBackend.validate_config)

    def __init__(self):
        self._runners = {}

    @staticmethod
    def _params_key(params: dict):
        """What decides the config, cheap to compare on every call (the dispatcher calls per layer and
        step): the flat keys' values, or the 'config' entry's JSON; None where only the built config
        can tell (a config object)."""
        flat = tuple((key, repr(params[key])) for key in _FLAT_KEYS if key in params)
        if "config" not in params:
            return flat
        given = params["config"]
        if isinstance(given, (str, dict)):  # with the flat keys: both forms together stay an error
            return flat, given if isinstance(given, str) else json.dumps(given, sort_keys=True, default=repr)
        return None

    def _runner(self, params: dict) -> SparseAttentionRunner:
        params_key = self._params_key(params)
        runner = self._runners.get(params_key) if params_key is not None else None
        if runner is not None:
            return runner
        config = config_from_params(params)
        key = json.dumps(config.to_dict(), sort_keys=True)
        runner = self._runners.get(key)
        if runner is None:
            if config.pattern.type not in SUPPORTED_PATTERNS:
                raise ValueError(f"tessel plugin: pattern {config.pattern.type!r} is not one of "
                                 f"{', '.join(SUPPORTED_PATTERNS)}")
            runner = self._runners[key] = SparseAttentionRunner(config)
        if params_key is not None:
            self._runners[params_key] = runner  # the same runner under both keys
        return runner

    def __call__(self, query, key, value, params=None, is_causal=False, softmax_scale=None):
        params = dict(params or {})
        if params.get("full_attn_spans") is not None:
            raise ValueError("tessel plugin: full_attn_spans is not supported (capabilities says so)")
        runner = self._runner(params)
        runner.step = _first_int(params["denoise_step_idx"], "denoise_step_idx") if "denoise_step_idx" in params else 0
        if "latent_shape" in params and "patch_size" in params:
            (t, h, w), (pt, ph, pw) = _triple(params["latent_shape"], "latent_shape"), _triple(params["patch_size"], "patch_size")
            runner.grid = (t // pt, h // ph, w // pw) if pt and ph and pw else None
        default_scale = softmax_scale is None or math.isclose(softmax_scale, query.shape[-1] ** -0.5, rel_tol=1e-6)

        def attend(q, k, v):
            if is_causal or not default_scale or k.shape[1] != q.shape[1]:
                return attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=bool(is_causal),
                                 softmax_scale=softmax_scale)
            return runner(q.contiguous(), k.contiguous(), v.contiguous(), 0)

        mask = params.get("attn_mask")
        keep = None if mask is None else key_padding(mask, query.shape[0], query.shape[1], key.shape[1])
        if keep is None:
            return attend(query, key, value)

        def dense(q, k, v):
            return attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=bool(is_causal),
                             softmax_scale=softmax_scale)

        if key.shape[1] != query.shape[1]:
            return attend_kept_keys(dense, query, key, value, keep)
        # Sequence-parallel auto-padding appends its padding: the real tokens (a prefix) keep the
        # pattern (the grid describes them), the padding rows attend to them densely. Padding
        # elsewhere leaves the entry dense over its kept keys.
        outputs = []
        for b in range(query.shape[0]):
            q, k, v = query[b:b + 1], key[b:b + 1], value[b:b + 1]
            kept = kept_prefix(keep[b])
            if kept is None:
                outputs.append(dense(q, k[:, keep[b]], v[:, keep[b]]))
                continue
            real = attend(q[:, :kept], k[:, :kept], v[:, :kept])
            padding = dense(q[:, kept:], k[:, :kept], v[:, :kept])
            outputs.append(torch.cat([real, padding], dim=1))
        return torch.cat(outputs)


sparse_attn = TesselSparseAttn()
