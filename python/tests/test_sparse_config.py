"""tessel.SparseAttentionConfig is the C++ SparseAttnConfig: the same fields, names and defaults,
every field round-tripped through the C++ codec, and bad values refused by the C++ validation with
the key path named. No torch needed."""
import dataclasses
import json

import pytest

import tessel
from tessel import _tessel
from tessel.sparse_config import (Geometry, Pattern, Selection, SparseAttentionConfig, SparseConfigError,
                                  SpatialLayout, Warmup)

# A valid config with every field away from its default (keep_text needs num_text_tokens; arrow's
# i2i_pattern and composite's children are plain fields, checked only against arrow / composite).
NON_DEFAULT = {
    "backend": "threshold",
    "geometry": {"block_q": 32, "block_kv": 16,
                 "spatial_layout": {"frames": 3, "height": 16, "width": 24, "patch_size": 4, "ordering": "hilbert"},
                 "num_text_tokens": 77, "text_first": False},
    "pattern": {"type": "arrow", "window_size": 256, "spatial_radius": 3, "decay_factor": 2.5,
                "local_window_size": 4, "i2i_pattern": "radial", "children": ["radial", "local"],
                "composite_op": "intersection"},
    "selection": {"topk_ratio": 0.25, "threshold": 0.8, "stride": 16, "sink_blocks": 2, "keep_diagonal": True,
                  "keep_text": True},
    "schedule": "aggressive",
    "warmup": {"dense_steps": 5, "dense_layers": 3},
    "options": {"cdf": "0.9", "frame0_sink": "false"},
}

# Fields that another field needs when set alone.
NEEDS = {"selection.keep_text": {"geometry": {"num_text_tokens": 77}}}


def cpp_default() -> dict:
    return json.loads(_tessel.default_sparse_config())


def leaves(values: dict, prefix=""):
    """(dotted path, value) of every field; options is one field (a mapping)."""
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and path not in ("options", "geometry.spatial_layout"):
            yield from leaves(value, path + ".")
        else:
            yield path, value


def nested(path: str, value) -> dict:
    out = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def merged(*parts: dict) -> dict:
    out = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


FIELDS = [path for path, _ in leaves(cpp_default())]
NON_DEFAULT_LEAVES = dict(leaves(NON_DEFAULT))


def test_defaults_equal_the_cpp_defaults():
    default = SparseAttentionConfig()
    # The Python field values themselves, not only after the C++ codec.
    assert default._raw_dict() == cpp_default()
    assert default.to_dict() == cpp_default()
    assert json.loads(default.to_json()) == cpp_default()
    assert SparseAttentionConfig.from_dict({}) == default
    assert SparseAttentionConfig.from_json("{}") == default
    assert SparseAttentionConfig.from_json(_tessel.default_sparse_config()) == default


def test_field_names_are_the_cpp_keys():
    cpp = cpp_default()
    assert [f.name for f in dataclasses.fields(SparseAttentionConfig)] == list(SparseAttentionConfig()._raw_dict())
    assert set(SparseAttentionConfig()._raw_dict()) == set(cpp)
    for name, section in (("geometry", Geometry), ("pattern", Pattern), ("selection", Selection), ("warmup", Warmup)):
        assert {f.name for f in dataclasses.fields(section)} == set(cpp[name]), name
    layout = json.loads(_tessel.canonical_sparse_config(json.dumps(NON_DEFAULT)))["geometry"]["spatial_layout"]
    assert {f.name for f in dataclasses.fields(SpatialLayout)} == set(layout)
    assert SpatialLayout() == SpatialLayout(**{"frames": 1, "height": 0, "width": 0, "patch_size": 2,
                                               "ordering": "raster"})  # SpatialLayout{} of pattern.h


def test_the_non_default_config_sets_every_field():
    default = dict(leaves(cpp_default()))
    assert set(NON_DEFAULT_LEAVES) == set(default)
    for path, value in NON_DEFAULT_LEAVES.items():
        assert value != default[path], path


def test_every_field_round_trips_through_cpp():
    built = SparseAttentionConfig(
        backend="threshold",
        geometry=Geometry(block_q=32, block_kv=16,
                          spatial_layout=SpatialLayout(frames=3, height=16, width=24, patch_size=4, ordering="hilbert"),
                          num_text_tokens=77, text_first=False),
        pattern=Pattern(type="arrow", window_size=256, spatial_radius=3, decay_factor=2.5, local_window_size=4,
                        i2i_pattern="radial", children=("radial", "local"), composite_op="intersection"),
        selection=Selection(topk_ratio=0.25, threshold=0.8, stride=16, sink_blocks=2, keep_diagonal=True,
                            keep_text=True),
        schedule="aggressive",
        warmup=Warmup(dense_steps=5, dense_layers=3),
        options={"cdf": "0.9", "frame0_sink": "false"},
    )
    assert built._raw_dict() == NON_DEFAULT
    canonical = _tessel.canonical_sparse_config(built.to_json())  # C++ parse, validate, to_json
    assert json.loads(canonical) == NON_DEFAULT
    back = SparseAttentionConfig.from_json(canonical)
    assert back == built
    assert SparseAttentionConfig.from_dict(NON_DEFAULT) == built
    assert back.to_dict() == NON_DEFAULT


@pytest.mark.parametrize("path", FIELDS)
def test_each_field_alone_round_trips(path):
    value = NON_DEFAULT_LEAVES[path]
    values = merged(NEEDS.get(path, {}), nested(path, value))
    config = SparseAttentionConfig.from_dict(values)
    expected = merged(cpp_default(), values)
    assert config.to_dict() == expected
    assert json.loads(_tessel.canonical_sparse_config(config.to_json())) == expected
    assert SparseAttentionConfig.from_json(config.to_json()) == config
    assert dict(leaves(config._raw_dict()))[path] == value


