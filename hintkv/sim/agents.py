"""The workload's agent programs (`hintkv.workload.agent`), carried out on the event clock.

    driver = ProgramDriver(cluster, hints=True, time_scale=1.0)     # one SimEngine or a SimCluster
    driver.start(workload_programs(workload, HintPlan(hints=True)))
    while clock.run_next(): ...
    driver.calls, driver.accesses                    # per call; the oracle's access sequence

The programs are the same the live replay and the offline replay run (same requests, same hints,
same order). Here a `Send` is a request to the `SimEngine` (placed by the cluster's router code; the
program resumes when it finishes),
a `Manage` applies at once through the engine's real SAM (the server's management path does not
queue behind inference), `Sleep` and `Run` are clock events (times / `time_scale`).

TTFT and end-to-end are measured from when the program sends (a prefetch just before counts
against the call, as for a live agent). Block hashes of a prompt are computed once per distinct
block with the cache's own `hash_blocks`, continued from the session's (or its parent's) previous
prompt: full-scale prompts are ~100K tokens, and re-hashing each from scratch would dominate.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from hintkv.cache.hashing import BlockHash, hash_blocks
from hintkv.engine.types import CacheEdit, RequestOutput, SessionRef
from hintkv.replay.offline import Access
from hintkv.sim.cluster import SimCluster
from hintkv.sim.engine import SimEngine
from hintkv.workload.agent import Manage, Program, Run, Send, Sleep
from hintkv.workload.traces.claude_code import common_prefix

TENANT = "sim"


@dataclass(slots=True)
class CallRecord:
    task_id: str
    session_id: str
    index: int
    sent_s: float
    prompt_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    # the prompt tokens it found cached at its FIRST admission (device, plus a lower tier's run then
    # loaded), as the server reports `cached_tokens`: not the tokens it did not compute (a preempted
    # call recomputes them), so no bound reads it as the call's hits (sim.oracles' own hits do)
    cached_tokens: int = 0
    output_tokens: int = 0
    instance: int = 0  # which simulated instance served it (the router's placement)
    ttft_parts: dict[str, float] | None = None  # the scheduler's split of its TTFT
    access: int = -1  # its index in the driver's `accesses` (send order; -1: none kept)


@dataclass(slots=True)
class _Memo:
    """A session's last prompt and its block hashes (to continue the chain)."""

    tokens: list[int] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    chunks: tuple = ()  # the prompt as the workload's chunks (shared between calls)


def _chunked(prompt) -> bool:
    return bool(prompt) and isinstance(prompt[0], (tuple, list))


def prompt_and_shared(old: _Memo, chunks) -> tuple[list[int], int]:
    """The prompt's token ids and how many of them it shares with the memo's last prompt.

    Chunked prompts are compared chunk by chunk (the workload shares chunk objects between calls:
    `is` settles most at once), token by token only from the first chunk that differs on
    (comparing ~100K-token lists whole was 16% of a full-scale simulation, cProfile); the shared
    chunks' tokens are one slice of the memo's list, only the rest is flattened (flattening each
    ~150K-token prompt whole was 4.7 ms a call, 4% of the loop)."""
    if not (_chunked(chunks) and _chunked(old.chunks)):
        prompt = flatten(chunks)
        return prompt, common_prefix(old.tokens, prompt)
    n = k = 0
    for a, b in zip(old.chunks, chunks):
        if a is not b and a != b:
            break
        n += len(a)
        k += 1
    # one slice, extended in place: `old[:n] + list(rest)` touched each shared token's refcount three
    # times (scattered int objects: 10.7% of a 20-task full-scale run under py-spy)
    prompt = old.tokens[:n]
    prompt.extend(itertools.chain.from_iterable(chunks[k:]))
    if k < len(old.chunks) and k < len(chunks):  # chunk boundaries may differ from here on
        return prompt, n + common_prefix(old.tokens[n:], prompt[n:])
    return prompt, n


def flatten(prompt) -> list[int]:
    if prompt and isinstance(prompt[0], (tuple, list)):
        return list(itertools.chain.from_iterable(prompt))
    return list(prompt)


