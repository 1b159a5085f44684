"""`KVCacheManager.free_room` counts a match's unreferenced blocks once while no block's reference
count changed (`BlockPool.ref_epoch`), and the count it keeps is always the one a fresh pass
gives: a match asked again after others touch, release, allocate, evict or drop its blocks. The
rule the kept count rests on (only the pool writes `ref_cnt`, and each writer bumps the epoch after
its writes) is checked on the source."""

from __future__ import annotations

import ast
import random
from operator import attrgetter
from pathlib import Path

import pytest

import hintkv
from hintkv.cache import manager as manager_mod
from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)
SAMPLING = SamplingParams(temperature=0, max_tokens=1 << 20)
WRITERS = {"allocate", "touch", "release"}  # the BlockPool methods that write ref_cnt


def _seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SAMPLING, ROOT)


def _fresh(kv: KVCacheManager, match) -> int:
    return kv.pool.num_free - list(map(attrgetter("ref_cnt"), match.blocks)).count(0)


@pytest.fixture
def counts(monkeypatch) -> list[int]:
    """How many times `free_room` counted (a pass over a match's blocks)."""
    n = [0]
    real = manager_mod.countOf

    def counting(it, x):
        n[0] += 1
        return real(it, x)

    monkeypatch.setattr(manager_mod, "countOf", counting)
    return n


@pytest.mark.parametrize("policy", ["lru", "sam"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kept_count_equals_a_fresh_pass_through_churn(policy: str, seed: int, counts: list[int]) -> None:
    rng = random.Random(seed)
    kv = KVCacheManager(40, BS, make_policy(policy, sessions=SessionRegistry()))
    pool = kv.pool
    shared = [rng.randrange(1, 50) for _ in range(6 * BS)]
    running: list[Sequence] = []
    matches = []  # kept across the churn, asked again each step
    touched: list[list] = []  # blocks touched straight through the pool (no allocate after it)
    stale = dropped = 0
    for step in range(300):
        tail = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 4) * BS)]
        s = _seq(f"s{step}", shared[:rng.randrange(1, 7) * BS] + tail)
        m = kv.match_prefix(s)
        matches.append(m)
        n = s.num_tokens - m.num_tokens
        if rng.random() < 0.7 and kv.can_admit(s, m, n):
            kv.admit(s, m, n)
            s.num_computed_tokens = s.num_tokens
            kv.commit(s)
            running.append(s)
        if running and rng.random() < 0.5:
            kv.free(running.pop(rng.randrange(len(running))))
        grown = []  # blocks taken straight from the pool (a decode's growth: victims evicted)
        for old in matches[-6:]:
            before = old.unreferenced
            assert kv.free_room(old) == _fresh(kv, old)
            counted = counts[0]
            assert kv.free_room(old) == _fresh(kv, old)
            assert counts[0] == counted  # asked again, no reference changed: not counted again
            stale += before[0] != -1 and before[0] != pool.ref_epoch
            r = rng.random()
            if r < 0.3 and pool.num_free:
                grown += pool.allocate(rng.randrange(1, pool.num_free + 1))
            elif r < 0.45:  # a kept match's blocks referenced again, alone (no allocate after it)
                some = rng.choice(matches[-6:]).blocks
                first = rng.randrange(len(some) + 1)
                touched.append([b for b in some[first:first + 3] if b.ref_cnt or b.hash is not None])
                pool.touch(touched[-1])
            elif r < 0.6:  # a cached block dropped (tier offload): no count changes, no bump
                cached = [b for b in pool.blocks if b.ref_cnt == 0 and b.hash is not None]
                if cached:
                    dropped += pool.drop(rng.choice(cached))
            else:
                continue
            for other in matches[-6:]:
                assert kv.free_room(other) == _fresh(kv, other)
        pool.release(grown)
        if touched and rng.random() < 0.3:
            pool.release(touched.pop(0))
        pool.check_integrity()
    assert stale > 50 and dropped > 10  # kept counts went stale and were counted again; drops ran


def test_counts_once_while_no_reference_changes(counts: list[int]) -> None:
    kv = KVCacheManager(16, BS, make_policy("lru"))
    a = _seq("a", list(range(1, 4 * BS + 2)))
    m = kv.match_prefix(a)
    kv.admit(a, m, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    kv.commit(a)
    kv.free(a)  # 4 full blocks cached, unreferenced
    b = _seq("b", list(range(1, 4 * BS + 2)))
    mb = kv.match_prefix(b)
    counts[0] = 0
    assert len(mb.blocks) == 4 and kv.free_room(mb) == 16 - 4
    epoch = kv.pool.ref_epoch
    mb.blocks[0].ref_cnt = 1  # behind the pool's back: a kept count does not see it
    assert kv.free_room(mb) == 16 - 4 and counts[0] == 1
    mb.blocks[0].ref_cnt = 0
    assert kv.pool.drop(mb.blocks[3])  # a cached block dropped: free stays, no count changed
    assert kv.free_room(mb) == 16 - 4 and counts[0] == 1
    kv.pool.touch(mb.blocks[:2])  # through the pool: counted again
    assert kv.pool.ref_epoch != epoch and kv.free_room(mb) == (16 - 2) - 2 and counts[0] == 2


def _ref_cnt_writes(tree: ast.AST) -> list[ast.AST]:
    """Assignments to `<x>.ref_cnt`, `setattr(<x>, "ref_cnt", ...)` calls."""
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        out += [t for t in targets if isinstance(t, ast.Attribute) and t.attr == "ref_cnt"]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "ref_cnt"):
            out.append(node)
    return out


def _is_bump(node: ast.AST) -> bool:
    return (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute)
            and node.target.attr == "ref_epoch" and isinstance(node.op, ast.Add))


def test_only_the_pool_writes_ref_cnt_and_bumps_the_epoch_after() -> None:
    """The kept count is right only while every `ref_cnt` write is in BlockPool's allocate, touch or
    release, and each bumps `ref_epoch` once, in its body's top level, after its last write and
    before any return (a count taken before a write, e.g. by the eviction hook, is then stale)."""
    root = Path(hintkv.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        writes = _ref_cnt_writes(tree)
        if path != root / "cache" / "block_pool.py":
            assert not writes, f"{path}:{writes[0].lineno if writes else 0} writes ref_cnt outside BlockPool"
            continue
        pool = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BlockPool")
        methods = {f.name: f for f in pool.body if isinstance(f, ast.FunctionDef)}
        writers = {name for name, f in methods.items() if _ref_cnt_writes(f)}
        assert writers == WRITERS and len(writes) == sum(len(_ref_cnt_writes(methods[w])) for w in WRITERS)
        for name in WRITERS:
            f = methods[name]
            bumps = [s for s in f.body if _is_bump(s)]
            assert len(bumps) == 1 and len([n for n in ast.walk(f) if _is_bump(n)]) == 1, name
            last_write = max(w.lineno for w in _ref_cnt_writes(f))
            returns = [n.lineno for n in ast.walk(f) if isinstance(n, ast.Return)]
            assert last_write < bumps[0].lineno < min(returns, default=1 << 30), name


def test_the_kept_count_is_no_part_of_the_match() -> None:
    """A cache on a result: two matches of the same blocks stay equal once one was counted."""
    kv = KVCacheManager(8, BS, make_policy("lru"))
    a, b = kv.match_prefix(_seq("a", [1] * 9)), kv.match_prefix(_seq("b", [1] * 9))
    kv.free_room(a)
    assert a.unreferenced != b.unreferenced and a == b and repr(a) == repr(b)
