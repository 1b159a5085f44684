"""The one error a malformed hint raises.

`HintError` carries the exact field path a client got wrong (`param`, e.g.
`agent_hint.context_management.edits[0].start`). The server turns it into an OpenAI-style
HTTP 400; `as_error_body()` builds that body so every caller renders it the same way.
"""

from __future__ import annotations


class HintError(ValueError):
    """A request's agent hint is malformed; `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def as_error_body(self) -> dict:
        """The OpenAI error envelope for an HTTP 400 reply."""
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param}}

    def __repr__(self) -> str:
        return f"HintError({self.message!r}, param={self.param!r})"