class ProgramDriver:
    def __init__(self, cluster: SimCluster | SimEngine, hints: bool, time_scale: float = 1.0,
                 on_call: Callable[[CallRecord], None] | None = None, range_evicts: bool = True,
                 blocks: bool = True) -> None:
        """`blocks` False: no block hashes and no `accesses` (for an engine that reads neither:
        `sim.ideal.InstantEngine`; hashing was most of that replay's time at full scale)."""
        self.cluster = cluster if isinstance(cluster, SimCluster) else SimCluster([cluster])
        engine = self.cluster.engines[0]
        self.root = engine.root  # the same on every instance: content keys
        self.clock = engine.clock
        self.hints = hints
        self.time_scale = time_scale
        self.on_call = on_call
        self.range_evicts = range_evicts  # False: skip them (a study knob; the live driver sends them too)
        self.blocks = blocks
        self.calls: list[CallRecord] = []
        self.accesses: list[Access] = []  # in send order (FCFS admission follows it)
        self.num_edits = {"offload": 0, "prefetch": 0, "evict": 0}
        self._memos: dict[str, _Memo] = {}
        self._n = 0
        self._bs = engine.cfg.block_size
        self._running = 0

    @property
    def done(self) -> bool:
        return self._running == 0

    def start(self, program: Program, on_end: Callable[[], None] | None = None) -> None:
        self._running += 1

        def end() -> None:
            self._running -= 1
            if on_end is not None:
                on_end()

        self._advance(program, None, end)

    def _advance(self, prog: Program, value, on_end: Callable[[], None]) -> None:
        while True:
            try:
                eff = prog.send(value)
            except StopIteration:
                on_end()
                return
            if isinstance(eff, Manage):
                value = self._manage(eff)
                continue
            if isinstance(eff, Send):
                self._send(eff, lambda out: self._advance(prog, out, on_end))
            elif isinstance(eff, Sleep):
                self.clock.after(eff.seconds / self.time_scale, lambda: self._advance(prog, None, on_end))
            elif isinstance(eff, Run):
                self._run(eff, lambda: self._advance(prog, None, on_end))
            else:
                raise TypeError(f"unknown effect {eff!r}")
            return

    def _run(self, eff: Run, then: Callable[[], None]) -> None:
        left = [len(eff.children) + 1]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                then()

        for delay, child in eff.children:
            self.clock.after(delay / self.time_scale, lambda c=child: self.start(c, one))
        self.clock.after(eff.at_least_s / self.time_scale, one)

    def _ref(self, sid) -> SessionRef:
        return SessionRef(TENANT, sid.session_id, sid.parent_session_id)

    def _manage(self, eff: Manage):
        if not self.hints or (eff.token_start is not None and not self.range_evicts):
            return None
        self.num_edits[eff.action] += 1
        return self.cluster.manage(self._ref(eff.session), [CacheEdit(eff.action, eff.token_start)])

    def _send(self, eff: Send, then: Callable[[RequestOutput], None]) -> None:
        sid = eff.session.session_id
        memo = self._memos.get(sid)
        if memo is None:
            parent = self._memos.get(eff.session.parent_session_id)
            memo = self._memos[sid] = (_Memo(parent.tokens, parent.hashes, parent.chunks) if parent
                                       else _Memo())
        prompt, shared = prompt_and_shared(memo, eff.call.prompt)
        if self.blocks:
            hashes = self._hashes(prompt, shared, eff.call.prompt, memo)
        else:
            hashes, memo.tokens, memo.chunks = [], prompt, eff.call.prompt
        self._n += 1
        t0 = self.clock()
        rec = CallRecord(eff.task_id, sid, eff.index, t0, len(prompt))
        access = Access(hashes[:(len(prompt) - 1) // self._bs], len(prompt), [])
        if self.blocks:
            rec.access = len(self.accesses)
            self.accesses.append(access)

        def first(t: float) -> None:
            rec.ttft_s = t - t0

        def done(out: RequestOutput, written: list[BlockHash]) -> None:
            rec.e2e_s = self.clock() - t0
            rec.cached_tokens = out.num_cached_tokens
            rec.output_tokens = out.num_output_tokens
            if out.metrics is not None and out.metrics.ttft_parts is not None:
                rec.ttft_parts = out.metrics.ttft_parts.as_dict()
            access.written = written
            self.calls.append(rec)
            if self.on_call is not None:
                self.on_call(rec)
            then(out)

        ref = self._ref(eff.session)
        engine, backend = self.cluster.place(ref)  # every config is routed by session
        rec.instance = self.cluster.index[backend.url]

        def finished(out: RequestOutput, written: list[BlockHash]) -> None:
            self.cluster.finished(backend)
            done(out, written)

        engine.submit(f"r{self._n}", prompt, eff.call.max_tokens, ref if self.hints else None, first,
                      finished, block_hashes=list(hashes))

    def _hashes(self, prompt: list[int], shared: int, chunks, memo: _Memo) -> list[BlockHash]:
        """`shared`: tokens `prompt` shares with the memo's last prompt."""
        bs = self._bs
        same = min(shared, len(memo.hashes) * bs) // bs
        keep = memo.hashes[:same]
        keep.extend(hash_blocks(self.root, prompt, bs, start=same, parent=keep[-1] if keep else None))
        memo.tokens, memo.hashes, memo.chunks = prompt, keep, chunks
        return memo.hashes
