"""decode_layers.py: all decoder layers of a few-row step in one C++ call give bit-identical hidden
states, residual stream and KV writes to the per-op layers (float32 and w8a8, bias or none, decode
batches and a verify-like multi-row sequence), and the model runs it only where it applies; a float32 or w8a8
step runs as one OpenMP team (csrc/decode_team.cpp) at 1, 2, 3 and 6 threads with the same bits."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import hintkv
from hintkv.models import cpu_kernels, decode_layers, gemv_cpu, int8
from hintkv.models.attention import AttentionMetadata
from hintkv.models.compile import Regions
from hintkv.models.decode_layers import DecodeLayers
from hintkv.models.llama import LlamaForCausalLM
from hintkv.models.presets import init_random_, preset_config
from hintkv.models.team_choice import ContentionGate, TeamChooser

pytestmark = pytest.mark.skipif(not cpu_kernels.enabled() or gemv_cpu.ops() is None,
                                reason="C++ kernels off or not built: no fused decode layers")
BS = 16


def _model(quantization: str | None, bias: bool) -> LlamaForCausalLM:
    cfg = dataclasses.replace(preset_config("tiny"), num_hidden_layers=3, vocab_size=2048, attention_bias=bias)
    model = LlamaForCausalLM(cfg)
    init_random_(model, seed=3)
    if bias:
        with torch.no_grad():
            for layer in model.layers:
                layer.self_attn.qkv_proj.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(5))
    calibration = [list(range(10, 90)), list(range(500, 560))] if quantization else None
    model.prepare(quantization, calibration)
    return model


def _step(model: LlamaForCausalLM, q_lens: list[int], ctx: list[int], seed: int):
    """Inputs of one step: sequence i has ctx[i] tokens after it, the last q_lens[i] of them new; random
    KV before them (distinct blocks per sequence, shuffled)."""
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    need = [-(-c // BS) for c in ctx]
    perm = torch.randperm(sum(need) + 2, generator=gen)
    tables, start = [], 0
    for n in need:
        tables.append(perm[start:start + n].clone())
        start += n
    kv = [torch.randn(2, sum(need) + 2, BS, cfg.num_key_value_heads, cfg.head_dim, generator=gen)
          for _ in range(cfg.num_hidden_layers)]
    pos = torch.cat([torch.arange(c - q, c) for q, c in zip(q_lens, ctx)])
    slots = torch.cat([t[p // BS] * BS + p % BS for t, p in zip(tables, torch.split(pos, q_lens))])
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    meta = AttentionMetadata(slot_mapping=slots, query_start_loc=qsl, context_lens=ctx, block_tables=tables,
                             is_decode_only=all(q == 1 for q in q_lens))
    ids = torch.randint(0, cfg.vocab_size, (len(pos),), generator=gen)
    return ids, pos, meta, kv


# float32 and w8a8 through the team (HINTKV_DECODE_TEAM=1) and through decode_layers.cpp's per-kernel regions (the
# default, and steps past attention's direct path): each keeps its bit-equality
@pytest.mark.parametrize("quantization,team", [(None, True), (None, False), ("w8a8", True), ("w8a8", False)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("q_lens,ctx", [([1], [37]), ([1] * 8, [5, 130, 16, 17, 64, 1, 33, 200]),
                                        ([4, 1, 3], [40, 9, 70]),
                                        ([1, 1], [37, 12]), ([1, 1, 1], [5, 40, 9])])  # w8a8-fine's 2/3-row edge
def test_fused_layers_equal_the_per_op_layers_bit_for_bit(quantization, team, bias, q_lens, ctx):
    model = _model(quantization, bias=bias)
    fused = model._decode_layers
    assert isinstance(fused, DecodeLayers) and fused.max_rows == (_w8a8_rows() if quantization else gemv_cpu.ROWS)
    fused.team = team
    fused._ops = spy = _OpsSpy(fused._ops)
    ids, pos, meta, kv = _step(model, q_lens, ctx, seed=len(q_lens))
    kv_ref = [c.clone() for c in kv]
    with torch.inference_mode():
        cos, sin = model.rotary.cos_sin(pos, grow=True)
        h0 = F.embedding(ids, model.embed_tokens)
        got = fused(h0.clone(), cos, sin, kv, meta)  # the first norm's residual is its input, then updated in place
        assert got is not None
        h, residual = h0, None
        for layer, cache in zip(model.layers, kv_ref, strict=True):
            h, residual = layer(h, residual, cos, sin, cache, meta, model.regions)
    assert torch.equal(got[0], h) and torch.equal(got[1], residual)
    assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref))
    assert spy.calls == [("decode_team", True)] if team else [("decode_layers", True)]


def _w8a8_rows() -> int:
    """The most tokens a fused w8a8 step takes: gemv's 16 int8 rows, one a token on the int16 kernel, else two."""
    return int8.GEMV_ROWS // (1 if int8.gemv_kernel() == "i16" else int8.LEVELS)


