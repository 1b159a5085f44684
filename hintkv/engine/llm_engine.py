"""The synchronous engine: one `step()` reads top to bottom: schedule -> run -> postprocess.

Single-threaded by design: every change to sequences, blocks and sessions happens on the thread
that calls `step()` (the async wrapper funnels requests and management calls onto it).

With `host_cache_memory` / `disk_cache_dir` set, a `TierStack` (host, disk) sits below the device
pool, linked by `cache.tier_connector.TierConnector`: evicted blocks a live session holds are written down,
prefixes found below are loaded instead of recomputed, and each step starts with the link's
housekeeping (landed prefetches, finished offloads, predicted resumes). `tier_stats()` reports it.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.config import EngineConfig, parse_bytes
from hintkv.engine.model_runner import ModelRunner, kv_bytes_per_block
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import (
    CacheEdit,
    EditOutcome,
    GenerateRequest,
    RequestOutput,
    SessionRef,
)
from hintkv.models.loader import load_model
from hintkv.tiers.build import build_tier_stack
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


class LLMEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        torch.manual_seed(cfg.seed)
        loaded = load_model(cfg.model, self.dtype, self.device, seed=cfg.seed)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model_name = cfg.served_model_name or loaded.name
        self.block_size = cfg.block_size
        self.num_blocks = self._num_blocks()
        self.max_model_len = cfg.max_model_len or min(loaded.config.max_position_embeddings, 32768)
        self.eos_token_ids = set(loaded.tokenizer.eos_token_ids) | set(loaded.config.eos_token_ids)
        self.sessions = SessionRegistry(protect_budget_blocks=int(cfg.protect_budget * self.num_blocks))
        policy = make_policy(cfg.eviction_policy, sessions=self.sessions)
        self.kv = KVCacheManager(self.num_blocks, cfg.block_size, policy)
        self.sam = SessionAwareManager(self.kv, self.sessions)
        self.sam.predict_resume = cfg.hints
        # Held while scheduling and bookkeeping, not during the forward pass, so that management
        # requests apply within milliseconds even while a long prefill runs.
        self.lock = threading.Lock()
        self.scheduler = Scheduler(self.kv, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        self.runner = ModelRunner(loaded.model, loaded.config, self.num_blocks, cfg.block_size,
                                  self.dtype, self.device)
        self._seqs: dict[str, Sequence] = {}
        self._dtype_name = str(self.dtype).removeprefix("torch.")
        self.num_prompt_tokens = 0  # prompt tokens of admitted requests
        self.num_prompt_tokens_computed = 0  # prompt tokens run through the model (incl. recomputes)
        self.tiers = self._build_tiers()
        self.kv.tiers = self.tiers
        log.info("engine ready: model=%s device=%s dtype=%s kv_blocks=%d (%d tokens)",
                 self.model_name, self.device, self._dtype_name, self.num_blocks, self.num_kv_tokens)

    def _num_blocks(self) -> int:
        if self.cfg.kv_cache_tokens is not None:
            return self.cfg.kv_cache_tokens // self.cfg.block_size
        per_block = kv_bytes_per_block(self.model_config, self.cfg.block_size, self.dtype)
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
        stack = build_tier_stack(io.layout, cfg.host_cache_memory, cfg.disk_cache_dir,
                                 cfg.disk_cache_size, reuse_disk=cfg.disk_cache_reuse,
                                 cuda=self.device.type == "cuda")
        if stack is None:
            return None
        log.info("KV tiers: %s", ", ".join(f"{n} {u.capacity_blocks} blocks"
                                            for n, u in stack.usage().items()))
        return TierConnector(self.kv.pool, self.block_size, stack, io, self.kv.ranking,
                             self.cfg.hints)

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

    def add_request(self, req: GenerateRequest) -> None:
        self.validate(req)
        if req.request_id in self._seqs:
            raise ValueError(f"request id {req.request_id!r} is already running")
        gen = None
        if req.sampling.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(req.sampling.seed)
        root = namespace_root(self.model_name, self._dtype_name, self.block_size, req.cache_salt)
        seq = Sequence(req.request_id, list(req.prompt_token_ids), len(req.prompt_token_ids),
                       req.sampling, root, session=req.session, generator=gen)
        with self.lock:
            if req.session is not None and self.cfg.hints:
                seq.session_key = self.sam.on_arrival(req.session, req.session.tool)
            self._seqs[seq.request_id] = seq
            self.scheduler.add(seq)
            self.num_prompt_tokens += seq.num_prompt_tokens

    def abort_request(self, request_id: str) -> bool:
        with self.lock:
            seq = self._seqs.pop(request_id, None)
            if seq is None:
                return False
            self._release(seq)
            return True

    def _release(self, seq: Sequence) -> None:
        """A sequence leaves the engine: its session now holds its blocks; its refs are dropped."""
        if seq.session_key is not None:
            self.sam.on_done(seq.session_key, seq.block_hashes[:seq.num_computed_tokens // self.block_size])
        self.scheduler.remove(seq)

    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        """Apply Agent Hint edits for a session (any thread; takes the state lock briefly)."""
        if not self.cfg.hints:
            return [EditOutcome("none", notes=["hints are ignored by this server (--ignore-hints)"])
                    for _ in edits]
        with self.lock:
            return [self.sam.apply(ref, e) for e in edits]

    def describe_session(self, tenant: str, session_id: str) -> dict | None:
        with self.lock:
            return self.sam.describe(tenant, session_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

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
                   "prompt_tokens": self.num_prompt_tokens,
                   "prompt_tokens_computed": self.num_prompt_tokens_computed}
            if self.tiers is not None:
                out.update(self.tiers.stats())
            return out

    def close(self) -> None:
        """Finish in-flight tier I/O and stop the mover threads (blocks on disk are kept)."""
        if self.tiers is not None:
            self.tiers.close()

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with self.lock:
            self.sam.on_step(time.monotonic())  # re-rank by the clock; predicted resumes
            if self.tiers is not None:
                self.tiers.poll()  # publish class changes to the tiers; land prefetches
            sched = self.scheduler.schedule()
            outputs = [self._finish(seq, "length") for seq in sched.out_of_room]
            pending = self.tiers.pending_futures() if self.tiers is not None and not sched.scheduled else []
        if not sched.scheduled:
            if pending:  # only loads to wait for: block briefly instead of spinning
                self.tiers.wait_for_loads(pending, 0.05)
            return outputs
        self.kv.flush_write_downs()  # victims reused by this pass are written down first
        t0 = time.perf_counter()
        tokens = self.runner.run(sched.scheduled)
        if self.tiers is not None:
            self.tiers.costs.observe_prefill(sched.num_batched_tokens, time.perf_counter() - t0)
        with self.lock:
            return outputs + self._postprocess(sched.scheduled, tokens)

    def _postprocess(self, scheduled, tokens) -> list[RequestOutput]:
        outputs = []
        for s, tok in zip(scheduled, tokens):
            seq = s.seq
            self.num_prompt_tokens_computed += max(
                0, min(seq.num_prompt_tokens, seq.num_computed_tokens + s.num_new_tokens)
                - seq.num_computed_tokens)
            seq.num_computed_tokens += s.num_new_tokens
            self.kv.commit(seq)
            if tok is None:
                continue
            seq.token_ids.append(tok)
            reason = self._stop_reason(seq, tok)
            if reason is not None:
                outputs.append(self._finish(seq, reason))
            else:
                outputs.append(self._output(seq))
        return outputs

    def _stop_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.sampling
        if not p.ignore_eos and tok in self.eos_token_ids:
            return "stop"
        if tok in p.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence, finished: bool = False) -> RequestOutput:
        new = seq.token_ids[seq.num_prompt_tokens + seq.num_sent_tokens:]
        seq.num_sent_tokens += len(new)
        return RequestOutput(seq.request_id, new, finished, seq.finish_reason, seq.num_prompt_tokens,
                             seq.num_cached_tokens, seq.num_output_tokens)

    def _finish(self, seq: Sequence, reason: str) -> RequestOutput:
        seq.finish_reason = reason
        self._release(seq)
        self._seqs.pop(seq.request_id, None)
        return self._output(seq, finished=True)

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        self.sessions.check_integrity()
        live = {b.block_id for s in [*self.scheduler.running, *self.scheduler.loading]
                for b in s.block_table}
        if self.tiers is not None:
            live |= {b.block_id for b in self.tiers.prefetching_blocks()}
        in_use = {b.block_id for b in self.kv.pool.blocks if b.ref_cnt > 0}
        assert live == in_use, "blocks in use that no running sequence holds"
        assert all(s.status != SeqStatus.FINISHED for s in self._seqs.values())
