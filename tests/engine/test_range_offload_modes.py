"""A range offload (a compressed context's stale tail) moves that part under every offload mode:
deferred, whose whole-session offload only demotes the session, writes a range down now, as lazy
does; the session stays as it was, and the reply's note says what happens to the device copies
(review rev25 B2)."""

from __future__ import annotations

import pytest

from hintkv.engine.types import CacheEdit
from hintkv.server.edit_notes import edit_notes
from tests.engine.tier_engine_helpers import BLOCK, generate, prompt, session, settle, tiny_engine


@pytest.mark.parametrize("mode", ["deferred", "lazy", "eager"])
def test_a_range_offload_writes_the_range_down_in_every_mode(mode):
    e = tiny_engine(kv_tokens=16 * BLOCK, host_cache_memory="1MiB", offload_mode=mode)
    try:
        generate(e, prompt(1, 4 * BLOCK), sid="s")
        [out] = e.manage(session("s"), [CacheEdit("offload", token_start=2 * BLOCK + 3)])
        assert out.action == "offloaded" and out.num_scheduled == 2, out
        settle(e)
        assert e.tier_stats()["tiers"]["host"]["puts"] == 2  # blocks 2-3, not the session's first two
        d = e.describe_session("t", "s")  # (a block is counted in its highest tier)
        assert d.state == "waiting" and d.held_tokens == 4 * BLOCK, d
        assert d.tokens_per_tier == ({"device": 2 * BLOCK, "host": 2 * BLOCK} if mode == "eager"
                                     else {"device": 4 * BLOCK, "host": 0}), d
        [note] = edit_notes(out)
        assert ("dropped once the writes land" in note) == (mode == "eager"), note
        assert "first in line" not in note, note  # a range is not demoted (review rev25 B10)
    finally:
        e.close()
