"""Map a messages/tools range edit to the token positions whose KV it makes stale.

A range edit names items of the OLD context window (the messages and tools as they were before
the agent compressed or edited them): `start` is the first changed item, and the client always
sends the old end. The KV of a token depends on every token before it, so once item `start`
changed, the KV of its first token and of every token after it, to the end of the old window, no
longer matches any prompt the agent will send again:

    old render: | unchanged prefix ............ | item start ... old end |
                | still valid KV                | stale KV               |
                0                     stale_token_start            len(old render)

Where does item `start` begin in tokens? Not at a fixed offset: the chat template wraps items
(role headers, tool sections) and a byte-level BPE may merge across an item boundary. So we
render twice with the same template -- the whole old window, and the old window with the
changed items removed -- and take the longest common token prefix. Every position inside that
prefix holds the same token after the same prefix in both renders, hence the same KV, so it
stays valid; the first differing position is where staleness begins.

`render` should render the window as it sits in the session's KV: with the chat template but
WITHOUT a generation prompt. With one, the removed-items render ends in an assistant header,
and when item `start` is itself an assistant turn the common prefix runs on over that header:
those few tokens stay valid only if the agent's new window continues with an assistant turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hintkv.protocol.agent_hint import Edit

# render(messages, tools) -> token ids of that window, rendered with the model's chat template
# (no generation prompt; see above).
Render = Callable[[list[dict], list[dict] | None], list[int]]


def stale_token_start(
    render: Render,
    messages: list[dict],
    tools: list[dict] | None,
    edit_messages_start: int | None,
    edit_tools_start: int | None,
) -> int:
    """First token position of the old window whose KV is stale after the given edits.

    `messages`/`tools` are the old window as sent; items from `edit_messages_start` (messages)
    and from `edit_tools_start` (tools) changed. With neither set nothing is stale and the
    result is the length of the old render.
    """
    old = render(messages, tools)
    if edit_messages_start is None and edit_tools_start is None:
        return len(old)
    kept_messages = messages if edit_messages_start is None else messages[:edit_messages_start]
    kept_tools = tools
    if edit_tools_start is not None and tools is not None:
        # A window with no tools is sent without a tools field, so render it as None.
        kept_tools = tools[:edit_tools_start] or None
    return common_prefix_length(old, render(kept_messages, kept_tools))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading positions where the two token sequences agree."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def range_starts(edits: Sequence[Edit]) -> tuple[int | None, int | None]:
    """The earliest changed message and tool among range edits: the arguments stale_token_start takes."""
    message_starts = [e.start for e in edits if e.target == "messages"]
    tool_starts = [e.start for e in edits if e.target == "tools"]
    return (min(message_starts, default=None), min(tool_starts, default=None))
