"""Build target implementations; the registry and the interface live in :mod:`pipeline.core.targets`."""
