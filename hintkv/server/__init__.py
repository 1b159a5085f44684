"""hintkv.server: the OpenAI-compatible HTTP front of the engine (FastAPI + uvicorn).

`build_app(engine, api_keys)` makes the ASGI app around a running engine;
`serve(engine_cfg, host, port, api_keys)` builds the engine and runs the app until stopped.
Endpoints: POST /v1/chat/completions, POST /v1/completions (both accept `agent_hint`; see
docs/protocol.md), GET /v1/sessions/{id}, GET /v1/models, GET /health, GET /metrics (Prometheus
text). `hintkv.server.background.BackgroundServer` runs an app in a thread (tests, benchmarks).

    hints.py       request -> RequestHint (tenant, SessionRef, resolved edits, management flag)
    hint_edits.py  edits -> engine.manage -> agent_hint_result (ranges via the chat template)
"""

from hintkv.server.app import build_app
from hintkv.server.launch import serve

__all__ = ["build_app", "serve"]
