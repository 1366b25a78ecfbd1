"""Short alias of tessel.integrations.diffusers: enable_sparse_attention(pipe_or_transformer, config)."""
from .integrations.diffusers import TesselWanAttnProcessor, disable, enable, enable_sparse_attention, set_step

__all__ = ["TesselWanAttnProcessor", "disable", "enable", "enable_sparse_attention", "set_step"]
