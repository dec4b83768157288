"""The package's version: a leaf every part may import without loading the rest of gpufleet."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
