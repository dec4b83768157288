"""Ray: ``backend`` is the client (submit, follow, cancel through the Ray Jobs API), ``runner`` the
actor that runs one attempt in the cluster, ``ranks`` the placement group of a multi-rank attempt."""

__all__: list[str] = []
