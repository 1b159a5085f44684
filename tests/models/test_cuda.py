"""CUDA paths (skipped without CUDA; scripts/gpu_check.sh runs them on a lent GPU): the compiled
step decodes like eager, packed-free kernels and w8a8 run on the device, an int8 / fp8 KV cache
stays close to float KV, and a speculative verify's rows match one-token decodes."""

from __future__ import annotations

import pytest
import torch

from hintkv.bench.accuracy import OneSequence, greedy
from hintkv.models.linear import Linear
from hintkv.models.loader import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_uses_dense_or_w8a8_kernels():
    lm = load_model("dummy:tiny", torch.bfloat16, "cuda", quantization="w8a8")
    kinds = {m.kernel.name for m in lm.model.modules() if isinstance(m, Linear)}
    # down_proj is w8a8-fine (linear.py), which on CUDA runs its float weight: no few-row int8 loop there;
    # the head is w8a8-head (int8 logits, the top 16 of each row recomputed in float)
    assert kinds == {"w8a8", "w8a8-fine"} and lm.model._lm_head_kernel.name == "w8a8-head"
    assert all(m.kernel.blocked is None for m in lm.model.modules()
               if isinstance(m, Linear) and m.kernel.name == "w8a8-fine")
    assert len(greedy(lm.model, list(range(100, 120)), 4)) == 4  # M = 1 rows pad to _int_mm's minimum


def test_compiled_step_matches_eager_on_cuda():
    eager = load_model("dummy:tiny", torch.float32, "cuda", seed=2)
    compiled = load_model("dummy:tiny", torch.float32, "cuda", seed=2)
    assert compiled.model.compile().compiled
    prompt = list(range(200, 240))
    assert greedy(compiled.model, prompt, 16) == greedy(eager.model, prompt, 16)
    a, b = OneSequence(eager.model, 64), OneSequence(compiled.model, 64)
    torch.testing.assert_close(b.step(prompt), a.step(prompt), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantised_kv_cache_on_cuda_stays_close_to_float_kv(kv):
    lm = load_model("dummy:tiny", torch.float32, "cuda", seed=3)
    prompt = list(range(300, 340))
    ref, quant = OneSequence(lm.model, 64), OneSequence(lm.model, 64, kv)
    ref.step(prompt[:1]), quant.step(prompt[:1])
    a, b = ref.step(prompt[1:]), quant.step(prompt[1:])  # every position reads the cache back
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()) > 0.99
    assert len(greedy(lm.model, prompt, 8, kv)) == 8  # decodes (batched short-query path) on the device


def test_speculative_verify_rows_match_one_token_decodes_on_cuda():
    """A 5-token step over a cached prefix (the batched short-query path a verify takes) gives the
    logits of five one-token decodes."""
    lm = load_model("dummy:tiny", torch.float32, "cuda", seed=4)
    prompt, nxt = list(range(400, 440)), list(range(500, 505))
    one, five = OneSequence(lm.model, 64), OneSequence(lm.model, 64)
    one.step(prompt), five.step(prompt)
    singles = torch.cat([one.step([t]) for t in nxt])
    torch.testing.assert_close(five.step(nxt), singles, atol=1e-3, rtol=1e-3)
