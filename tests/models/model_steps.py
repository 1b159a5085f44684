"""Run a loaded model step by step through the engine's own input path, for logit-level tests.

`ModelSteps` gives each named sequence blocks from a real block pool (no prefix sharing) and
feeds its new tokens through `ModelRunner.prepare_inputs` / `forward`, exactly as the engine
does; it returns the logits of every new row, so tests can compare whole sequences against
transformers. Greedy generation tests use `LLMEngine` itself.
"""

from __future__ import annotations

import torch

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.model_runner import ModelRunner, StepInputs
from hintkv.engine.outputs import ScheduledSeq
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.attention import AttentionMetadata
from hintkv.models.loader import LoadedModel


def drain(engine: LLMEngine) -> dict[str, list[int]]:
    """Step `engine` until it has no work: each request's new tokens, by request id."""
    out: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def greedy(model: str | None, prompt: list[int], max_tokens: int, dtype: str = "float32") -> list[int]:
    """Greedy continuation of one prompt by a whole `LLMEngine` (stops at the model's EOS)."""
    engine = LLMEngine(EngineConfig(model=model, dtype=dtype, device="cpu",
                                    kv_cache_tokens=16 * (len(prompt) // 16 + max_tokens // 16 + 2)))
    engine.add_request(GenerateRequest("greedy", list(prompt),
                                       SamplingParams(temperature=0, max_tokens=max_tokens)))
    out: list[int] = []
    while engine.has_work():
        for o in engine.step():
            out += o.new_token_ids
    engine.check_integrity()
    return out


class ModelSteps:
    def __init__(self, lm: LoadedModel, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32) -> None:
        self.runner = ModelRunner(lm.model, lm.config, num_blocks, block_size, dtype, torch.device("cpu"))
        self.kv = KVCacheManager(num_blocks, block_size, make_policy("lru"))
        self.root = namespace_root(lm.name, str(dtype), block_size, None)
        self.seqs: dict[str, Sequence] = {}
        self.last_meta: AttentionMetadata | None = None  # of the latest step

    def prepare(self, batch: list[tuple[str, list[int]]]) -> tuple[list[ScheduledSeq], StepInputs]:
        """Append each sequence's new tokens (taking blocks for them) and build the step's inputs."""
        scheduled = []
        for name, new in batch:
            seq = self.seqs.get(name)
            if seq is None:
                seq = self.seqs[name] = Sequence(name, [], 0, SamplingParams(temperature=0), self.root)
            seq.token_ids.extend(new)
            if not self.kv.can_append(seq, len(new)):
                raise RuntimeError("out of KV blocks")
            self.kv.append(seq, len(new))
            scheduled.append(ScheduledSeq(seq, len(new)))
        return scheduled, self.runner.prepare_inputs(scheduled)

    @torch.inference_mode()
    def logits(self, batch: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """float32 logits of every new token, one tensor [n_new, vocab] per sequence."""
        scheduled, inputs = self.prepare(batch)
        inputs.meta.check()
        self.last_meta = inputs.meta
        out = self.runner.model.compute_logits(self.runner.forward(inputs))
        for s in scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
        q = inputs.meta.query_start_loc
        return [out[q[i]:q[i + 1]] for i in range(len(batch))]

    def last_logits(self, batch: list[tuple[str, list[int]]]) -> torch.Tensor:
        """Logits of each sequence's last new token [B, vocab]."""
        return torch.stack([rows[-1] for rows in self.logits(batch)])
