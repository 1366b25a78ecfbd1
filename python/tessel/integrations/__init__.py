"""Integrations of tessel into other libraries' models (imported on demand: each needs its library)."""
