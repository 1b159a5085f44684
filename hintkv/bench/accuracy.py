"""Accuracy of a fast path against float32: top-1 agreement, KL and perplexity on fixed text sets.

    python -m hintkv.bench.accuracy [--model SPEC] [--quantization w8a8 | --kv-cache-dtype int8]
                                    [--texts eval | fixed] [--step-tokens N]

Two fixed text sets: `FIXED_TEXTS` (4 texts, 295 SmolLM2 tokens: the tests' quick check) and the
evaluation set `data/accuracy_texts.txt` (27 texts, 9,663 tokens: prose, code, docs, shell and test
output, diffs, tool calls, JSON, SQL, French; what `hintkv bench engine` reports). On 295 tokens one
flipped near-tie moves top-1 by 0.0034, so 0.96 and 0.97 cannot be told apart; on the evaluation
set `compare` also gives 95% intervals from a bootstrap over its texts (positions inside a text are
not independent, so the text is the unit resampled).

`OneSequence` (`models/one_sequence.py`) runs one sequence on a contiguous paged cache, so a model
can be checked without an engine; `greedy` decodes with it.
A quantised KV cache is only read back by attention over a cached context, so `compare` feeds each
text as its first token, then the rest as one chunk over it (or in steps of `step_tokens`): every
position then attends over KV read from the cache (cold prefill would attend over the fresh float K/V).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from hintkv.models.kv_quant import CHOICES
from hintkv.models.one_sequence import OneSequence

__all__ = ["OneSequence", "compare", "compare_all", "eval_texts", "eval_token_lists", "fixed_token_lists",
           "greedy"]

# A fixed text set: prose, code and a tool-call transcript (what agents read and write).
FIXED_TEXTS = (
    ("The city of Paris is the capital of France. It lies on the Seine river, in the north of the "
    "country, and has been one of Europe's major centres of finance, diplomacy, commerce, fashion "
    "and science for centuries. Its museums, such as the Louvre, attract millions of visitors."),
    ("def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n"
    "        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n"
    "        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n"
    "    return -1\n"),
    ("User: The tests in tests/test_parser.py fail with KeyError: 'name'. Can you fix it?\n"
    "Assistant: Let me look at the parser first.\n<tool_call>{\"name\": \"read_file\", \"arguments\": "
    "{\"path\": \"src/parser.py\"}}</tool_call>\nTool: def parse(entry):\n    return entry['name'], "
    "entry['value']\nAssistant: The entry may lack a name. I will use entry.get('name', '') instead."),
    ("Photosynthesis is the process by which green plants and some other organisms use sunlight to "
    "synthesize foods from carbon dioxide and water. It generally involves the green pigment "
    "chlorophyll and generates oxygen as a by-product."),
)


def greedy(model, prompt: list[int], n: int, kv_cache_dtype: str = "auto") -> list[int]:
    """n greedy tokens after `prompt` (no stop tokens)."""
    seq = OneSequence(model, len(prompt) + n + 1, kv_cache_dtype)
    out = [int(seq.step(prompt)[-1].argmax())]
    while len(out) < n:
        out.append(int(seq.step([out[-1]])[-1].argmax()))
    return out


def _logits_over_cache(model, ids: list[int], kv_cache_dtype: str, step_tokens: int | None = None) -> torch.Tensor:
    """Logits of every position, all but the first attending over KV read back from the cache; the
    rest as one chunk (a prefill's many-row GEMMs) or in steps of `step_tokens` (1: decode steps' one-row
    GEMMs; up to 8: a decode batch's or a verify's few-row kernels, the same linear kernels)."""
    seq = OneSequence(model, len(ids), kv_cache_dtype)
    if step_tokens is None:
        return torch.cat([seq.step(ids[:1]), seq.step(ids[1:])])
    return torch.cat([seq.step(ids[:1])] + [seq.step(ids[i:i + step_tokens]) for i in range(1, len(ids), step_tokens)])


def _text_stats(ref: torch.Tensor, cand: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """[top-1 agreements, KL(reference || candidate) summed, reference NLL, candidate NLL] of one text."""
    target = torch.tensor(ids[1:])
    ref_lp, cand_lp = ref.float().log_softmax(-1), cand.float().log_softmax(-1)
    return torch.tensor([
        float((ref.argmax(-1) == cand.argmax(-1)).sum()),
        float(torch.nn.functional.kl_div(cand_lp, ref_lp, log_target=True, reduction="sum")),
        float(torch.nn.functional.nll_loss(ref_lp[:-1], target, reduction="sum")),
        float(torch.nn.functional.nll_loss(cand_lp[:-1], target, reduction="sum")),
    ], dtype=torch.float64)


def _summary(stats: torch.Tensor, sizes: torch.Tensor) -> dict[str, torch.Tensor]:
    """Figures from per-text sums; `stats` [..., texts, 4], `sizes` [..., texts] (batched for the bootstrap)."""
    s, n, n_pred = stats.sum(-2), sizes.sum(-1), (sizes - 1).sum(-1)
    return {"top1_agreement": s[..., 0] / n, "kl_per_token": s[..., 1] / n,
            "ppl_reference": torch.exp(s[..., 2] / n_pred), "ppl_candidate": torch.exp(s[..., 3] / n_pred)}


BOOTSTRAP = 2000  # resamples of the texts for the 95% intervals (fixed seed: the same figures every run)


def compare_all(reference, cases: dict[str, tuple], token_lists: list[list[int]]) -> dict[str, dict]:
    """`compare` for several candidates over one pass of the reference: {name: figures}; each case is
    (model, kv_cache_dtype, step_tokens or None). With 8+ texts each figure has a `*_ci95` [low, high]:
    the 2.5 / 97.5 percentiles over BOOTSTRAP resamples of whole texts."""
    stats = {name: [] for name in cases}
    for ids in token_lists:
        ref = _logits_over_cache(reference, ids, "auto")
        for name, (model, kv, step) in cases.items():
            stats[name].append(_text_stats(ref, _logits_over_cache(model, ids, kv, step), ids))
    sizes = torch.tensor([len(ids) for ids in token_lists], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    pick = torch.randint(len(token_lists), (BOOTSTRAP, len(token_lists)), generator=gen)
    out = {}
    for name, per_text in stats.items():
        st = torch.stack(per_text)
        fig = {k: float(v) for k, v in _summary(st, sizes).items()}
        fig["tokens"] = int(sizes.sum())
        if len(token_lists) >= 8:
            boot = _summary(st[pick], sizes[pick])
            for k, v in boot.items():
                fig[f"{k}_ci95"] = [float(v.quantile(0.025)), float(v.quantile(0.975))]
        out[name] = fig
    return out


def compare(reference, candidate, token_lists: list[list[int]], kv_cache_dtype: str = "auto",
            one_by_one: bool = False, step_tokens: int | None = None) -> dict[str, float]:
    """Teacher-forced next-token top-1 agreement of `candidate` (its KV cache in `kv_cache_dtype`)
    with `reference` (float KV), the mean KL(reference || candidate) per token (continuous where top-1
    counts near-ties' flips) and both perplexities; `one_by_one` (= `step_tokens` 1): the candidate
    runs every token as a decode step (the kernels of few-row steps), else the text as one chunk."""
    step = 1 if one_by_one else step_tokens
    return compare_all(reference, {"candidate": (candidate, kv_cache_dtype, step)}, token_lists)["candidate"]


def fixed_token_lists(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in FIXED_TEXTS]


EVAL_TEXTS = Path(__file__).parent / "data" / "accuracy_texts.txt"
_MARK = "\n%%%% text: "


def eval_texts() -> list[tuple[str, str]]:
    """The evaluation set: (where the text comes from, text) from `data/accuracy_texts.txt`."""
    parts = EVAL_TEXTS.read_text(encoding="utf-8").split(_MARK)[1:]
    return [(src, text.strip("\n")) for src, _, text in (p.partition("\n") for p in parts)]


def eval_token_lists(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for _, t in eval_texts()]


def main(argv: list[str] | None = None) -> int:
    from hintkv.models.loader import load_model

    p = argparse.ArgumentParser(prog="python -m hintkv.bench.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--quantization", default=None, choices=["w8a8"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=CHOICES)
    p.add_argument("--texts", default="eval", choices=["eval", "fixed"])
    p.add_argument("--step-tokens", type=int, default=None, help="feed the candidate N tokens per step")
    args = p.parse_args(argv)
    ref = load_model(args.model, torch.float32, "cpu")
    cand = (ref if args.quantization is None
            else load_model(args.model, torch.float32, "cpu", quantization=args.quantization))
    texts = (eval_token_lists if args.texts == "eval" else fixed_token_lists)(ref.tokenizer)
    print(json.dumps(compare(ref.model, cand.model, texts, args.kv_cache_dtype, step_tokens=args.step_tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
