"""tessel.SparseAttentionConfig: the C++ tessel::SparseAttnConfig (include/tessel/sparse/config.h) in
Python, with the same sections, field names and defaults:

    {"backend": "auto",
     "geometry":  {"block_q": 128, "block_kv": 64, "spatial_layout": None, "num_text_tokens": None,
                   "text_first": True},
     "pattern":   {"type": "dynamic_topk", "window_size": None, "spatial_radius": None, "decay_factor": 1.0,
                   "local_window_size": 6, "i2i_pattern": None, "children": [], "composite_op": "union"},
     "selection": {"topk_ratio": 0.5, "threshold": 0.95, "stride": 8, "sink_blocks": 0,
                   "keep_diagonal": False, "keep_text": False},
     "schedule":  "constant",
     "warmup":    {"dense_steps": 0, "dense_layers": 0},
     "options":   {}}

Reading and checking is the library's: `from_dict` / `from_json` (and every constructor call) go
through the C++ parser and validation (`_tessel.canonical_sparse_config`), so the ranges (topk_ratio
in (0, 1], block sizes, ...) and the error messages naming the key path
("sparse_attn.selection.topk_ratio: ...") are the C++ ones; `to_dict` / `to_json` write the C++
nested JSON. The C++ flat keys (block_size_q, pattern_type, topk_ratio, dense_timesteps, ...) are
accepted as the C++ parser accepts them. The older Python-only names (pattern as a string,
dense_warmup_steps, cdf_threshold, similarity_threshold, window_3d) still read, with a
DeprecationWarning, mapped onto the C++ fields (see LEGACY_NAMES).
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from typing import Optional

from . import _tessel


class SparseConfigError(_tessel.TesselError, ValueError):
    """A config the C++ codec refused (the message names the key path); a TesselError and a ValueError."""


@dataclass(frozen=True)
class SpatialLayout:
    """The latent grid in pixels of the latent (height, width) and its patch size."""
    frames: int = 1
    height: int = 0
    width: int = 0
    patch_size: int = 2
    ordering: str = "raster"  # raster, hilbert, z_curve


@dataclass(frozen=True)
class Geometry:
    block_q: int = 128
    block_kv: int = 64
    spatial_layout: Optional[SpatialLayout] = None
    num_text_tokens: Optional[int] = None
    text_first: bool = True


@dataclass(frozen=True)
class Pattern:
    type: str = "dynamic_topk"
    window_size: Optional[int] = None
    spatial_radius: Optional[int] = None
    decay_factor: float = 1.0
    local_window_size: int = 6
    i2i_pattern: Optional[str] = None
    children: tuple = ()
    composite_op: str = "union"


@dataclass(frozen=True)
class Selection:
    topk_ratio: float = 0.5
    threshold: float = 0.95
    stride: int = 8
    sink_blocks: int = 0
    keep_diagonal: bool = False
    keep_text: bool = False


@dataclass(frozen=True)
class Warmup:
    dense_steps: int = 0
    dense_layers: int = 0


_SECTIONS = {"geometry": Geometry, "pattern": Pattern, "selection": Selection, "warmup": Warmup}


@dataclass(frozen=True)
class SparseAttentionConfig:
    backend: str = "auto"
    geometry: Geometry = field(default_factory=Geometry)
    pattern: Pattern = field(default_factory=Pattern)
    selection: Selection = field(default_factory=Selection)
    schedule: str = "constant"
    warmup: Warmup = field(default_factory=Warmup)
    options: dict = field(default_factory=dict)  # free-form backend options, values as text

    def __post_init__(self):
        # Lists and mappings become their canonical immutable-ish forms; the C++ validation checks
        # every range (and raises SparseConfigError naming the field).
        if isinstance(self.geometry.spatial_layout, dict):
            object.__setattr__(self, "geometry",
                               dataclasses.replace(self.geometry, spatial_layout=SpatialLayout(**self.geometry.spatial_layout)))
        if not isinstance(self.pattern.children, tuple):
            object.__setattr__(self, "pattern", dataclasses.replace(self.pattern, children=tuple(self.pattern.children)))
        if not isinstance(self.options, dict):
            raise TypeError(f"options: expected a dict, got {type(self.options).__name__}")
        canonical = json.loads(_canonical(json.dumps(self._raw_dict())))
        object.__setattr__(self, "options", canonical["options"])  # values as the library keeps them: text

    # ---- the C++ JSON --------------------------------------------------------------------------

    def _raw_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["pattern"]["children"] = list(out["pattern"]["children"])
        return out

    def to_dict(self) -> dict:
        """The C++ nested form with every field (SparseAttnConfig::to_json, as a dict)."""
        return json.loads(self.to_json())

    def to_json(self) -> str:
        """SparseAttnConfig::to_json of this config (nested keys, every field)."""
        return _canonical(json.dumps(self._raw_dict()))

    @classmethod
    def from_json(cls, text: str) -> "SparseAttentionConfig":
        """A config from the C++ JSON text (nested or flat keys), validated by the library."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError:
            values = None
        if isinstance(values, dict):
            return cls.from_dict(values)
        return cls._from_canonical(json.loads(_canonical(text)))  # the library's error for bad text

    @classmethod
    def from_dict(cls, values: dict) -> "SparseAttentionConfig":
        """A config from a dict of the C++ keys (nested or flat; fields left out keep their
        defaults), validated by the library. Older Python names warn and are mapped."""
        return cls._from_canonical(json.loads(_canonical(json.dumps(translate_legacy_names(values)))))

    @classmethod
    def _from_canonical(cls, values: dict) -> "SparseAttentionConfig":
        sections = {name: section(**values[name]) for name, section in _SECTIONS.items()}
        layout = values["geometry"]["spatial_layout"]
        if layout is not None:
            sections["geometry"] = dataclasses.replace(sections["geometry"], spatial_layout=SpatialLayout(**layout))
        sections["pattern"] = dataclasses.replace(sections["pattern"], children=tuple(values["pattern"]["children"]))
        return cls(backend=values["backend"], schedule=values["schedule"], options=values["options"], **sections)

    @classmethod
    def dense(cls) -> "SparseAttentionConfig":
        """Dense attention everywhere (pattern.type "dense")."""
        return cls(pattern=Pattern(type="dense"))

    @classmethod
    def from_any(cls, config) -> "SparseAttentionConfig":
        """A config from None (dense), an instance, a dict (from_dict) or JSON text (from_json)."""
        if config is None:
            return cls.dense()
        if isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls.from_dict(config)
        if isinstance(config, str):
            return cls.from_json(config)
        raise TypeError(f"config: expected a SparseAttentionConfig, a dict, JSON text or None, "
                        f"got {type(config).__name__}")

    def is_dense_at(self, step: int, layer: int) -> bool:
        """Dense attention at this step and layer: pattern dense, backend none, or the warm-up."""
        return (self.pattern.type == "dense" or self.backend == "none" or step < self.warmup.dense_steps
                or layer < self.warmup.dense_layers)


