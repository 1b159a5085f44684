"""The driver's prefix sharing: comparing prompts chunk by chunk gives exactly the token-level
common prefix (which the block hashes continued from the previous prompt rely on), and the prompt
built from the memo's shared tokens is exactly the flattened prompt."""

from __future__ import annotations

import random

from hintkv.sim.agents import _Memo, flatten, prompt_and_shared
from hintkv.workload.traces.claude_code import common_prefix


def test_chunkwise_prefix_equals_tokenwise():
    rng = random.Random(5)
    for _ in range(300):
        base = [tuple(rng.randrange(4) for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(0, 6))]
        other = list(base[:rng.randrange(0, len(base) + 1)])
        if other and rng.random() < 0.5:  # edit inside a chunk, keeping or changing its length
            i = rng.randrange(len(other))
            c = list(other[i])
            c[rng.randrange(len(c))] = rng.randrange(4)
            other[i] = tuple(c) if rng.random() < 0.5 else tuple(c[:rng.randrange(len(c) + 1)])
        other += [tuple(rng.randrange(4) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(3))]
        new = tuple(other)
        old = _Memo(flatten(base), [], tuple(base))
        prompt, shared = prompt_and_shared(old, new)
        assert prompt == flatten(new) and type(prompt) is list
        assert shared == common_prefix(old.tokens, flatten(new))
        # the memo's list goes on past its prompt (the sequence appended its output tokens): the
        # prompt is the same, and so is what is shared within the old prompt (the driver's hashes
        # stop at the old prompt's last full block)
        n = len(old.tokens)
        old.tokens = old.tokens + [rng.randrange(4) for _ in range(rng.randrange(3))]
        prompt, longer = prompt_and_shared(old, new)
        assert prompt == flatten(new) and min(longer, n) == shared
