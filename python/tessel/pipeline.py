"""tessel.WanPipeline: Wan text-to-video generation from a diffusers model directory, in the shape of
diffusers' WanPipeline, over the library's one generation door (tessel::WanGenerator; the same door
as `tessel generate` and `tessel serve`, so the same request gives the same latents bit for bit).

    pipe = tessel.WanPipeline.from_pretrained("/path/to/Wan2.1-T2V-1.3B-Diffusers", device="cuda")
    frames = pipe("a cat walking", height=480, width=832, num_frames=81, seed=42)  # uint8 (81, 480, 832, 3)

Nothing here needs torch: inputs may be numpy arrays (or torch tensors), outputs are numpy arrays.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from . import _tessel
from ._arrays import is_torch_tensor

_OUTPUT_TYPES = ("np", "latent")


def _config_json(config, argument: str):
    """JSON text of a sparse config given as None, JSON text, a .json file path, a dict or a dataclass."""
    if config is None:
        return None
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return text
        with open(text) as f:
            return f.read()
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if isinstance(config, dict):
        return json.dumps({key: value for key, value in config.items() if value is not None})
    raise TypeError(f"{argument}: expected None, JSON text, a .json file path, a dict or a dataclass, "
                    f"got {type(config).__name__}")


def _host_f32(x, argument: str):
    """A C-contiguous float32 numpy array of `x` (numpy, torch or nested lists); None stays None."""
    if x is None:
        return None
    if is_torch_tensor(x):
        x = x.detach().float().cpu().numpy()
    try:
        return np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{argument}: expected a float32 array, got {type(x).__name__} ({e})") from None


def _rgb_image(image, argument: str):
    """An RGB image as C-contiguous uint8 (H, W, 3): a PIL image (converted to RGB as diffusers'
    load_image does) or a uint8 array of that shape; None stays None."""
    if image is None:
        return None
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image, without importing PIL
        image = image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise TypeError(f"{argument}: expected a PIL image or a uint8 array (height, width, 3), "
                        f"got {type(image).__name__} of dtype {array.dtype} and shape {array.shape}")
    return np.ascontiguousarray(array)


def _plugin_dirs():
    return [p for p in os.environ.get("TESSEL_PLUGIN_PATH", "").split(":") if p]


def _backend_override() -> str:
    return os.environ.get("TESSEL_SPARSE_ATTN_BACKEND") or os.environ.get("DIFFUSION_SPARSE_ATTN_BACKEND") or ""


def _lora_pairs(loras, argument: str) -> list[tuple[str, float]]:
    """[(path, scale)] from paths and (path, scale) pairs."""
    if isinstance(loras, (str, os.PathLike)):
        raise TypeError(f"{argument}: expected a list of paths or (path, scale) pairs, got one path {loras!r}")
    pairs = []
    for entry in loras:
        if isinstance(entry, (str, os.PathLike)):
            pairs.append((os.fspath(entry), 1.0))
        elif isinstance(entry, (tuple, list)) and len(entry) == 2:
            pairs.append((os.fspath(entry[0]), float(entry[1])))
        else:
            raise TypeError(f"{argument}: expected a path or a (path, scale) pair, got {entry!r}")
    return pairs


def _lora_adapters(adapters) -> list[tuple[str, str, float]]:
    """[(name, path, scale)] from {name: path or (path, scale)}."""
    if adapters is None:
        return []
    if not isinstance(adapters, dict):
        raise TypeError(f"lora_adapters: expected a dict of name -> path or (path, scale), got {type(adapters).__name__}")
    result = []
    for name, entry in adapters.items():
        (path, scale), = _lora_pairs([entry], f"lora_adapters[{name!r}]")
        result.append((str(name), path, scale))
    return result


class WanPipeline:
    """A Wan text-to-video pipeline (Wan 2.1 T2V, Wan 2.2 T2V-A14B's two experts, Wan 2.2 TI2V-5B's
    text to video) loaded once from a diffusers model directory; make one with from_pretrained."""

    def __init__(self, generator: _tessel.WanGenerator):
        self._generator = generator
        self._load_arguments: dict | None = None  # from_pretrained's, for load_lora's reload
        self.last_info: dict | None = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, device="cpu", *, sparse_attention=None,
                        sparse_attention_2=None, scheduler: str | None = None, flow_shift: float | None = None,
                        cache: str = "none", num_threads: int | None = None, sparse_layout_size=None,
                        load_text_encoder: bool = True, load_vae: bool = True, loras=(), loras_2=(),
                        lora_ignore_unmatched: bool = False, lora_adapters=None) -> "WanPipeline":
        """Loads the transformer(s), the text encoder and the VAE of a local diffusers Wan directory.

        device: "cpu" (fp32), "cuda" or "cuda:N" (bf16 weights and GEMMs; needs a CUDA build).
        sparse_attention: the transformer's SparseAttnConfig (JSON text, a .json path, a dict or a
            dataclass; None: dense). sparse_attention_2: Wan 2.2's low-noise expert (transformer_2),
            applied over the first's fields (None: the same as the first).
        scheduler: "unipc" or "euler" in place of the model's scheduler/; flow_shift: > 0 replaces
            its shift. cache: "none", "teacache" or "dbcache". num_threads: CPU threads (None: all).
        sparse_layout_size: (num_frames, height, width) whose latent grid spatial sparse patterns
            without a spatial_layout of their own are laid out on (None: as configured).
        load_text_encoder / load_vae: False skips loading them (calls then bring prompt_embeds /
            ask for output_type="latent").
        loras: LoRA or weight-diff safetensors merged into the transformer at load, each a path or a
            (path, scale) pair (diffusers/PEFT, kohya/musubi, ComfyUI or LightX2V keys; as
            `tessel generate --lora`); loras_2: Wan 2.2's low-noise expert (transformer_2).
            lora_ignore_unmatched: skip keys that match no module instead of raising.
        lora_adapters: {name: path or (path, scale)}: LoRAs kept unmerged beside the transformer,
            one of which a call picks with lora="name" (as `tessel serve --lora-adapter`; low-rank
            pairs only, one-expert models).
        The environment's TESSEL_SPARSE_ATTN_BACKEND (or DIFFUSION_SPARSE_ATTN_BACKEND) overrides the
        sparse backend and TESSEL_PLUGIN_PATH adds plugin folders, as for `tessel generate`.
        """
        device = str(device) if device is not None else "cpu"  # torch.device prints "cuda:0"
        layout = None
        if sparse_layout_size is not None:
            layout = tuple(int(v) for v in sparse_layout_size)
            if len(layout) != 3:
                raise ValueError(f"sparse_layout_size: expected (num_frames, height, width), got {sparse_layout_size!r}")
        arguments = dict(
            pretrained_model_name_or_path=pretrained_model_name_or_path, device=device, sparse_attention=sparse_attention,
            sparse_attention_2=sparse_attention_2, scheduler=scheduler, flow_shift=flow_shift, cache=cache,
            num_threads=num_threads, sparse_layout_size=sparse_layout_size, load_text_encoder=load_text_encoder,
            load_vae=load_vae, loras=tuple(loras), loras_2=tuple(loras_2), lora_ignore_unmatched=lora_ignore_unmatched,
            lora_adapters=lora_adapters)
        generator = _tessel.WanGenerator.load(
            os.fspath(pretrained_model_name_or_path), device=device,
            sparse_json=_config_json(sparse_attention, "sparse_attention"),
            sparse_json_2=_config_json(sparse_attention_2, "sparse_attention_2"),
            scheduler=scheduler or "", flow_shift=float(flow_shift or 0.0), cache=cache or "none",
            num_threads=int(num_threads or 0), backend_override=_backend_override(), plugin_dirs=_plugin_dirs(),
            layout_size=layout, load_text_encoder=bool(load_text_encoder), load_vae=bool(load_vae),
            loras=_lora_pairs(loras, "loras"), loras_2=_lora_pairs(loras_2, "loras_2"),
            lora_ignore_unmatched=bool(lora_ignore_unmatched), lora_adapters=_lora_adapters(lora_adapters))
        pipeline = cls(generator)
        pipeline._load_arguments = arguments
        return pipeline

    def load_lora(self, path, scale: float = 1.0, *, expert: int = 0) -> None:
        """Merges one more LoRA (or weight-diff file) into the weights, times `scale`; expert 1 is
        Wan 2.2's low-noise transformer_2. The merge happens at load, so this reloads the
        transformer(s) with every LoRA given so far (the text encoder and VAE too); on error the
        pipeline is left as it was."""
        if expert not in (0, 1):
            raise ValueError(f"expert: expected 0 (transformer) or 1 (transformer_2), got {expert!r}")
        if self._load_arguments is None:
            raise RuntimeError("load_lora: this pipeline was not made by from_pretrained (nothing to reload)")
        arguments = dict(self._load_arguments)
        key = "loras_2" if expert == 1 else "loras"
        arguments[key] = arguments[key] + ((os.fspath(path), float(scale)),)
        replacement = WanPipeline.from_pretrained(**arguments)
        self._generator, self._load_arguments = replacement._generator, replacement._load_arguments

    @property
    def lora_summary(self) -> list[str]:
        """A line per merged LoRA file (the expert, the file, its format and the modules it changed),
        then one per per-request adapter."""
        return list(self._generator.lora_summary)

    @property
    def task(self) -> str:
        """"t2v", "ti2v" (Wan 2.2 TI2V-5B) or "i2v"."""
        return self._generator.task

    @property
    def two_experts(self) -> bool:
        """True for Wan 2.2's two experts (transformer_2 and boundary_ratio)."""
        return self._generator.two_experts

    @property
    def boundary_ratio(self) -> float | None:
        return self._generator.boundary_ratio

    @property
    def vae_spatial_stride(self) -> int:
        """Pixels per latent cell: 8 (Wan 2.1's VAE) or 16 (Wan 2.2's); sizes are multiples of twice it."""
        return self._generator.vae_spatial_stride

    @property
    def device(self) -> str:
        return self._generator.device

    @property
    def path(self) -> str:
        return self._generator.path

    def __repr__(self) -> str:
        return (f"WanPipeline({self.path!r}, task={self.task!r}, two_experts={self.two_experts}, "
                f"device={self.device!r})")

    def __call__(self, prompt: str | None = None, negative_prompt: str | None = None, *, height: int = 480,
                 width: int = 832, num_frames: int = 81, num_inference_steps: int = 50, guidance_scale: float = 5.0,
                 guidance_scale_2: float | None = None, seed: int = 0, noise=None, prompt_embeds=None,
                 negative_prompt_embeds=None, output_type: str = "np", image=None, last_image=None, lora: str | None = None):
        """Generates one video.

        Image to video (a WanImageToVideoPipeline directory): `image` is the first frame and
        `last_image` the last (FLF2V, Wan 2.2 I2V-A14B), each a PIL image or a uint8 array
        (height, width, 3), resized to height x width with Lanczos as diffusers does.

        Returns with output_type="np" the frames as uint8 numpy (num_frames, height, width, 3) RGB,
        with output_type="latent" the final latents as float32 numpy (1, C, F, h, w) (not decoded).
        The text is a prompt (with negative_prompt, default empty, under guidance_scale > 1) or
        float32 embeddings (1, L, text_dim): prompt_embeds and, with guidance, negative_prompt_embeds.
        guidance_scale_2 is the low-noise expert's guidance (two experts only; None: guidance_scale).
        The starting latents are the seed's standard normal noise, or `noise` (float32, the latent
        shape). `lora` names one of from_pretrained's lora_adapters (None: none).
        Library errors raise tessel.TesselError naming the argument.
        """
        if output_type not in _OUTPUT_TYPES:
            raise ValueError(f"output_type: expected one of {', '.join(map(repr, _OUTPUT_TYPES))}, got {output_type!r}")
        if output_type == "np" and not self._generator.has_vae:
            raise ValueError("output_type: expected 'latent' (the pipeline has no VAE: none in the model directory, "
                             "or loaded with load_vae=False), got 'np'")
        for name, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
            if text is not None and not isinstance(text, str):
                raise TypeError(f"{name}: expected a str (one video per call), got {type(text).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
        result = self._generator.generate(
            prompt=prompt, negative_prompt=negative_prompt,
            prompt_embeds=_host_f32(prompt_embeds, "prompt_embeds"),
            negative_prompt_embeds=_host_f32(negative_prompt_embeds, "negative_prompt_embeds"),
            num_frames=int(num_frames), height=int(height), width=int(width),
            num_inference_steps=int(num_inference_steps), guidance_scale=float(guidance_scale),
            guidance_scale_2=None if guidance_scale_2 is None else float(guidance_scale_2),
            seed=int(seed), noise=_host_f32(noise, "noise"), decode=output_type != "latent",
            image=_rgb_image(image, "image"), last_image=_rgb_image(last_image, "last_image"), lora=lora or "")
        self.last_info = {key: value for key, value in result.items() if key not in ("latents", "frames")}
        return result["latents"] if output_type == "latent" else result["frames"]