@pytest.mark.skipif(_w8a8_rows() < 16, reason="the int8 loop (two rows a token): the fused call takes 8 tokens")
@pytest.mark.parametrize("team", [True, False])
def test_a_sixteen_token_w8a8_step_is_fused_on_the_int16_kernel(team):
    """On the int16 kernel a token is one gemv row, so a 16-sequence decode (and down_proj in int8, fine_int8_rows 16)
    runs in the fused call, bit for bit the per-op layers; 17 tokens are not its case."""
    model = _model("w8a8", bias=True)
    fused = model._decode_layers
    assert fused.max_rows == 16
    fused.team = team
    fused.chooser = None
    fused._ops = spy = _OpsSpy(fused._ops)
    ctx = [5, 130, 16, 17, 64, 1, 33, 200, 300, 2, 45, 80, 9, 128, 250, 7]
    got, want, kv, kv_ref = _fused_vs_per_op(model, [1] * 16, ctx, seed=16)
    assert got is not None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref))
    assert spy.calls == [("decode_team", True)] if team else [("decode_layers", True)]
    assert _fused_vs_per_op(model, [1] * 17, ctx + [40], seed=17)[0] is None


class _OpsSpy:
    """The extension module with its two entry points counted (which one served a step)."""

    def __init__(self, ops) -> None:
        self.ops, self.calls = ops, []

    def __getattr__(self, name):
        fn = getattr(self.ops, name)

        def counted(*args):
            out = fn(*args)
            self.calls.append((name, bool(out)))
            return out
        return counted


def _fused_vs_per_op(model, q_lens, ctx, seed):
    ids, pos, meta, kv = _step(model, q_lens, ctx, seed=seed)
    kv_ref = [c.clone() for c in kv]
    with torch.inference_mode():
        cos, sin = model.rotary.cos_sin(pos, grow=True)
        h0 = F.embedding(ids, model.embed_tokens)
        got = model._decode_layers(h0.clone(), cos, sin, kv, meta)
        h, residual = h0, None
        for layer, cache in zip(model.layers, kv_ref, strict=True):
            h, residual = layer(h, residual, cos, sin, cache, meta, model.regions)
    return got, (h, residual), kv, kv_ref


@pytest.mark.parametrize("threads", [1, 2, 3, 6])  # 3 and 6 on a 2-core machine: threads come late to phases
# and sleep on a phase's futex
@pytest.mark.parametrize("q_lens,ctx", [([1] * 8, [5, 130, 16, 17, 64, 1, 33, 200]), ([4, 1, 3], [40, 9, 70]),
                                        ([1] * 12, [300, 2, 45, 17, 80, 9, 33, 64, 128, 5, 16, 250])])
def test_the_team_step_runs_float32_decodes_bit_for_bit(threads, q_lens, ctx):
    _team_bit_for_bit(_model(None, bias=True), threads, q_lens, ctx)


@pytest.mark.parametrize("threads", [1, 2, 3, 6])
@pytest.mark.parametrize("q_lens,ctx", [([1] * 8, [5, 130, 16, 17, 64, 1, 33, 200]), ([4, 1, 3], [40, 9, 70]),
                                        ([1, 1, 1], [5, 40, 9]), ([1], [37])])  # 1 row: gemv's two-block loop
def test_the_team_step_runs_w8a8_decodes_bit_for_bit(threads, q_lens, ctx):
    """W8A8's int8 linears inside the team (int8_cpu's build through team_address(): rows quantized once in a
    phase's tail, each item's channels), fine down_proj's two channel halves and the bias: the regions' bits."""
    _team_bit_for_bit(_model("w8a8", bias=True), threads, q_lens, ctx)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("q_lens,ctx", [([1, 1], [37, 12]), ([1, 1, 1], [5, 40, 9]),
                                        ([1] * 8, [5, 130, 16, 17, 64, 1, 33, 200])])
