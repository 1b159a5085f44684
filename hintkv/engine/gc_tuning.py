"""The serving process's garbage-collector setting: the start-up heap frozen.

After start-up the process holds millions of long-lived objects (one `Block` per KV block: 68K
on an H200 with an 8B model, the host tier's index, the model's modules). CPython's cyclic
collector walks every tracked object in a full collection, so with them in the heap a full
collection on the engine thread costs milliseconds, inside some step. `gc.freeze()` moves
everything alive now into a permanent generation the collector never walks (vLLM does the same
after its engine starts); what the steps allocate is still collected as usual. `hintkv serve`
calls it once the engine is built; `bench cache` measures its steps the same way.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what start-up left behind, then freeze the survivors (call once, after start-up)."""
    gc.collect()
    gc.freeze()