def test_cpp_flat_keys_read_into_the_nested_fields():
    config = SparseAttentionConfig.from_dict({"pattern_type": "radial", "block_size_q": 64, "block_size_kv": 32,
                                              "dense_timesteps": 4, "dense_layers": 2, "keep_diagonal": True,
                                              "topk_ratio": 0.3})
    assert config.pattern.type == "radial"
    assert (config.geometry.block_q, config.geometry.block_kv) == (64, 32)
    assert (config.warmup.dense_steps, config.warmup.dense_layers) == (4, 2)
    assert config.selection.keep_diagonal and config.selection.topk_ratio == 0.3
    assert config.is_dense_at(3, 5) and config.is_dense_at(9, 1) and not config.is_dense_at(4, 2)


def test_older_python_names_warn_and_map():
    with pytest.warns(DeprecationWarning) as record:
        config = SparseAttentionConfig.from_dict({"pattern": "sliding_window_3d", "window_3d": (1, 2, 3),
                                                  "dense_warmup_steps": 7, "similarity_threshold": -1.0,
                                                  "cdf_threshold": 0.5})
    warned = " ".join(str(w.message) for w in record)
    for name in ("'pattern'", "window_3d", "dense_warmup_steps", "similarity_threshold", "cdf_threshold"):
        assert name in warned
    assert config.pattern.type == "sliding_window" and config.warmup.dense_steps == 7
    assert config.options == {"frame_radius": "1", "height_radius": "2", "width_radius": "3",
                              "similarity_threshold": "-1.0", "cdf": "0.5"}


def test_dense_and_from_any():
    assert SparseAttentionConfig.from_any(None).pattern.type == "dense"
    assert SparseAttentionConfig.from_any(None).is_dense_at(100, 100)
    config = SparseAttentionConfig.from_any({"selection": {"topk_ratio": 0.2}})
    assert SparseAttentionConfig.from_any(config) is config
    assert SparseAttentionConfig.from_any(config.to_json()) == config
    with pytest.raises(TypeError, match="config"):
        SparseAttentionConfig.from_any(42)
    assert tessel.SparseAttentionConfig is SparseAttentionConfig


@pytest.mark.parametrize("values, field", [
    ({"selection": {"topk_ratio": 0.0}}, "selection.topk_ratio"),
    ({"selection": {"topk_ratio": 1.5}}, "selection.topk_ratio"),
    ({"topk_ratio": 2.0}, "selection.topk_ratio"),  # a flat key: the range error names the field's path
    ({"selection": {"threshold": 0}}, "selection.threshold"),
    ({"selection": {"stride": 0}}, "selection.stride"),
    ({"selection": {"sink_blocks": -1}}, "selection.sink_blocks"),
    ({"selection": {"keep_text": True}}, "selection.keep_text"),
    ({"selection": {"keep_diagonal": 1}}, "selection.keep_diagonal"),
    ({"geometry": {"block_q": 0}}, "geometry.block_q"),
    ({"geometry": {"block_kv": 5000}}, "geometry.block_kv"),
    ({"geometry": {"num_text_tokens": -3}}, "geometry.num_text_tokens"),
    ({"geometry": {"spatial_layout": {"frames": 1, "height": 10, "width": 8, "patch_size": 4}}},
     "geometry.spatial_layout"),
    ({"pattern": {"type": "spiral"}}, "pattern.type"),
    ({"pattern": {"decay_factor": 0.0}}, "pattern.decay_factor"),
    ({"pattern": {"local_window_size": 0}}, "pattern.local_window_size"),
    ({"pattern": {"window_size": -1}}, "pattern.window_size"),
    ({"pattern": {"i2i_pattern": "arrow"}}, "pattern.i2i_pattern"),
    ({"pattern": {"children": ["composite"]}}, "pattern.children"),
    ({"pattern": {"composite_op": "xor"}}, "pattern.composite_op"),
    ({"warmup": {"dense_steps": -1}}, "warmup.dense_steps"),
    ({"warmup": {"dense_layers": -2}}, "warmup.dense_layers"),
    ({"schedule": "sometimes"}, "schedule"),
    ({"backend": ""}, "backend"),
    ({"selection": {"no_such_key": 1}}, "selection.no_such_key"),
    ({"no_such_key": 1}, "no_such_key"),
    ({"topk_ratio": 0.5, "selection": {"topk_ratio": 0.4}}, "topk_ratio"),
])
def test_bad_values_are_refused_naming_the_field(values, field):
    with pytest.raises(SparseConfigError, match=f"sparse_attn\\.{field}") as raised:
        SparseAttentionConfig.from_dict(values)
    assert isinstance(raised.value, tessel.TesselError) and isinstance(raised.value, ValueError)
    with pytest.raises(tessel.TesselError, match=f"sparse_attn\\.{field}"):
        _tessel.canonical_sparse_config(json.dumps(values))


def test_constructor_and_json_text_are_validated_in_cpp():
    with pytest.raises(SparseConfigError, match="sparse_attn.selection.topk_ratio"):
        SparseAttentionConfig(selection=Selection(topk_ratio=2.0))
    with pytest.raises(SparseConfigError, match="sparse_attn.geometry.block_q"):
        SparseAttentionConfig(geometry=Geometry(block_q=0))
    with pytest.raises(tessel.TesselError, match="sparse_attn config"):
        SparseAttentionConfig.from_json("{not json")
    with pytest.raises(tessel.TesselError, match="sparse_attn config"):
        _tessel.canonical_sparse_config("[1, 2]")
