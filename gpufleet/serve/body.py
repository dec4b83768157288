"""JSON bodies encoded once per view, in the bytes FastAPI would send: a cached view is served, not re-encoded.

Under load, a route that returns a ``dict`` pays FastAPI's answer to it on every request, even when the
dict came from :class:`~gpufleet.serve.cache.ViewCache`: the dict is validated against the response
model (in a thread of the pool: a second hop after the route's own), then encoded (on the event loop,
which holds the GIL while it does). For the fleet view that was most of the server's time, and for
``/api/cost``, which lists every job, it grew with the store. A :class:`JsonEncoder` does the same two
steps with the same pydantic machinery (the response model's ``TypeAdapter``: ``validate_python(...,
from_attributes=True)``, then ``dump_json(by_alias=True, exclude_unset=...)``, as
``fastapi.routing.serialize_response`` does), once, where the view is built; the route returns the
bytes in a :func:`json_response` and FastAPI passes a ``Response`` through untouched. The bodies are
therefore the ones served before, byte for byte (a test compares them), and the OpenAPI document is
unchanged: the routes still declare their response models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.extras import required

with required("fastapi", "serve", "gpufleet serve"):
    from fastapi.responses import Response
    from pydantic import TypeAdapter

JSON_TYPE = "application/json"


class JsonEncoder:
    """A response model's validation and encoding, as FastAPI applies them to what a route returns.

    ``model_of`` gives the response model at each call (:func:`gpufleet.views.job_view_model` changes when
    features register summaries); one ``TypeAdapter`` is kept per model met.
    """

    def __init__(self, model_of: Callable[[], Any], *, exclude_unset: bool = False) -> None:
        self._model_of = model_of
        self.exclude_unset = exclude_unset
        self._adapters: dict[Any, TypeAdapter[Any]] = {}

    def __call__(self, value: Any) -> bytes:
        model = self._model_of()
        adapter = self._adapters.get(model)
        if adapter is None:
            adapter = self._adapters[model] = TypeAdapter(model)
        valid = adapter.validate_python(value, from_attributes=True)
        return adapter.dump_json(valid, by_alias=True, exclude_unset=self.exclude_unset)


def json_response(body: bytes) -> Response:
    """An encoded body as the route's answer (200, ``application/json``), as FastAPI would have sent it."""
    return Response(body, media_type=JSON_TYPE)


__all__ = ["JSON_TYPE", "JsonEncoder", "json_response"]
