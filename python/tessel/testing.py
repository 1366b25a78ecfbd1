"""Helpers for tests: tiny diffusers Wan model directories of seeded random weights, written by the
library itself (what `tessel init-model --preset NAME --out DIR` writes), so a test of
tessel.WanPipeline needs neither the CLI nor a download."""
from __future__ import annotations

import os

from . import _tessel


def write_random_wan_model(directory, preset: str = "tiny", seed: int = 0, threads: int = 0) -> int:
    """Writes `preset`'s model directory into `directory` (created when missing): "tiny", "tiny-a14b"
    (Wan 2.2's two experts), "tiny-ti2v", "tiny-cuda", or the published sizes "wan-1.3b", "wan-14b",
    "wan-ti2v-5b". The same seed gives byte-identical files. Returns the bytes of weights written
    (0 for the tiny presets)."""
    return _tessel.write_random_wan_model(os.fspath(directory), preset, int(seed), int(threads))


def random_wan_model_presets() -> list:
    return list(_tessel.random_wan_model_presets())
