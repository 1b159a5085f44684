"""vLLM's side of `python -m hintkv.bench.engine_cputime`: run by vLLM's own interpreter (`.venv-vllm`),
so it imports nothing of hintkv.

vLLM's `LLM` in process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the model runs on this thread), dummy
weights of the config in argv[1]'s directory, one OpenMP thread bound to CPU 0; every figure is the
CPU time of this thread (`time.thread_time`: a prefill's min over repeats, a decode step's median
over every step of the repeats), so other jobs on the machine only cost cache, not the figure. Prints one JSON line: {"prefill_ms": {T: ms}, "decode_step_ms": {B: ms}}.

    python cputime_vllm_child.py '{"model_dir": ..., "lengths": [...], "batches": [...], "repeats": 5,
                                   "decode_tokens": 32, "seed": 0}'
"""

from __future__ import annotations

import json
import os
import random
import sys
import time


def main() -> int:
    spec = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model_dir"], load_format="dummy", skip_tokenizer_init=True, dtype="float32",
              max_model_len=4096, enable_prefix_caching=True, max_num_batched_tokens=2048, seed=0)
    rng = random.Random(spec.get("seed", 0))

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": [rng.randrange(100, 49000) for _ in range(n)]}

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)

    def cpu(prompts: list[dict], max_tokens: int) -> float:
        t = time.thread_time()
        llm.generate(prompts, params(max_tokens), use_tqdm=False)
        return time.thread_time() - t

    reps, k = spec["repeats"], spec["decode_tokens"]
    for _ in range(2):  # warm-up: the compiled graph, the allocator
        cpu([prompt(512)], 1)
        cpu([prompt(128) for _ in range(8)], 4)
    prefill = {str(n): min(cpu([prompt(n)], 1) for _ in range(reps)) * 1e3 for n in spec["lengths"]}
    engine = llm.llm_engine
    n = [0]

    def decode_steps(b: int) -> list[float]:
        """CPU time of each decode step of b fresh 128-token prompts (the first step, prefill, left out)."""
        for _ in range(b):
            n[0] += 1
            engine.add_request(f"d{n[0]}", prompt(128), params(k + 1))
        engine.step()
        times = []
        while engine.has_unfinished_requests():
            t = time.thread_time()
            engine.step()
            times.append(time.thread_time() - t)
        return times

    decode = {}
    for b in spec["batches"]:
        decode_steps(b)
        times = sorted(x for _ in range(reps) for x in decode_steps(b))
        decode[str(b)] = times[len(times) // 2] * 1e3
    import torch

    print(json.dumps({"threads": torch.get_num_threads(), "prefill_ms": prefill, "decode_step_ms": decode}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
