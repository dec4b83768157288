"""``gpufleet serve``: the fleet as a service (pages, a JSON API, the alert webhook, the standing monitor)."""
