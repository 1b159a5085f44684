"""Cutting generated text at the first stop string, without ever sending part of one.

Text arrives in pieces (one detokenized increment per engine step) and a stop string may
straddle pieces, so the matcher holds back the last `len(longest stop) - 1` characters until
it knows they cannot begin a stop string. Invariant: whatever `feed` has returned never
contains a stop string nor a prefix of one that a later piece could complete.

`min_tokens` (vLLM's rule, its detokenizer's `stop_check_offset`): the text of the first
`min_tokens` outputs is fed as `free`; a stop string must end past it (it may begin in its last
characters, as vLLM's search window allows).
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, text: str, free: str = "") -> str:
        """Add `free` text (the first `min_tokens` outputs': never matched on its own), then `text`;
        return what can be sent now. After a match, `stopped` is True."""
        if self.stopped:
            return ""
        # no stop string ends inside what was searched before or is free (a match there was found or is none)
        searched = len(self.pending) + len(free)
        self.pending += free + text
        cut = min((i for i in (self.pending.find(s, max(0, searched - len(s) + 1)) for s in self.stops)
                   if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        # A stop string that begins in what we send would end inside `pending`: it was not
        # found, so none begins before the last `hold` characters.
        keep = min(self.hold, len(self.pending))
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return out

    def flush(self) -> str:
        """The generation ended without a stop string: release what was held back."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
