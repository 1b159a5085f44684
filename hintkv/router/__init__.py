"""hintkv.router: an OpenAI-compatible front over several hintkv instances.

    hintkv router --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 --port 8000

- `affinity.Placement`: where each session goes (its own instance; a sub-agent next to its
  parent's prefix when that instance has room; else the least-loaded healthy one).
- `backends.Backend` / `backends.Backends`: health checks, load and per-backend counters.
- `app.build_router_app`: the HTTP front (forwarding, streaming, failover, management fan-out).
"""

from hintkv.router.affinity import Placement
from hintkv.router.app import build_router_app
from hintkv.router.backends import Backend, Backends

__all__ = ["Backend", "Backends", "Placement", "build_router_app"]
