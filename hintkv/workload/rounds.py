"""A workload's round copies: the same swarm again, a distinct conversation to every prefix cache.

    wl_r = workload_round(wl, r)     # r = 0: `wl` itself

Interleaved measurement (`hintkv bench swarm`'s rounds) replays one workload several times on
each server, which stays up between rounds. Replaying the same token ids again would hit what
the previous round left cached; copy r > 0 therefore maps every token id through the bijection
`t -> (t + r * STRIDE) % vocab` and suffixes every session and task id with `.r{r}`. Prompt
lengths, shared prefixes (two equal chunks stay equal, two different ones stay different), output
lengths, tool times, sub-agents and start times are exactly the original's, so every round is
equally contended; only which blocks it names differs (block hashes chain over token ids, so no
block of one round is a block of another).
"""

from __future__ import annotations

from hintkv.workload.program import AgentScript, Call, Spawn, Task, User, Workload

STRIDE = 7919  # a prime: the shift of round r, times r, stays distinct modulo any common vocab


def workload_round(wl: Workload, r: int, vocab: int = 49152) -> Workload:
    """Round `r`'s copy of `wl` (every token id < `vocab`)."""
    if r == 0:
        return wl
    shift = (r * STRIDE) % vocab
    if shift == 0:
        raise ValueError(f"round {r} maps vocab {vocab} onto itself; pick another round count")
    chunks: dict[int, tuple[int, ...]] = {}  # chunks are shared between calls: map each once
    suffix = f".r{r}"

    def chunk(c: tuple[int, ...]) -> tuple[int, ...]:
        out = chunks.get(id(c))
        if out is None:
            out = chunks[id(c)] = tuple((t + shift) % vocab for t in c)
        return out

    def call(c: Call) -> Call:
        return Call(tuple(chunk(x) for x in c.prompt), c.max_tokens, c.wait_s,
                    tuple(Spawn(s.delay_s, agent(s.agent)) for s in c.spawns), c.stale_from, c.tool)

    def agent(a: AgentScript) -> AgentScript:
        return AgentScript(a.session_id + suffix, tuple(call(c) for c in a.calls))

    users = tuple(User(u.user_id, u.start_s, tuple(Task(t.task_id + suffix, t.source, agent(t.root)) for t in u.tasks))
                  for u in wl.users)
    return Workload(wl.name, users, {**wl.meta, "round": r})
