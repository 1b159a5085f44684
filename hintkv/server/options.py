"""What an operator decides about one server (as opposed to its engine): keys, limits, load.

`hintkv serve` builds it from its flags; tests build it directly. Every field has its default
and its help text here, once: the CLI's flags are generated from this dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hintkv.server import event_loop
from hintkv.server import limits as L
from hintkv.server.limits import RequestLimits


@dataclass(frozen=True, slots=True)
class ServerOptions:
    api_keys: tuple[str, ...] = field(
        default=(),
        metadata={"help": "accept this Bearer key (repeat for several); none given: no "
                  "authentication", "flags": ("--api-key",)},
    )
    public_metrics: bool = field(
        default=False,
        metadata={"help": "serve /metrics without an API key (default: it needs one when keys are set)"},
    )
    max_body_bytes: int = field(
        default=L.MAX_BODY_BYTES, metadata={"help": "largest request body (413 past it)"}
    )
    max_json_depth: int = field(
        default=L.MAX_DEPTH, metadata={"help": "deepest JSON nesting in a body"}
    )
    max_string_chars: int = field(
        default=L.MAX_STRING_CHARS, metadata={"help": "longest string in a body"}
    )
    max_list_items: int = field(
        default=L.MAX_LIST_ITEMS, metadata={"help": "longest list in a body"}
    )
    max_queued_requests: int = field(
        default=256,
        metadata={"help": "generation requests waiting beyond --max-num-seqs before new ones get "
                  "503 + Retry-After"},
    )
    tenant_rate_limit: float = field(
        default=0.0,
        metadata={"help": "generation requests per second per tenant (429 + Retry-After past "
                  "it; burst of max(1, rate)); 0: no limit"},
    )
    tenant_max_concurrency: int = field(
        default=0,
        metadata={"help": "generation requests in flight per tenant (429 past it); 0: no limit"},
    )
    integrity_check_interval: float = field(
        default=10.0,
        metadata={"help": "seconds between the periodic cache integrity checks; 0: never"},
    )
    loop: str = field(
        default="auto",
        metadata={"help": "the event loop: auto (uvloop where installed, else asyncio), asyncio, uvloop"},
    )
    http: str = field(
        default="auto",
        metadata={"help": "the HTTP parser: auto (httptools where installed, else h11), h11, httptools"},
    )

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth", "max_string_chars", "max_list_items"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_queued_requests < 0 or self.tenant_max_concurrency < 0:
            raise ValueError("max_queued_requests and tenant_max_concurrency must be >= 0")
        if self.tenant_rate_limit < 0 or self.integrity_check_interval < 0:
            raise ValueError("tenant_rate_limit and integrity_check_interval must be >= 0")
        event_loop.check(self.loop, self.http)

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(
            self.max_body_bytes, self.max_json_depth, self.max_string_chars, self.max_list_items
        )