def _canonical(text: str) -> str:
    try:
        return _tessel.canonical_sparse_config(text)
    except _tessel.TesselError as e:
        raise SparseConfigError(str(e)) from None


def default_json() -> str:
    """SparseAttnConfig{}'s JSON (the C++ defaults)."""
    return _tessel.default_sparse_config()


# ---- the older Python-only names -------------------------------------------------------------

def _legacy_window_3d(value):
    frame, height, width = (int(v) for v in value)
    return {"options": {"frame_radius": str(frame), "height_radius": str(height), "width_radius": str(width)}}


def _legacy_pattern(value):
    if value == "sliding_window_3d":  # the C++ sliding_window on the latent grid
        return {"pattern": {"type": "sliding_window"}}
    return {"pattern": {"type": value}}


# old name -> (the C++ field(s) it maps to, for the warning; value -> nested dict fragment)
LEGACY_NAMES = {
    "pattern": ("pattern.type", _legacy_pattern),
    "dense_warmup_steps": ("warmup.dense_steps", lambda v: {"warmup": {"dense_steps": v}}),
    "cdf_threshold": ("options.cdf", lambda v: {"options": {"cdf": str(v)}}),
    "similarity_threshold": ("options.similarity_threshold",
                             lambda v: {"options": {"similarity_threshold": str(v)}}),
    "window_3d": ("options.frame_radius/height_radius/width_radius", _legacy_window_3d),
}


def _merge(into: dict, fragment: dict, old: str) -> None:
    for key, value in fragment.items():
        if isinstance(value, dict):
            section = into.setdefault(key, {})
            if not isinstance(section, dict):
                raise SparseConfigError(f"sparse_attn.{old}: also given as sparse_attn.{key}")
            for sub_key, item in value.items():
                if sub_key in section:
                    raise SparseConfigError(f"sparse_attn.{old}: given twice (also as sparse_attn.{key}.{sub_key})")
                section[sub_key] = item
        else:
            into[key] = value


def translate_legacy_names(values: dict) -> dict:
    """`values` with the older Python-only names replaced by their C++ fields (DeprecationWarning)."""
    if not isinstance(values, dict):
        raise TypeError(f"config: expected a dict, got {type(values).__name__}")
    legacy = [name for name in LEGACY_NAMES
              if name in values and not (name == "pattern" and isinstance(values[name], dict))]
    if not legacy:
        return dict(values)
    out = {key: (dict(value) if isinstance(value, dict) else value)
           for key, value in values.items() if key not in legacy}
    for name in legacy:
        target, mapping = LEGACY_NAMES[name]
        warnings.warn(f"sparse config key {name!r} is deprecated: use {target} (the C++ SparseAttnConfig schema)",
                      DeprecationWarning, stacklevel=3)
        _merge(out, mapping(values[name]), name)
    return out
