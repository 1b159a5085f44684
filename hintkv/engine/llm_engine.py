"""The synchronous engine: one `step()` reads top to bottom: schedule -> run -> update.

    sched = scheduler.schedule(unlocked)              # under the state lock (released
                                                      #   while a same-step load is waited for)
    runner_out = runner.run(sched.scheduled)          # the forward pass, lock released
    outputs = scheduler.update_from_output(sched, runner_out)   # under the state lock

The engine builds the parts (model + runner, the scheduler with its cache stack, the tiers) and
holds the state lock; all bookkeeping lives in the scheduler. Single-threaded by design: every
change to sequences, blocks and sessions happens on the thread that calls `step()` (the async
wrapper funnels requests onto it); `manage()` may come from any thread and takes the lock.

With `host_cache_memory` / `disk_cache_dir` set, a `TierStack` (host, disk) sits below the device
pool, linked by `cache.tier_connector.TierConnector`: evicted blocks a live session holds are
queued for write-down (flushed between scheduling and the forward pass, outside the lock),
prefixes found below are loaded instead of recomputed, and each schedule starts with the link's
housekeeping (landed prefetches, finished offloads, predicted resumes). `tier_stats()` reports it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

import torch

from hintkv.cache.hashing import namespace_root
from hintkv.cache.session_bounds import SessionBounds, SessionJanitor
from hintkv.cache.tier_connector import TierConnector
from hintkv.config import DEFAULT_MODEL, EngineConfig, parse_bytes
from hintkv.engine.cpu_keeper import CpuKeeper
from hintkv.engine.cpu_threads import engine_cpus
from hintkv.engine.model_runner import ModelRunner, kv_bytes_per_block
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.spec import make_speculative
from hintkv.engine.types import (
    CacheEdit,
    EditOutcome,
    EngineStats,
    GenerateRequest,
    RequestMetrics,
    RequestOutput,
    SessionDescription,
    SessionRef,
)
from hintkv.models.loader import LoadedModel, load_model
from hintkv.models.team_choice import ContentionGate
from hintkv.tiers.build import build_pool_tier, build_tier_stack
from hintkv.tiers.device import DeviceBlockIO

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def _check_shareable(loaded: LoadedModel, cfg: EngineConfig, dtype: torch.dtype, device: torch.device) -> None:
    """`LLMEngine(cfg, loaded=...)` shares only a model loaded for the same model, dtype, device and
    quantization, and never with an engine that compiles (compiling changes the shared model's step)."""
    want = {"model": cfg.model or DEFAULT_MODEL, "dtype": dtype, "device": device.type,
            "quantization": cfg.quantization}
    have = {"model": loaded.spec, "dtype": loaded.model.dtype, "device": loaded.model.device.type,
            "quantization": loaded.quantization}
    for key, value in want.items():
        if have[key] != value:
            raise ValueError(f"the loaded model's {key} is {have[key]}, the config asks {value}")
    if cfg.wants_compile(device.type):
        raise ValueError("a compiling engine does not share a loaded model (compile changes it for every engine)")


class LLMEngine:
    def __init__(self, cfg: EngineConfig, loaded: LoadedModel | None = None) -> None:
        """`loaded`: a model `load_model` already returned for this config's model, dtype, device
        and quantization, shared instead of loaded again (engines differing only in scheduling,
        one after another: the weights are only read; each engine has its own KV cache)."""
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        torch.manual_seed(cfg.seed)
        if loaded is None:
            loaded = load_model(cfg.model, self.dtype, self.device, seed=cfg.seed,
                                quantization=cfg.quantization)
        else:
            _check_shareable(loaded, cfg, self.dtype, self.device)
        if cfg.wants_compile(self.device.type):
            loaded.model.compile()  # warns and stays eager when no compiler is available
        # the most rows a step's LM head sees: one per running sequence, or a verify's rows
        loaded.model.warm_head(max(cfg.max_num_seqs, cfg.speculative_max_rows if cfg.speculative else 1))
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model_name = cfg.served_model_name or loaded.name
        # the KV namespace: the served name and what the K/V values depend on (the weights, the
        # kernels, the KV dtype), so a shared disk dir or pool never hands one engine another's KV
        self._kv_model = f"{self.model_name}|{loaded.weights_id}|kv={cfg.kv_cache_dtype or 'auto'}"
        self.block_size = cfg.block_size
        self.num_blocks = self._num_blocks()
        self.max_model_len = cfg.max_model_len or min(loaded.config.max_position_embeddings, 32768)
        eos = set(loaded.tokenizer.eos_token_ids) | set(loaded.config.eos_token_ids)
        self.scheduler = Scheduler.from_config(cfg, self.num_blocks, eos_token_ids=eos,
                                               max_model_len=self.max_model_len)
        self.scheduler.proposer = make_speculative(cfg)
        self.scheduler.spec_max_rows = cfg.speculative_max_rows
        sam = self.scheduler.sam
        self.janitor = None if sam is None else SessionJanitor(sam, SessionBounds(
            cfg.session_ended_grace, cfg.session_idle_expiry, cfg.max_sessions,
            cfg.max_sessions_per_tenant))
        # Held while scheduling and bookkeeping, not during the forward pass, so that management
        # requests apply within milliseconds even while a long prefill runs.
        self.lock = threading.Lock()
        self.runner = ModelRunner(loaded.model, loaded.config, self.num_blocks, cfg.block_size,
                                  self.dtype, self.device, cfg.kv_cache_dtype,
                                  self.max_model_len if cfg.wants_cuda_graphs(self.device.type) else None)
        self.runner.eos_token_ids = frozenset(eos)
        self._dtype_name = str(self.dtype).removeprefix("torch.")
        self.kv.tiers = self._build_tiers()
        # One contention gate of the engine thread (a CPU engine): ticked once a step, on this engine's thread, before
        # the forward (`step`); read by the decode team's chooser (the model's: handed over here, engine -> model; a
        # model shared by engines reads the last one's) and by the CPU keepers
        self.gate = ContentionGate.for_engine_thread() if self.device.type == "cpu" else None
        loaded.model.contention_gate = self.gate
        # HINTKV_CPU_KEEPER (auto, the default: not while the gate reads contended): idle-priority spinners keep the
        # CPUs out of idle during a forward
        self.keeper = CpuKeeper.build(self.device.type, engine_cpus(cfg.cpu_omp_threads_bind, self.device.type),
                                      self.gate)
        log.info("engine ready: model=%s device=%s dtype=%s kv=%s kv_blocks=%d (%d tokens)",
                 self.model_name, self.device, self._dtype_name, cfg.kv_cache_dtype, self.num_blocks,
                 self.num_kv_tokens)

    # The scheduler owns these; they are named here for callers that inspect a whole engine.
    @property
    def kv(self):
        return self.scheduler.kv

    @property
    def sam(self):
        return self.scheduler.sam

    @property
    def sessions(self):
        return self.scheduler.sessions

    @property
    def tiers(self) -> TierConnector | None:
        return self.scheduler.kv.tiers

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.scheduler.eos_token_ids

    def _num_blocks(self) -> int:
        if self.cfg.kv_cache_tokens is not None:
            return self.cfg.kv_cache_tokens // self.cfg.block_size
        per_block = kv_bytes_per_block(self.model_config, self.cfg.block_size, self.dtype,
                                       self.cfg.kv_cache_dtype)
        if self.cfg.kv_cache_memory is not None:
            budget = parse_bytes(self.cfg.kv_cache_memory)
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * 0.85)
        else:
            budget = 2**30
        n = budget // per_block
        if n < 1:
            raise ValueError("the KV cache memory does not hold a single block")
        return n

    def _build_tiers(self) -> TierConnector | None:
        cfg = self.cfg
        io = DeviceBlockIO(self.runner.kv_caches)
        pool = None if cfg.pool is None else build_pool_tier(
            io.layout, cfg.pool, cfg.pool_size, cfg.pool_policy, cfg.pool_dir, cfg.pool_master,
            cfg.pool_metadata, cfg.pool_timeout_s, write_through=cfg.pool_write_through)
        stack = build_tier_stack(io.layout, cfg.host_cache_memory, cfg.disk_cache_dir,
                                 cfg.disk_cache_size, reuse_disk=cfg.disk_cache_reuse,
                                 cuda=self.device.type == "cuda", pool=pool)
        if stack is None:
            return None
        log.info("KV tiers: %s", ", ".join(f"{n} {u.capacity_blocks} blocks"
                                            for n, u in stack.usage().items()))
        return TierConnector(self.kv.pool, self.block_size, stack, io, self.kv.ranking,
                             self.cfg.hints, offload_mode=self.cfg.offload_mode,
                             host_mode=self.cfg.host_mode)

    @property
    def num_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    # ---- requests ------------------------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        n = len(req.prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.max_model_len:
            raise ValueError(f"the prompt has {n} tokens; this model's context is {self.max_model_len}")
        if n + 1 > self.num_kv_tokens:
            raise ValueError(f"the prompt has {n} tokens; the whole KV cache holds {self.num_kv_tokens}")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def make_sequence(self, req: GenerateRequest) -> Sequence:
        """The engine's one way from a request to a `Sequence` (its KV namespace, its generator)."""
        gen = None
        if req.sampling.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(req.sampling.seed)
        root = namespace_root(self._kv_model, self._dtype_name, self.block_size, req.cache_salt)
        return Sequence(req.request_id, list(req.prompt_token_ids), len(req.prompt_token_ids),
                        req.sampling, root, session=req.session, generator=gen)

    def add_request(self, req: GenerateRequest) -> None:
        """Engine thread, between steps (the scheduler refuses one during a step's load wait)."""
        self.validate(req)
        seq = self.make_sequence(req)
        with self.lock:
            self.scheduler.add_request(seq)

    def abort_request(self, request_id: str) -> RequestMetrics | None:
        """Engine thread, between steps (the scheduler refuses one during a step's load wait); the
        request's figures so far, None if it is unknown."""
        with self.lock:
            return self.scheduler.abort_request(request_id)

    def request_ids(self) -> list[str]:
        """Requests not finished yet (engine thread)."""
        return list(self.scheduler.requests)

    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        """Apply Agent Hint edits for a session (any thread; takes the state lock briefly)."""
        with self.lock:
            return self.scheduler.manage(ref, edits)

    def reset_prefix_cache(self) -> int:
        """Drop every cached device block no running request uses (any thread; vLLM's `LLM.reset_prefix_cache`,
        which returns a bool: here the number of blocks dropped). Lower tiers keep their copies."""
        with self.lock:
            return self.scheduler.kv.reset_prefix_cache()

    def sweep_sessions(self) -> int:
        """Forget ended, idle and over-cap sessions (any thread; takes the state lock briefly)."""
        if self.janitor is None:
            return 0
        with self.lock:
            return self.janitor.sweep(time.monotonic())

    def describe_session(self, tenant: str, session_id: str) -> SessionDescription | None:
        with self.lock:
            return self.scheduler.describe_session(tenant, session_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def idle_tick(self) -> None:
        """What an idle engine still owes between steps: the shared pool's keep-alive of every live session's blocks
        (`SPM.tick`, due each KEEPALIVE_EVERY_S; otherwise it runs only inside a step's `schedule`). An agent's tool
        call leaves its instance idle for seconds to minutes; without this, the pool lease of what the waiting
        session holds there lapsed after 5 s and another instance's release removed it (review rev_rev28_a A4)."""
        tiers = self.scheduler.kv.tiers
        if tiers is not None and tiers.spm is not None:
            with self.lock:
                tiers.spm.tick(self.scheduler.clock())

    def stats(self) -> EngineStats:
        """Scheduler and pool figures for /metrics (any thread: plain counters, read unlocked)."""
        s, kv = self.scheduler, self.scheduler.kv
        return EngineStats(len(s.running), len(s.waiting), s.num_preemptions, kv.pool.num_blocks,
                           kv.pool.num_in_use, kv.pool.num_cached_free, kv.prefix_query_tokens,
                           kv.prefix_hit_tokens)

    def tier_stats(self) -> dict:
        """KV tier counters for /metrics (any thread). Shape:

            {"enabled": bool,
             "hit_tokens": {"device": n, "host": n, "disk": n},  # first admissions
             "prompt_tokens": n, "prompt_tokens_computed": n,   # computed incl. recomputes
             "tiers": {"host"|"disk": {"num_blocks", "capacity_blocks", "bytes_used", "puts",
                       "put_failed", "hits", "misses", "corrupt", "io_errors", "evicted",
                       "removed"}},
             "bytes_moved": {"device->host": n, "host->disk": n, "disk->host": n,
                             "host->device": n, ...}, "blocks_moved": {same keys},
             "load_wait_s": s, "loaded_bytes": n, "load_s": s, "num_written_down", "num_offload_dropped", "num_loaded",
             "num_prefetched", "num_predicted_prefetches", "num_load_failed",
             "num_load_timeouts", "num_corrupt", "num_io_errors", "num_cascaded",
             "num_dropped", "costs": {"prefill_s_per_token", "bandwidth_<tier>_bytes_per_s"}}

        Without tiers only enabled, hit_tokens and the prompt token counts are present.
        """
        with self.lock:
            out = {"enabled": self.tiers is not None,
                   "hit_tokens": dict(self.kv.hit_tokens_by_tier),
                   "prompt_tokens": self.scheduler.num_prompt_tokens,
                   "prompt_tokens_computed": self.scheduler.num_prompt_tokens_computed}
            if self.tiers is not None:
                out.update(self.tiers.stats())
            return out

    def close(self) -> None:
        """Finish in-flight tier I/O and stop the mover threads (blocks on disk are kept)."""
        if self.tiers is not None:
            self.tiers.close()

    # ---- the step --------------------------------------------------------------------------
    @contextmanager
    def _unlocked(self):
        """The state lock released for a wait inside the step (a same-step load: `Scheduler`)."""
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()

    def step(self) -> list[RequestOutput]:
        with self.lock:  # a same-step load wait inside releases it (`_unlocked`)
            sched = self.scheduler.schedule(self._unlocked)
            pending = [] if sched.scheduled else self.scheduler.pending_loads()
        if sched.scheduled:
            self.kv.flush_write_downs()  # victims reused by this pass are written down first
            self.scheduler.check_flushed(sched)  # (checked here, before the forward writes them)
            if self.gate is not None:
                self.gate.tick()
            t0 = time.perf_counter()
            if self.keeper is None:
                runner_out = self.runner.run(sched.scheduled)
            else:
                with self.keeper.step():
                    runner_out = self.runner.run(sched.scheduled)
            runner_out.forward_s = time.perf_counter() - t0
        else:
            runner_out = ModelRunnerOutput()
            # only loads to wait for: block briefly instead of spinning
            self.scheduler.wait_for_loads(pending, 0.05)
        with self.lock:
            return self.scheduler.update_from_output(sched, runner_out)

    def check_integrity(self) -> None:
        with self.lock:
            self.scheduler.check_integrity()
            if self.janitor is not None:
                self.janitor.check_integrity()
