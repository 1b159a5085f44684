"""The offline replay: a workload's agent programs through the real cache code, no model.

    result = replay_offline(workload, OfflineConfig(policy="sam", hints=True, device_blocks=800,
                                                    host_blocks=3200))
    result.hit_rate, result.accesses       # accesses: the block sequence the oracle replays

What is real: `KVCacheManager` (prefix match, ask-then-act admission, commit, free), the
`BlockPool` with its class ranking and the eviction policy by name (`lru`, `sam`, `qlru`), the
`SessionRegistry` and `SessionAwareManager` applying the same hints the live replay sends, all
on a virtual clock (`hintkv.replay.events`). Under `qlru` (hints off) each queued request is a
transient session holding its prompt's hashes, ended at admission (see `policies.qlru`). What is modelled: the model (a request's blocks are committed when it
finishes; its completion is placeholder tokens no prompt contains, as in the live replay), the
engine's time (one FCFS prefill server at `prefill_s_per_token` per new token, `load_s_per_block`
per block read from the host tier, then decode in parallel at `decode_s_per_token`), and the host
tier's bookkeeping (`hintkv.replay.host`). A request holds its blocks from admission to its end;
one that cannot get them waits in the queue (FCFS), as in the engine.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry, session_key
from hintkv.cache.types import HOST_MODES, OFFLOAD_MODES, CacheEdit, SessionRef
from hintkv.engine.admission import StepPlan, make_admission
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.replay.events import EventLoop
from hintkv.replay.host import HostBookkeeping
from hintkv.workload.agent import HintPlan, Manage, Send, workload_programs
from hintkv.workload.program import Workload

TENANT = "replay"


@dataclass(frozen=True, slots=True)
class OfflineConfig:
    policy: str = "lru"
    hints: bool = False
    device_blocks: int = 1024
    host_blocks: int = 0
    block_size: int = 16
    time_scale: float = 1.0
    prefill_s_per_token: float = 2e-4  # engine time model (defaults: dummy:tiny on 2 CPU cores)
    decode_s_per_token: float = 0.02
    load_s_per_block: float = 2e-4
    offload_after_s: float = 2.0
    scheduling: str = "fcfs"  # the engine's admission policy by name (`hintkv.engine.admission`)
    # what an offload hint does with a host tier: `eager` writes the blocks down and drops the
    # device copies; `lazy` (the live engine's default) writes them down and keeps the copies;
    # `deferred` writes nothing: the session sinks in the ranking and its blocks are written down
    # only if the device evicts them (the host then holds only what the device could not)
    offload_mode: str = "eager"
    # `inclusive`: a block loaded back from the host stays there too (as the live tiers do);
    # `exclusive`: it leaves the host when it lands on the device (a held block is written down
    # again if the device evicts it): the host holds only what the device does not
    host_mode: str = "inclusive"

    def __post_init__(self) -> None:
        if self.device_blocks < 1 or self.host_blocks < 0:
            raise ValueError("device_blocks must be >= 1 and host_blocks >= 0")
        if self.host_mode not in HOST_MODES:
            raise ValueError(f"host_mode must be one of {HOST_MODES}, got {self.host_mode!r}")
        if self.offload_mode not in OFFLOAD_MODES:
            raise ValueError(f"offload_mode must be one of {OFFLOAD_MODES}, got {self.offload_mode!r}")


@dataclass(slots=True)
class CallStat:
    task_id: str
    session_id: str
    index: int
    sent_s: float
    prompt_tokens: int
    hit_tokens: int  # device hits + blocks loaded from the host tier
    host_tokens: int  # of which from the host tier
    ttft_s: float = 0.0  # modelled: queue + prefill (+ loads)
    e2e_s: float = 0.0


@dataclass(slots=True)
class Access:
    """One admitted request as the oracle sees it: the prompt's full blocks (hits are their leading
    run), then the blocks the request writes (its prompt's and completion's full blocks)."""

    prompt: list[bytes]
    prompt_tokens: int
    written: list[bytes]
    ended_before: int = -1  # how many requests had been admitted when this one ended (-1: never ran)
    admitted_s: float = 0.0  # virtual time of its admission (the eviction audit's clock)
    session_id: str = ""  # the session that sent it (the eviction audit: who reads a block next)
    # device blocks the engine held for it while it ran: its prompt's and completion's full blocks
    # and the partial last one (0: just the blocks above, `belady_pinned` counts no more)
    footprint: int = 0


@dataclass(slots=True)
class OfflineResult:
    config: OfflineConfig
    calls: list[CallStat] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    task_s: dict[str, float] = field(default_factory=dict)  # task -> end-to-end seconds
    host_samples: list[tuple[float, int]] = field(default_factory=list)  # (time, host blocks)
    device_held_samples: list[tuple[float, int]] = field(default_factory=list)  # (time, blocks held by live sessions)
    peak_held_blocks: int = 0  # distinct blocks held by live sessions or running requests, at peak
    host_written: int = 0
    host_loaded: int = 0
    num_unservable: int = 0  # requests larger than the device pool (skipped)
    end_s: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def hit_tokens(self) -> int:
        return sum(c.hit_tokens for c in self.calls)

    @property
    def host_hit_tokens(self) -> int:
        return sum(c.host_tokens for c in self.calls)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def peak_host_blocks(self) -> int:
        return max((n for _, n in self.host_samples), default=0)

    @property
    def mean_host_blocks(self) -> float:
        return _time_mean(self.host_samples, self.end_s)


def _time_mean(samples: list[tuple[float, int]], end: float) -> float:
    if not samples or end <= samples[0][0]:
        return float(samples[-1][1]) if samples else 0.0
    total = 0.0
    for (t0, n), (t1, _) in itertools.pairwise([*samples, (end, 0)]):
        total += n * (t1 - t0)
    return total / (end - samples[0][0])


class _Pending:
    __slots__ = ("done", "send", "seq", "stat")

    def __init__(self, send: Send, seq: Sequence, stat: CallStat, done) -> None:
        self.send, self.seq, self.stat, self.done = send, seq, stat, done


class OfflineEngine:
    """The cache side of an engine, driven by the event loop's `Send`s and `Manage`s."""

    def __init__(self, cfg: OfflineConfig, loop: EventLoop, hash_memo: dict | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        self.sessions = SessionRegistry()
        clock = lambda: loop.now
        self.policy = make_policy(cfg.policy, sessions=self.sessions)
        self.kv = KVCacheManager(cfg.device_blocks, cfg.block_size, self.policy)
        self.kv.ranking.clock = clock
        self.sam = SessionAwareManager(self.kv, self.sessions, clock)
        self.queue_sessions = cfg.policy == "qlru" and not cfg.hints
        self.host = None
        if cfg.host_blocks:
            keep = self.sessions.is_held if cfg.hints else (lambda h: True)
            self.host = HostBookkeeping(cfg.host_blocks, self.kv.ranking.block_class, keep)
            self.kv.pool.on_evict = lambda victims: self.host.put([b.hash for b in victims])
        self.root = namespace_root("offline", "none", cfg.block_size, None)
        self.result = OfflineResult(cfg)
        self._queue: deque[_Pending] = deque()
        self.admission = make_admission(cfg.scheduling)
        if self.host is not None and hasattr(self.admission, "held_below"):
            self.admission.held_below = self._host_run
        if hasattr(self.admission, "prefill_s_per_token"):  # the engine's time model (admission_serial)
            self.admission.prefill_s_per_token = cfg.prefill_s_per_token
        self._prefill_free_at = 0.0
        self._wakes: set[float] = set()  # when a look at the queue is due (prefill free, a hold lapses)
        self._ids = itertools.count()
        self._hash_memo = hash_memo if hash_memo is not None else {}
        self._running: dict[str, Sequence] = {}
        self._task_start: dict[str, float] = {}

    # ---- requests --------------------------------------------------------------------------
    def send(self, loop: EventLoop, send: Send, done) -> None:
        call = send.call
        self._task_start.setdefault(send.task_id, loop.now)
        rid = f"r{next(self._ids)}"
        ref = SessionRef(TENANT, send.session.session_id, send.session.parent_session_id)
        seq = Sequence(rid, call.prompt_ids(), call.num_prompt_tokens, SamplingParams(max_tokens=call.max_tokens),
                       self.root, session=ref)
        key = id(call)
        memo = self._hash_memo.get(key)
        if memo is None:
            memo = self._hash_memo[key] = hash_blocks(self.root, seq.token_ids, self.cfg.block_size)
        seq.block_hashes = list(memo)
        self.sam.on_step(loop.now)
        if self.cfg.hints:
            seq.session_key = self.sam.on_arrival(ref)
        elif self.queue_sessions:  # qlru: the queued prompt as a transient session
            q = SessionRef(TENANT, f"queued:{rid}", f"queued:{rid}")
            self.sam.on_done(self.sam.on_arrival(q), seq.block_hashes[:(seq.num_tokens - 1) // self.cfg.block_size])
        stat = CallStat(send.task_id, ref.session_id, send.index, loop.now, call.num_prompt_tokens, 0, 0)
        self._queue.append(_Pending(send, seq, stat, done))
        self._admit()

    def _admit(self) -> None:
        """Admit the queue's head when the prefill server is free (the engine matches a prompt
        when it schedules it, so it sees what the prefills before it committed)."""
        bs = self.cfg.block_size
        while self._queue:
            if self.loop.now < self._prefill_free_at:
                self._wake(self._prefill_free_at)
                return
            picked = self._pick()
            if picked is None:  # the admission holds every candidate for a returner: look again
                self._wake(max(self.admission.held_until, self.loop.now) + 1e-6)  # when the hold lapses
                return
            p, match = picked
            seq = p.seq
            hashes = seq.block_hashes[:(seq.num_tokens - 1) // bs]
            n_dev = len(match.blocks)
            n_host = 0
            if self.host is not None:
                n_host = self._host_run(hashes[n_dev:])
            new = seq.num_prompt_tokens - match.num_tokens + p.send.call.max_tokens
            if not self.kv.can_admit(seq, match, new):
                if not self._running:  # nothing will ever free room: the request cannot fit;
                    self._queue.remove(p)  # counted as a full miss
                    if self.queue_sessions:
                        self.sessions.end(session_key(TENANT, f"queued:{seq.request_id}"))
                    self.result.num_unservable += 1
                    self.result.calls.append(p.stat)
                    self.result.accesses.append(Access([], seq.num_prompt_tokens, [], -1, self.loop.now,
                                                        p.stat.session_id))  # no hits
                    p.done(p.stat)
                    continue
                return
            self._queue.remove(p)
            self.admission.forget(seq.request_id)
            if self.queue_sessions:
                self.sessions.end(session_key(TENANT, f"queued:{seq.request_id}"))
            self.kv.admit(seq, match, new)
            landed = 0
            for i in range(n_dev, n_dev + n_host):  # the host run lands (loads are timed below);
                if hashes[i] not in self.host:  # one the allocation just pushed out is recomputed
                    break
                self.kv.pool.register(seq.block_table[i], hashes[i])
                self._landed(hashes[i])
                landed += 1
            n_host = landed
            seq.num_registered_blocks = n_dev + n_host
            hit = (n_dev + n_host) * bs
            seq.num_computed_tokens = hit
            self.result.host_loaded += n_host
            p.stat.hit_tokens, p.stat.host_tokens = hit, n_host * bs
            self.result.accesses.append(Access(hashes, seq.num_prompt_tokens, [], -1, self.loop.now, p.stat.session_id,
                                               len(seq.block_table)))
            self._running[seq.request_id] = seq
            start = self.loop.now
            prefill = (seq.num_prompt_tokens - hit) * self.cfg.prefill_s_per_token + n_host * self.cfg.load_s_per_block
            self._prefill_free_at = start + prefill
            p.stat.ttft_s = start + prefill - p.stat.sent_s
            end = start + prefill + p.send.call.max_tokens * self.cfg.decode_s_per_token
            self.loop.at(start + prefill, lambda seq=seq: self._prefilled(seq))
            self.loop.at(end, lambda p=p, a=self.result.accesses[-1]: self._finish(p, a))

    def _pick(self):
        """The next request to admit, as the engine's admission policy orders the queue: the
        first candidate whose blocks fit (skipping past ones that do not, where the policy
        allows), else the first candidate (it waits for room)."""
        by_seq = {id(p.seq): p for p in self._queue}
        plan = StepPlan()
        first = None
        for seq in self.admission.order([p.seq for p in self._queue], self.kv):
            p = by_seq[id(seq)]
            match = self.kv.match_prefix(seq)
            first = first or (p, match)
            if self.admission.room(seq, match, self.kv, plan):
                self.admission.admitted(seq, plan)
                return p, match
            if not self.admission.skipped(seq, match, plan):
                return p, match
        if getattr(self.admission, "held_until", None) is not None:
            return None  # no room without a returner's blocks (`engine.admission_serial`): wait
        return first

    def _wake(self, t: float) -> None:
        """Look at the queue again at `t`, unless a look is already due by then (it schedules the
        next one itself): a hold's lapse and the prefill server's release each get their look."""
        if not self._wakes or min(self._wakes) > t:
            self._wakes.add(t)
            self.loop.at(t, lambda: self._woke(t))

    def _woke(self, t: float) -> None:
        self._wakes.discard(t)
        self._admit()

    def _prefilled(self, seq: Sequence) -> None:
        """The prompt's KV is computed: its full blocks join the prefix index (as the engine's
        commit after each prefill chunk does), so later prompts can match them."""
        if seq.request_id in self._running:
            seq.num_computed_tokens = max(seq.num_computed_tokens, seq.num_prompt_tokens)
            self.kv.commit(seq)

    def _finish(self, p: _Pending, access: Access) -> None:
        self.sam.on_step(self.loop.now)
        access.ended_before = len(self.result.accesses)  # its blocks were pinned until here
        seq = p.seq
        base = -(1 + int(seq.request_id[1:]) * 1_000_003)
        seq.token_ids.extend(range(base, base - p.send.call.max_tokens, -1))  # tokens no prompt has
        seq.num_computed_tokens = seq.num_tokens
        self.kv.commit(seq)
        written = seq.block_hashes[:seq.num_tokens // self.cfg.block_size]
        access.written = list(written)
        self.kv.free(seq)
        del self._running[seq.request_id]
        if self.cfg.hints and seq.session_key is not None:
            before = set(self.sessions.sessions[seq.session_key].held) if self.host is not None else ()
            self.sam.on_done(seq.session_key, list(written))
            if self.host is not None:  # the previous context's blocks nobody holds leave the host
                self.host.remove([h for h in before if not self.sessions.is_held(h)])
        p.stat.e2e_s = self.loop.now - p.stat.sent_s
        self.result.calls.append(p.stat)
        self.result.task_s[p.send.task_id] = self.loop.now - self._task_start[p.send.task_id]
        self._sample()
        p.done(p.stat)
        self._admit()

    # ---- hints -----------------------------------------------------------------------------
    def manage(self, loop: EventLoop, m: Manage) -> None:
        self.sam.on_step(loop.now)
        ref = SessionRef(TENANT, m.session.session_id, m.session.parent_session_id)
        key = session_key(TENANT, ref.session_id)
        s = self.sessions.sessions.get(key)
        if s is None:
            return
        if m.action == "evict":
            before = set(self.sessions.holders)
            self.sam.apply(ref, CacheEdit("evict", m.token_start))
            if self.host is not None:
                self.host.remove([h for h in before if h not in self.sessions.holders])
        elif m.action == "offload":
            self.sam.apply(ref, CacheEdit("offload"))
            if self.host is not None and self.cfg.offload_mode != "deferred":  # write the blocks down
                pool = self.kv.pool
                on_device = [h for h in s.held if pool.lookup(h) is not None]
                self.host.put(on_device, force=True)
                if self.cfg.offload_mode == "lazy":
                    self._sample()
                    return
                # from the tail, while the host kept them and no other session holds them: a head
                # dropped under a tail that the (full) host did not keep would cut the chain a
                # resume matches, and a shared prefix stays where its other holders need it
                for h in reversed(on_device):
                    if h not in self.host or self.sessions.holders.get(h, set()) - {key}:
                        break
                    pool.drop(pool.lookup(h))
        else:
            self.sam.apply(ref, CacheEdit("prefetch"))
            if self.host is not None:
                self._prefetch(s.held)
        self._sample()

    def _prefetch(self, held: list[bytes]) -> None:
        """Load the session's leading host run into room running sessions do not need."""
        pool = self.kv.pool
        run = []
        for h in held:
            if pool.lookup(h) is not None:
                continue
            if h not in self.host:
                break
            run.append(h)
        if not run:
            return
        room = pool.num_free - pool.num_cached_free + pool.num_cached_below(self.policy.protected_class)
        run = run[:room]
        if not run:
            return
        blocks = pool.allocate(len(run))
        for b, h in zip(blocks, run):
            pool.register(b, h)
            self._landed(h)
        pool.release(blocks)
        self.result.host_loaded += len(run)

    def _host_run(self, hashes: list[bytes]) -> int:
        """How many of `hashes`, from the first, the host tier holds."""
        n = 0
        while n < len(hashes) and hashes[n] in self.host:
            n += 1
        return n

    def _landed(self, h: bytes) -> None:
        """A host block was read into the device: an exclusive host lets go of it."""
        self.host.touch(h)
        if self.cfg.host_mode == "exclusive":
            self.host.remove([h])

    # ---- bookkeeping -----------------------------------------------------------------------
    def _sample(self) -> None:
        now = self.loop.now
        held = len(self.sessions.holders) + sum(len(s.block_table) for s in self._running.values())
        r = self.result
        r.peak_held_blocks = max(r.peak_held_blocks, held)
        if self.host is not None:
            r.host_samples.append((now, len(self.host)))
            r.host_written = self.host.num_written

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        self.sessions.check_integrity()


def replay_offline(workload: Workload, cfg: OfflineConfig, hash_memo: dict | None = None,
                   check_every: int = 0, observe=None) -> OfflineResult:
    """Run `workload` to the end under `cfg`; `hash_memo` (call -> block hashes) may be shared
    between runs of one workload to skip re-hashing. `observe(engine)`, if given, is called once
    the engine is built (the eviction audit hooks the pool there; it must change nothing)."""
    loop = EventLoop(cfg.time_scale)
    engine = OfflineEngine(cfg, loop, hash_memo)
    if observe is not None:
        observe(engine)
    plan = HintPlan(hints=cfg.hints, offload_after_s=cfg.offload_after_s)
    loop.start(workload_programs(workload, plan), engine.send, engine.manage)
    if check_every:
        n = 0
        while loop._heap:
            loop.run(until=loop._heap[0][0])
            n += 1
            if n % check_every == 0:
                engine.check_integrity()
    else:
        loop.run()
    engine.check_integrity()
    engine.result.end_s = loop.now
    return engine.result
