"""What one replayed model call came to: the record every driver over HTTP fills in.

`hintkv.workload.live` (agent programs, token-id prompts) and `hintkv.workload.replay` (the
synthetic chat swarm) both produce `CallRecord`s; benchmarks summarize them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CallRecord:
    task_id: str
    session_id: str
    call_index: int  # the call's position in its agent's script
    started_s: float  # when the agent was ready to call, seconds after the replay started
    ttft_s: float | None = None  # to the first streamed content (None if none arrived)
    e2e_s: float | None = None  # to the end of the stream
    prompt_tokens: int | None = None  # from usage (the live driver starts with the count it sent)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None = None
    error: str | None = None
    # where the client's TTFT went (hintkv_metrics): the engine's parts (they sum to its ttft_s),
    # the server's around them (SERVE_PARTS) and the driver's client_send_s; with them the client's
    # TTFT leaves other_s (bench/ttft_breakdown)
    ttft_parts: dict[str, float] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None
