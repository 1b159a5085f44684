"""GET /v1/models, /health and /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request, Response

from hintkv.server.api_responses import ModelCard, ModelList
from hintkv.server.metrics import CONTENT_TYPE
from hintkv.server.state import require_api_key, require_metrics_access, server_state

router = APIRouter()


@router.get("/v1/models", dependencies=[Depends(require_api_key)])
async def list_models(request: Request) -> Response:
    engine = server_state(request).engine
    body = ModelList(data=[ModelCard(id=engine.model_name, max_model_len=engine.max_model_len)])
    return Response(body.model_dump_json(), media_type="application/json")


@router.get("/health")
async def health(request: Request) -> Response:
    # 503 once the engine thread is gone (review rev26 A14): requests would hang, so a router must route around it
    return Response(status_code=200 if server_state(request).engine.alive else 503)


@router.get("/metrics", dependencies=[Depends(require_metrics_access)])
async def metrics(request: Request) -> Response:
    # rendered in a worker thread: the collectors read the engine under its state lock, which a step
    # holds (a same-step load wait, a long prefill); on the event loop that would stall every stream
    body = await asyncio.to_thread(server_state(request).metrics.render)
    return Response(body, media_type=CONTENT_TYPE)
