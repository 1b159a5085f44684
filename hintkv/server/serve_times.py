"""Where a request's time to first token goes outside the engine: the server's own parts.

The engine accounts from a request's arrival at its scheduler to its first token (`TtftParts`).
Around that, on the server's perf_counter (`wake_s` also subtracts the engine's `ttft_s`, on its
scheduler's time.monotonic: on Linux both are CLOCK_MONOTONIC):

    arrival ──http──> handed to the engine ──inbox──> [engine: TtftParts] ──wake──> on the event loop
      ──stream──> first chunk handed to the transport

- `http_s`: the handler's work before the engine: body read + JSON + limits + pydantic, the hint,
  the load gate, the prompt through the tokenizer's worker thread (uvicorn's parsing before the
  handler is not in it: a client sees that as its own wire time);
- `inbox_s`: the request waits for the engine thread to finish the step it is in, then for the
  state lock (`AsyncLLM`);
- `wake_s`: from the engine's first token to the event loop holding it: the step's remaining
  update, the thread hand-off, the loop busy with other requests (derived: what the parts around
  it leave, so the parts and the engine's TTFT sum to `serve_s`, arrival -> first chunk out);
- `stream_s`: detokenize, the SSE chunk, until the first chunk with output is handed to the
  transport (decode steps whose tokens were held back, e.g. an empty first token, are in it); on a
  whole response, until the first token was collected (microseconds: `serve_s` ends there, not at the
  response).

The parts are disjoint pieces of the client's TTFT by construction: `arrival` is stamped after the
request's bytes came in, and `first_sent` just before the chunk is handed over, never after the write
returns. A stamp after the write could land after the client read the chunk: the write releases
the GIL, the engine thread takes it for its next step, and the event loop resumes up to a switch
interval (5 ms) later (test_live's parts summed to 2 ms over the client's TTFT, af06b72).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hintkv.engine.types import RequestMetrics

SERVE_PARTS = ("http_s", "inbox_s", "wake_s", "stream_s")


@dataclass(slots=True)
class ServeTimes:
    """A request's marks on the server's clock (perf_counter seconds); None: not reached."""

    arrival: float  # the handler started
    handed: float | None = None  # handed to the engine
    first_out: float | None = None  # the first token's output reached the event loop
    first_sent: float | None = None  # the first chunk with output handed out (after a held-back one)

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def sending(self) -> None:
        """A chunk with output is about to be handed to the transport: the route calls it before it
        yields the chunk (a whole response: when it collected it). Chunks held back (an empty first
        token, half a character, a stop string, a buffered tool call) do not count, so their decode
        steps are in `stream_s`."""
        if self.first_sent is None and self.first_out is not None:
            self.first_sent = time.perf_counter()

    def parts(self, m: RequestMetrics | None) -> dict[str, float] | None:
        """The four parts and their sum `serve_s` (arrival -> first chunk out), or None when the
        request produced no token or the engine's figures are missing."""
        if m is None or m.ttft_s is None or None in (self.handed, self.first_out, self.first_sent):
            return None
        inbox = m.inbox_s or 0.0
        parts = {"http_s": self.handed - self.arrival, "inbox_s": inbox,
                 "wake_s": self.first_out - self.handed - inbox - m.ttft_s,
                 "stream_s": self.first_sent - self.first_out}
        parts["serve_s"] = self.first_sent - self.arrival
        return parts
