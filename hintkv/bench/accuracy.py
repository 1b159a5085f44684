"""Accuracy of a fast path against float32: top-1 agreement and perplexity on a fixed text set.

    python -m hintkv.bench.accuracy [--model SPEC] [--quantization w8a8 | --kv-cache-dtype int8]

`OneSequence` (`models/one_sequence.py`) runs one sequence on a contiguous paged cache, so a model
can be checked without an engine; `greedy` decodes with it.
Used by `hintkv bench engine` (the w8a8 and kv int8 / fp8 rows' accuracy columns) and by the
exactness tests. A quantised KV cache is only read back by attention over a cached context, so
`compare` feeds each text as its first token, then the rest as one chunk over it: every position
then attends over KV read from the cache (cold prefill would attend over the fresh float K/V).
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from hintkv.models.kv_quant import CHOICES
from hintkv.models.one_sequence import OneSequence

__all__ = ["OneSequence", "compare", "fixed_token_lists", "greedy"]

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


def _logits_over_cache(model, ids: list[int], kv_cache_dtype: str, one_by_one: bool = False) -> torch.Tensor:
    """Logits of every position, all but the first attending over KV read back from the cache; the
    rest as one chunk (a prefill's many-row GEMMs) or `one_by_one` (decode steps' one-row GEMMs)."""
    seq = OneSequence(model, len(ids), kv_cache_dtype)
    if one_by_one:
        return torch.cat([seq.step([t]) for t in ids])
    return torch.cat([seq.step(ids[:1]), seq.step(ids[1:])])


def compare(reference, candidate, token_lists: list[list[int]], kv_cache_dtype: str = "auto",
            one_by_one: bool = False) -> dict[str, float]:
    """Teacher-forced next-token top-1 agreement of `candidate` (its KV cache in `kv_cache_dtype`)
    with `reference` (float KV), and both perplexities; `one_by_one`: the candidate runs every token
    as a decode step (the kernels of few-row steps), else the text as one chunk (a prefill's)."""
    agree = total = 0
    kl = 0.0  # sum over positions of KL(reference || candidate): continuous where top-1 counts ties' flips
    nll = {"reference": 0.0, "candidate": 0.0}
    for ids in token_lists:
        logits = {"reference": _logits_over_cache(reference, ids, "auto"),
                  "candidate": _logits_over_cache(candidate, ids, kv_cache_dtype, one_by_one)}
        agree += int((logits["reference"].argmax(-1) == logits["candidate"].argmax(-1)).sum())
        kl += float(torch.nn.functional.kl_div(logits["candidate"].float().log_softmax(-1),
                                               logits["reference"].float().log_softmax(-1),
                                               log_target=True, reduction="sum"))
        total += len(ids)
        target = torch.tensor(ids[1:])
        for k, lg in logits.items():
            nll[k] += float(torch.nn.functional.cross_entropy(lg[:-1].cpu(), target, reduction="sum"))
    n_pred = sum(len(ids) - 1 for ids in token_lists)
    return {"top1_agreement": agree / total, "ppl_reference": math.exp(nll["reference"] / n_pred),
            "ppl_candidate": math.exp(nll["candidate"] / n_pred), "kl_per_token": kl / total, "tokens": total}


def fixed_token_lists(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in FIXED_TEXTS]


def main(argv: list[str] | None = None) -> int:
    from hintkv.models.loader import load_model

    p = argparse.ArgumentParser(prog="python -m hintkv.bench.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--quantization", default=None, choices=["w8a8"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=CHOICES)
    args = p.parse_args(argv)
    ref = load_model(args.model, torch.float32, "cpu")
    cand = (ref if args.quantization is None
            else load_model(args.model, torch.float32, "cpu", quantization=args.quantization))
    print(json.dumps(compare(ref.model, cand.model, fixed_token_lists(ref.tokenizer), args.kv_cache_dtype)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