def test_the_team_runs_w8a8_fine_past_its_int8_rows_on_the_float_weight_bit_for_bit(threads, q_lens, ctx):
    """w8a8-fine's down_proj past its int8 rows (AVX2's 2; VNNI / AMX allow all 8) runs its float weight inside the
    team: forced here at 1 row, both in the per-op kernel and the team, so every case below (2-8 rows) takes the
    branch on every CPU (review_int8team finding 3; at 2 the 2-row cases ran int8: review_engine20 finding 5)."""
    model = _model("w8a8", bias=True)
    for layer in model.layers:
        layer.mlp.down_proj.kernel.int8_rows = 1
    model._decode_layers.fine_rows = 1
    assert sum(q_lens) > model._decode_layers.fine_rows  # every case past the int8 rows: the float branch
    _team_bit_for_bit(model, threads, q_lens, ctx)


def test_a_w8a8_model_prepares_without_int8_cpus_build(monkeypatch):
    """int8_cpu's extension missing (no compiler for it): int8.py runs the eager ops and the fused call is not built;
    reading int8_cpu's addresses crashed `prepare` (review_int8team finding 1)."""
    from hintkv.models import int8_cpu

    monkeypatch.setattr(int8_cpu, "ops", lambda: None)
    model = _model("w8a8", bias=False)
    assert model._decode_layers is None


def _team_bit_for_bit(model, threads, q_lens, ctx):
    fused = model._decode_layers
    fused.team = True  # opt-in (HINTKV_DECODE_TEAM=1)
    fused._ops = spy = _OpsSpy(fused._ops)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed in range(3):
            got, want, kv, kv_ref = _fused_vs_per_op(model, q_lens, ctx, seed)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref))
    finally:
        torch.set_num_threads(saved)
    assert spy.calls == [("decode_team", True)] * 3  # the team served every step: no per-kernel call


def test_auto_is_the_default_0_the_regions_and_the_team_leaves_other_steps_to_them(monkeypatch):
    monkeypatch.delenv("HINTKV_DECODE_TEAM", raising=False)  # read when prepare builds the call
    fused = _model(None, bias=False)._decode_layers  # its model gone: the call's settings are all this reads
    assert not fused.team and isinstance(fused.chooser, TeamChooser) and fused.chooser.team  # auto, from the team
    monkeypatch.setenv("HINTKV_DECODE_TEAM", "0")
    model = _model(None, bias=False)
    assert not model._decode_layers.team and model._decode_layers.chooser is None  # a region per kernel
    model._decode_layers._ops = spy = _OpsSpy(model._decode_layers._ops)
    got, want, kv, kv_ref = _fused_vs_per_op(model, [1, 1], [37, 12], seed=2)
    assert torch.equal(got[0], want[0]) and spy.calls == [("decode_layers", True)]
    monkeypatch.setenv("HINTKV_DECODE_TEAM", "1")
    model = _model(None, bias=False)  # held here: the fused call holds its model weakly
    fused = model._decode_layers
    assert fused.team
    fused._ops = spy = _OpsSpy(fused._ops)
    for q_lens, ctx in (([1, 1], [37, 12]), ([5, 1], [40, 9])):
        # [5, 1]: 5 new rows of one sequence x 4 query heads per KV head: 20 rows, past attention's direct path (16)
        got, want, kv, kv_ref = _fused_vs_per_op(model, q_lens, ctx, seed=2)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert spy.calls == [("decode_team", True), ("decode_team", False), ("decode_layers", True)]
    w8a8_model = _model("w8a8", bias=False)
    w8a8 = w8a8_model._decode_layers
    assert w8a8.team and w8a8.int8_team  # int8 linears too, through int8_cpu's team table
    args = list(_team_args(w8a8, [1, 1], [37, 12]))
    args[-2] = 0  # no table: the C++ side refuses rather than run an int8 code as float
    with pytest.raises(RuntimeError, match="needs int8_cpu's team table"):
        w8a8._ops.decode_team(*args)


