"""Scripted scenarios that show a capability end to end (``gpufleet quality demo``, the labs).

They use the library as a user would and are not imported by it.
"""

__all__: list[str] = []
