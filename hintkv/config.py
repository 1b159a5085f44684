"""Typed engine configuration, validated at the edge (CLI flags and library callers alike)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hintkv.cache.types import DEFAULT_OFFLOAD_MODE  # light: no torch

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def check_disk_config(disk_cache_dir: str | None, disk_cache_size: str | int | None) -> None:
    """The one check of the disk tier's flags: a directory and a size, both or neither."""
    if disk_cache_dir is None and disk_cache_size is not None:
        raise ValueError("--disk-cache-size needs --disk-cache-dir")
    if disk_cache_dir is not None and disk_cache_size is None:
        raise ValueError("--disk-cache-dir needs --disk-cache-size")
    if disk_cache_size is not None:
        parse_bytes(disk_cache_size)


def check_pool_config(pool: str | None, size: str | int | None, policy: str,
                      master: str | None, timeout_s: float) -> None:
    """The one check of the pool's flags."""
    if pool not in (None, "embedded", "mooncake"):
        raise ValueError(f"--pool must be embedded or mooncake, not {pool!r}")
    if pool is not None and size is None:
        raise ValueError("--pool needs --pool-size")
    if size is not None:
        parse_bytes(size)
    if policy not in ("spm", "lru"):
        raise ValueError(f"--pool-policy must be spm or lru, not {policy!r}")
    if pool == "mooncake" and master is None:
        raise ValueError("--pool mooncake needs --pool-master (see `hintkv pool start`)")
    if not timeout_s > 0:
        raise ValueError("--pool-timeout must be > 0")


def parse_bytes(text: str | int) -> int:
    """'2GiB', '512MB', '1.5g' or a plain integer -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse a size from {text!r} (try '2GiB' or '512MB')")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _opt(default, help: str, **cli):
    """A config field with its one default and its one help text (the CLI flag is made from it).

    `cli` overrides the generated flag: `flags` (names), `action`, `dest`-less aliases."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(slots=True)