class _LoggedChooser(TeamChooser):
    """A TeamChooser that logs what it is told: (rows, team) of every record."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log: list[tuple[int, bool]] = []

    def record(self, rows: int, team: bool, seconds: float) -> None:
        assert seconds > 0
        self.log.append((rows, team))
        super().record(rows, team, seconds)


def test_auto_runs_decode_steps_both_ways_bit_for_bit(monkeypatch):
    monkeypatch.setenv("HINTKV_DECODE_TEAM", " Auto ")  # parsed as cpu_choice.env_choice parses its switches
    assert isinstance(_model("w8a8", bias=False)._decode_layers.chooser, TeamChooser)  # int8 too
    model = _model(None, bias=False)  # held here: the fused call holds its model weakly
    fused = model._decode_layers
    assert not fused.team and isinstance(fused.chooser, TeamChooser)
    fused.chooser = chooser = _LoggedChooser(probe_every=2)  # every other step a probe of the team
    fused._ops = spy = _OpsSpy(fused._ops)
    for seed in range(4):
        got, want, kv, kv_ref = _fused_vs_per_op(model, [1, 1, 1], [37, 12, 90], seed=seed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref))
    assert spy.calls == [("decode_layers", True), ("decode_team", True)] * 2
    assert chooser.num_steps == 4
    assert chooser.log == [(3, False), (3, True)] * 2  # each step's wall time, told with the way that ran it
    _fused_vs_per_op(model, [4, 1], [40, 9], seed=1)  # not a decode-only step: no choice, the regions
    assert chooser.num_steps == 4 and spy.calls[-1] == ("decode_layers", True) and len(chooser.log) == 4
    # the engine's gate (handed to the model, engine/llm_engine.py) reading contended: decode steps run the regions
    gate = ContentionGate(lambda: 0.9, check_every=1)
    assert gate.tick() and gate.contended
    model.contention_gate, calls = gate, len(spy.calls)
    try:
        for seed in range(4):
            got, want, _, _ = _fused_vs_per_op(model, [1, 1, 1], [37, 12, 90], seed=seed)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    finally:
        model.contention_gate = None
    assert spy.calls[calls:] == [("decode_layers", True)] * 4 and chooser.num_contended == 4


@pytest.mark.parametrize("value", ["on", "true", "2", "yes"])
def test_an_unknown_team_switch_is_refused(monkeypatch, value):
    monkeypatch.setenv("HINTKV_DECODE_TEAM", value)  # not 0, 1 or auto: an error, not silently the regions
    with pytest.raises(ValueError, match="HINTKV_DECODE_TEAM"):
        _model(None, bias=False)


def _team_args(fused: DecodeLayers, q_lens: list[int], ctx: list[int]) -> tuple:
    """decode_team's arguments for one step of `fused`'s model, as DecodeLayers.__call__ passes them."""
    model = fused.model
    cfg = model.config
    ids, pos, meta, kv = _step(model, q_lens, ctx, seed=1)
    cos, sin = model.rotary.cos_sin(pos, grow=True)
    tensors, codes = fused._args()
    return (F.embedding(ids, model.embed_tokens), tensors, codes, cos, sin, kv, meta.slot_mapping, meta.block_tables,
            meta.query_start_loc, meta.context_lens, model.layers[0].self_attn.scale,
            model.layers[0].input_layernorm.eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            fused.int8_team, fused.fine_rows)


# partial 64-column chunks; 513, 1001: gemv's tail blocks (n % 8) as well; w8a8: up_proj's channels start inside a
# 16-channel int8 block (1000 % 16 = 8), K padded to 64 (513)
@pytest.mark.parametrize("quantization", [None, "w8a8"])
@pytest.mark.parametrize("hidden,inter", [(520, 1000), (513, 1001)])
def test_the_team_step_is_bit_exact_on_shapes_off_its_chunks(hidden, inter, quantization):
    cfg = dataclasses.replace(preset_config("tiny"), num_hidden_layers=2, vocab_size=2048, attention_bias=True,
                              hidden_size=hidden, intermediate_size=inter)
    model = LlamaForCausalLM(cfg)
    init_random_(model, seed=3)
    model.prepare(quantization, [list(range(10, 90))] if quantization else None)
    fused = model._decode_layers
    fused.team = True  # opt-in (HINTKV_DECODE_TEAM=1)
    fused._ops = spy = _OpsSpy(fused._ops)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for q_lens, ctx in (([1] * 8, [5, 130, 16, 17, 64, 1, 33, 200]), ([4, 1, 3], [40, 9, 70])):
            got, want, kv, kv_ref = _fused_vs_per_op(model, q_lens, ctx, seed=4)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref))
    finally:
        torch.set_num_threads(saved)
    assert spy.calls == [("decode_team", True)] * 2


def test_an_item_that_throws_fails_the_team_step_instead_of_hanging_it():
    """The phase runner alone (decode_team.cpp's team_phases): a throwing item comes back as the call's error at 1,
    2 and 3 threads. In a child process with a time limit: without that, a waiting thread spins forever."""
    ops = decode_layers.ops()
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert ops.team_phases(6, 5, -1, -1, 0) == 30  # no throw: every item of every phase ran once
    finally:
        torch.set_num_threads(saved)
    script = ("import torch, hintkv.models.decode_layers as d; ops = d.ops()\n"
              "for threads in (1, 2, 3):\n"
              "    torch.set_num_threads(threads)\n"
              "    for phase, item in ((0, 0), (2, 4), (5, 1)):\n"
              "        try:\n"
              "            ops.team_phases(6, 5, phase, item, 0)\n"
              "        except RuntimeError as e:\n"
              "            assert f'item {item} of phase {phase} threw' in str(e), e\n"
              "        else:\n"
              "            raise AssertionError('no error')\n"
              "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(Path(hintkv.__file__).parents[1]))  # this checkout's hintkv
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_waiter_that_slept_on_a_phase_is_woken_not_timed_out():
    """2 threads, 40 phases of 2 items whose first sleeps 500 us: the other thread takes the second, spins past SPIN,
    sleeps on the phase's futex, and the first item's thread wakes it when the phase is done. Without that wake() a
    sleeper whose phase ended runs to its 1 ms timeout (a silent 1 ms per phase end, 40 a dummy:tiny step): about 25
    of 40 phases here (the late waiter skips the next phase's wait). Counted is only a timeout that finds its phase
    done: on a loaded machine the sleeping item's thread can wake milliseconds late, and its waiter's timeouts before
    the phase ends are no missed wake-up (the old count of every timeout failed so once at load 10)."""
    ops = decode_layers.ops()
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sleeps, missed = ops.team_futex_counts()
        assert ops.team_phases(40, 2, -1, -1, 500) == 80
        sleeps, missed = (now - was for now, was in zip(ops.team_futex_counts(), (sleeps, missed)))
    finally:
        torch.set_num_threads(saved)
    assert sleeps > 0  # the waiters slept: the case under test ran
    # a waker preempted between its phase's done store and its wake() can still miss a sleeper's timeout by a hair
    assert missed <= 2, f"{missed} of {sleeps} futex sleeps ran to their timeout after their phase was done"


def test_the_model_runs_the_fused_layers_only_where_they_apply(monkeypatch):
    model = _model(None, bias=False)
    calls = []
    real = model._decode_layers.__call__

    class Spy:
        def __call__(self, *args):
            out = real(*args)
            calls.append(out is not None)
            return out

    model._decode_layers = Spy()
    for q_lens, ran in (([1, 1], True), ([gemv_cpu.ROWS + 1], False)):
        ids, pos, meta, kv = _step(model, q_lens, [40] * len(q_lens), seed=1)
        model(ids, pos, meta, kv)
        assert calls.pop() is ran  # 13 rows: the per-op layers (gemv's limit)
    model.layers[1].mlp.down_proj.set_kernel("dense")  # a kernel it does not run: the per-op layers
    ids, pos, meta, kv = _step(model, [1], [40], seed=1)
    model(ids, pos, meta, kv)
    assert calls.pop() is False
    model.layers[1].mlp.down_proj.set_kernel("mkl")
    model(ids, pos, meta, kv)
    assert calls.pop() is True
    model.regions = Regions()  # eager regions (a bisect, the region timers' probes): no fused call
    ids, pos, meta, kv = _step(model, [1], [40], seed=1)
    model(ids, pos, meta, kv)
    assert calls == []
    monkeypatch.setenv("HINTKV_FUSED_DECODE", "0")
    assert _model(None, bias=False)._decode_layers is None



def test_a_re_prepare_calibrates_short_texts_through_the_per_op_layers():
    """w8a8's calibration records activations with module hooks, which the fused call does not fire:
    a re-prepare (the loader prepares float first) must not calibrate through the previous fused call."""
    short = [list(range(10, 18))]  # 8 tokens: a fused-sized step
    direct = _model(None, bias=False)
    direct._decode_layers = None  # as a model never prepared before
    direct.prepare("w8a8", short)
    again = _model(None, bias=False)  # prepared float first: its fused call is built
    assert isinstance(again._decode_layers, DecodeLayers)
    again.prepare("w8a8", short)
    hidden = []
    for model in (direct, again):
        ids, pos, meta, kv = _step(model, [40], [40], seed=7)  # 40 rows: the per-op layers, both models
        hidden.append(model.forward(ids, pos, meta, kv))
    assert torch.equal(hidden[0], hidden[1])