class EngineConfig:
    model: str = _opt(
        DEFAULT_MODEL,
        "a model name, a .gguf file, a Hugging Face checkpoint directory, or "
        "dummy:<preset> (tiny, smollm2-135m, llama3-8b)",
    )
    dtype: str = _opt("auto", "auto | float32 | bfloat16 | float16")
    device: str = _opt("auto", "auto | cpu | cuda | cuda:N")
    block_size: int = _opt(16, "tokens per KV block")
    kv_cache_tokens: int | None = _opt(None, "device KV pool, in tokens")
    kv_cache_memory: str | None = _opt(
        None, "device KV pool, in bytes (e.g. 2GiB; default 1GiB on CPU)"
    )
    kv_cache_dtype: str = _opt(
        "auto", "auto (the model's dtype) | int8 | fp8 (float8_e4m3fn): KV stored quantised, a "
        "float32 scale per token and KV head, ~3.8x the blocks of float32 (1.9x of bf16)"
    )
    max_model_len: int | None = _opt(None, "default: min(model's max positions, 32768)")
    max_num_seqs: int = _opt(64, "sequences running at once")
    max_num_batched_tokens: int = _opt(2048, "per-step token budget (chunked prefill)")
    eviction_policy: str = _opt("sam", "device pool eviction policy (sam | lru | qlru)")
    scheduling_policy: str = _opt(
        "fcfs", "admission order: fcfs (vLLM) | cache-aware (resident prefix first, room reserved to the end) "
        "| short-first (least uncached prefill first, aged; long prefills share the step with waiting ones) "
        "| prefill-first (short-first; a new prefill without room swaps running decodes out) "
        "| prefill-fair (prefill-first; a displaced decode is overtaken a bounded number of times) "
        "| prefill-judged (prefill-fair; a swap only when it saves the newcomer more than it costs the "
        "decodes) | short-alone (short-first; a step giving a prefill its first token carries no chunk of "
        "one that does not finish, unless due; a long prefill's chunk is half the budget) | judged-alone "
        "(prefill-judged with short-alone's rule) | srpt (short-first whose deadlines age 4x slower: nearer "
        "shortest remaining prefill first) | srpt-alone (srpt with short-alone's rule) | srpt-room (srpt aged 64x "
        "slower; a candidate may take the room a running prefill with a later deadline still reserves) "
        "| srpt-drain (srpt-room with short-alone's step rule, no chunk cap; while a candidate lacks room, a "
        "prefill with a later key sits out the steps that carry decodes, so they end in decode-only steps) "
        "| srpt-resume (srpt-drain whose unfinished chunk ends by SAM's next predicted call of a session "
        "away on its tool; hints and a lower tier only) | srpt-cap (srpt-drain whose unfinished chunk's step costs at most 3 "
        "budget-sized chunks on an empty context, priced from the engine's own steps; another unfinished chunk "
        "waits rather than lengthen it) | srpt-land (srpt-drain whose unfinished chunk ends by the expected landing of "
        "a load in flight, so the call it brings up computes in the next step) | srpt-swap (srpt-drain plus "
        "prefill-judged's swaps: the best waiting call without room swaps running decodes out to a lower tier when "
        "that saves it more than it costs them). Not cache-aware-serial: an offline-replay study policy (bench policy_study)"
    )
    load_timing: str = _opt(
        "next-step", "when a request whose prefix a lower tier holds computes: next-step (the first step "
        "after its load lands) | same-step (opt-in: wait for the load inside the step that starts it "
        "when the wait costs the step's others less than the step it saves; the wait holds the engine's "
        "state lock, and no clean A/B shows it faster: docs/benchmarks/history/swarm.md, eleventh session)"
    )
    resume_prefetch: str = _opt(
        "once", "after SAM's predicted-resume prefetch of a waiting session (host/disk tiers): once (the "
        "first look only) | watch (opt-in: look again each step until its call arrives and bring back what "
        "was evicted meanwhile, into room ranked below it; measured worse live, mean TTFT +15%: docs/benchmarks/history/swarm.md, "
        "thirteenth session): cache/resume_prefetch.py"
    )
    offload_mode: str = _opt(
        DEFAULT_OFFLOAD_MODE, "what an offload hint does: deferred (write nothing at the hint: the session "
        "is demoted, and its blocks are written down if the device evicts them) | lazy (write the blocks "
        "down at once and keep the device copy as a cached block that is evicted with no write when room "
        "is needed) | eager (write them down and drop the device copy once written); measured: "
        "docs/benchmarks/sim.md"
    )
    host_mode: str = _opt(
        "inclusive", "where a block read back into the device stays: inclusive (in the tiers below too) | "
        "exclusive (only on the device: its host/disk copies are removed; the shared pool keeps its copy)"
    )
    seed: int = _opt(0, "random seed of the engine (and of dummy weights)")
    served_model_name: str | None = _opt(None, "model id clients must send")
    host_cache_memory: str | None = _opt(None, "host KV tier size (e.g. 4GiB); none: no host tier")
    disk_cache_dir: str | None = _opt(None, "disk KV tier directory; none: no disk tier")
    disk_cache_size: str | None = _opt(None, "disk KV tier size (e.g. 20GiB)")
    disk_cache_reuse: bool = _opt(
        False,
        "adopt the KV block files this deployment wrote in --disk-cache-dir (default: wipe them)",
    )
    hints: bool = _opt(
        True,
        "ignore Agent Hints: still validate them (400 if malformed), but never pass sessions or "
        "edits to the engine (the lru baseline of the benchmarks)",
        flags=("--ignore-hints", "--no-hints"),
    )
    protect_budget: float = _opt(0.5, "fraction of the device pool that TTL protection may cover")
    max_sessions: int = _opt(100_000, "agent sessions remembered in total (oldest idle forgotten first)")
    max_sessions_per_tenant: int = _opt(10_000, "agent sessions remembered per tenant")
    session_idle_expiry: float = _opt(
        3600.0, "seconds without a request after which a session is forgotten"
    )
    session_ended_grace: float = _opt(60.0, "seconds an ended (evicted) session is still remembered")
    debug_integrity: bool = _opt(
        False, "check the cache's integrity after every engine step (slow; for debugging)"
    )
    pool: str | None = _opt(None, "shared KV pool below the local tiers: embedded | mooncake "
                            "(needs --pool-size)")
    pool_size: str | None = _opt(None, "this instance's share of the pool (e.g. 8GiB)")
    pool_policy: str = _opt("spm", "spm: session-aware pool | lru: a plain store (the baseline)")
    pool_write_through: bool = _opt(
        False, "SPM writes every finished request's blocks through to the pool (default: only what "
        "no private tier keeps, i.e. what the host tier, or the disk tier below it, evicts): a session that moves to another "
        "instance (failover, rebalancing) then loads its whole prefix there, at the cost of pool "
        "traffic and bytes; at 100 users the hinted mean TTFT with it vs without was 4.39 vs 3.43 s at full token "
        "scale (+28%) and 0.660 vs 0.895 s at half scale (-26%) (docs/benchmarks/history/sim.md, eighth and ninth "
        "sessions)")
    pool_dir: str | None = _opt(None, "embedded pool: a directory shared by the instances on "
                                "this machine (none: in this process only)")
    pool_master: str | None = _opt(None, "mooncake pool: the master's RPC address, HOST:PORT "
                                   "(see `hintkv pool start`)")
    pool_metadata: str | None = _opt(None, "mooncake pool: metadata server URL, "
                                     "http://HOST:PORT/metadata")
    pool_timeout_s: float = _opt(1.0, "seconds before a pool call counts as failed (circuit "
                                 "breaker)", flags=("--pool-timeout",))
    quantization: str | None = _opt(
        None, "w8a8: int8 weights (per channel, SmoothQuant-calibrated) x int8 activations (per token, "
        "two levels) through torch._int_mm; down_proj stays float"
    )
    compile_step: str = _opt(
        "auto", "auto | on | off: torch.compile the model step's element-wise regions "
        "(auto: on for CUDA, off on CPU, where it measured no win)"
    )
    enforce_eager: bool = _opt(False, "never compile the model step nor capture CUDA graphs (vLLM's flag; "
                                      "wins over --compile-step and --cuda-graphs)")
    cpu_omp_threads_bind: str = _opt(
        "nobind", "auto | nobind | a CPU list ('0-1'): bind the engine's OpenMP threads, thread i to the i-th CPU "
        "(vLLM's VLLM_CPU_OMP_THREADS_BIND; auto: one CPU per physical core; engine/cpu_threads.py)")
    cuda_graphs: str = _opt("auto", "auto | off: replay decode steps as CUDA graphs (bucketed batch and "
                            "context; auto: on CUDA unless --enforce-eager)")
    speculative: str | None = _opt(
        None, "speculative decoding from the session's own text: ngram (prompt lookup over the "
        "request) | suffix (suffix counts over the session's requests and responses)")
    num_speculative_tokens: int = _opt(15, "the most drafts verified per decode step with --speculative")
    speculative_draft_length: str = _opt(
        "adaptive", "adaptive (7 drafts, which fill one decode's 8-row bucket on CPU float32 (CUDA and bfloat16 "
        "have no row buckets), growing to 15 after a draft accepted whole: engine/spec/draft_length.py) | "
        "fixed (--num-speculative-tokens every step); both within --speculative-max-rows")
    speculative_max_rows: int = _opt(
        16, "the most rows (real tokens + drafts) a step verifies drafts in: drafts only take the rows the "
        "step's real tokens leave, shared among its decodes (8 decodes: 1 draft each; 16 or more: none). "
        "16 is the CPU float32 kernels' largest row bucket (models/linear.py: 1, 8, 16); past it a "
        "verify costs a plain GEMM and an LM-head row per draft (vLLM's analogue: disable_by_batch_size)")
    speculative_scope: str = _opt("session", "suffix drafts from the session's text, or the "
                                  "tenant's (all its sessions)")

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.max_model_len is not None and self.max_model_len < 1:  # 0 read as unset, -5 refused every request
            raise ValueError("max_model_len must be >= 1 (leave it unset for the model's own)")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
        if self.kv_cache_dtype not in ("auto", "int8", "fp8"):  # models/kv_quant.py CHOICES (torch-free here)
            raise ValueError(f"kv_cache_dtype must be auto, int8 or fp8, not {self.kv_cache_dtype!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not 0 <= self.protect_budget <= 1:
            raise ValueError("protect_budget must be in [0, 1]")
        from hintkv.engine.admission import live_admission_error, live_admission_names  # light: no torch

        if (why := live_admission_error(self.scheduling_policy)) is not None:
            raise ValueError(f"scheduling_policy: {why}")
        if self.scheduling_policy not in live_admission_names():
            raise ValueError(f"scheduling_policy must be one of {live_admission_names()}, not {self.scheduling_policy!r}")
        from hintkv.engine.load_timing import load_timing_names  # light: no torch

        if self.load_timing not in load_timing_names():
            raise ValueError(f"load_timing must be one of {load_timing_names()}, not {self.load_timing!r}")
        from hintkv.cache.resume_prefetch import resume_prefetch_names  # light: no torch

        if self.resume_prefetch not in resume_prefetch_names():
            raise ValueError(f"resume_prefetch must be one of {resume_prefetch_names()}, not {self.resume_prefetch!r}")
        from hintkv.cache.types import HOST_MODES, OFFLOAD_MODES  # light: no torch

        if self.offload_mode not in OFFLOAD_MODES:
            raise ValueError(f"offload_mode must be one of {', '.join(OFFLOAD_MODES)}, not {self.offload_mode!r}")
        if self.host_mode not in HOST_MODES:
            raise ValueError(f"host_mode must be one of {', '.join(HOST_MODES)}, not {self.host_mode!r}")
        check_disk_config(self.disk_cache_dir, self.disk_cache_size)
        if self.host_cache_memory is not None:
            parse_bytes(self.host_cache_memory)
        check_pool_config(self.pool, self.pool_size, self.pool_policy, self.pool_master,
                          self.pool_timeout_s)
        if self.quantization not in (None, "w8a8"):
            raise ValueError(f"quantization must be w8a8 or unset, not {self.quantization!r}")
        if self.compile_step not in ("auto", "on", "off"):
            raise ValueError(f"compile_step must be auto, on or off, not {self.compile_step!r}")
        from hintkv.engine import cpu_threads  # light: no torch

        cpu_threads.check(self.cpu_omp_threads_bind)
        if self.cuda_graphs not in ("auto", "off"):
            raise ValueError(f"cuda_graphs must be auto or off, not {self.cuda_graphs!r}")
        if self.speculative not in (None, "ngram", "suffix"):
            raise ValueError(f"speculative must be ngram or suffix, not {self.speculative!r}")
        if not 1 <= self.num_speculative_tokens <= 32:
            raise ValueError("num_speculative_tokens must be in [1, 32]")
        if self.speculative_max_rows < 2:
            raise ValueError("speculative_max_rows must be at least 2 (one token and one draft)")
        if self.speculative_draft_length not in ("fixed", "adaptive"):
            raise ValueError("speculative_draft_length must be fixed or adaptive, "
                             f"not {self.speculative_draft_length!r}")
        if self.speculative_scope not in ("session", "tenant"):
            raise ValueError(f"speculative_scope must be session or tenant, not {self.speculative_scope!r}")

    def wants_cuda_graphs(self, device_type: str) -> bool:
        """Whether decode steps replay CUDA graphs (`models/cuda_graphs.py`): on CUDA unless --enforce-eager."""
        return device_type == "cuda" and not self.enforce_eager and self.cuda_graphs == "auto"

    def wants_compile(self, device_type: str) -> bool:
        """Whether the engine compiles its model step on this device type."""
        if self.enforce_eager or self.compile_step == "off":
            return False
        return self.compile_step == "on" or device_type == "cuda"
