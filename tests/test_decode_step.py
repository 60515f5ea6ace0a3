"""The per-token step in native code (issue 36 item 2).

1. The CPU backend keeps the C executor's schedule with the plan (pg_plan): a graph computed
   again reuses it and gives the same bits as a schedule made afresh; a plan whose tensors moved
   makes a new one (and computes at the new addresses).
2. Context's fast path (pg_decode_step: one token of one sequence placed, written, computed and
   its logits copied and checked in one native call) is a strict special case of the general
   path: the same greedy tokens, logits bit for bit, and the same KV cells, through cache edits
   (seq_keep_first, seq_reset), a second sequence, sliding-window rings wrapping and n_kv
   growing past a KV_PAD boundary (a new graph); non-finite logits are the same typed error
   with the cache left as it was.
"""
import math

import numpy as np
import pytest

from pyggml import Context as Arena, Graph, _native, ops, quants
from pyggml.backend.cpu import CpuBackend, _compute_fn, host_array, set_host_data
from pyggml.errors import PyggmlError
from pyggml.llm.context import Context
from pyggml.llm.runtime import LLM
from support.gguf_edit import copy_with_tensor_filled


# ---- 1. the kept schedule --------------------------------------------------------------------

def _decode_graph(rng):
    """A decode-shaped graph (one row): MUL_MAT + ADD (fused into it) -> RMS_NORM -> MUL_MAT ->
    SILU, on two threads: barriers and a fusion for the schedule to keep."""
    ctx = Arena(mem_size=16 << 20, no_alloc=False)

    def f32(*shape, name):
        t = ctx.new_tensor("f32", list(reversed(shape)), name=name)
        set_host_data(t, rng.standard_normal(shape).astype(np.float32))
        return t

    def q8(n, k, name):     # quantized weights: the vec_dot8 path, whose MUL_MAT can fuse
        t = ctx.new_tensor("q8_0", [k, n], name=name)
        set_host_data(t, quants.quantize(rng.standard_normal((n, k)).astype(np.float32),
                                         "q8_0").tobytes())
        return t

    x, w1, b1, w2 = f32(1, 64, name="x"), q8(96, 64, "w1"), f32(1, 96, name="b1"), \
        q8(64, 96, "w2")
    h = ops.add(ctx, ops.mul_mat(ctx, w1, x), b1)
    y = ops.silu(ctx, ops.mul_mat(ctx, w2, ops.rms_norm(ctx, h, 1e-6)))
    g = Graph()
    g.build_forward_expand(y)
    return ctx, g, y


def _fresh_compute(cpu, plan, n_threads=2):
    """The same plan through pg_graph_compute_validated: a schedule made for this compute."""
    import ctypes
    bad = ctypes.c_int32(-1)
    from pyggml.backend.cpu import EVAL_CB
    st = _compute_fn(True)(plan.arr.ctypes.data, len(plan.tensors), plan.order.ctypes.data,
                           len(plan.order), cpu._tp, n_threads, plan.work.ctypes.data,
                           plan.work.size, EVAL_CB(), None, ctypes.byref(bad))
    assert st == _native.PG_OK


def test_schedule_is_kept_with_the_plan_and_remade_when_tensors_move():
    rng = np.random.default_rng(36)
    cpu = CpuBackend(n_threads=2)
    try:
        ctx, g, y = _decode_graph(rng)
        plan = cpu.plan(g)
        assert plan.handle and plan.n_schedules() == 0
        assert plan.schedule_stats()[1] >= 1          # a fusion: the schedule acts here
        cpu.graph_compute(g)
        first = host_array(y).tobytes()
        for _ in range(3):
            host_array(y)[...] = np.nan
            cpu.graph_compute(g)
            assert host_array(y).tobytes() == first
        assert cpu.plan(g) is plan and plan.n_schedules() == 1     # made once, reused

        host_array(y)[...] = np.nan
        _fresh_compute(cpu, plan)                    # a schedule made afresh: the same bits
        assert host_array(y).tobytes() == first

        # the output moves to other memory: the plan re-reads the addresses, the kept schedule
        # (whose barriers and fusions were worked out from the old ones) is made again
        other = np.full(host_array(y).size + 16, np.nan, np.float32)
        old_addr = y.data
        y.data = other.ctypes.data + 64 - other.ctypes.data % 64
        cpu.graph_compute(g)
        assert cpu.plan(g) is plan and plan.n_schedules() == 2
        assert host_array(y).tobytes() == first      # written at the new address
        cpu.graph_compute(g)
        assert plan.n_schedules() == 2
        y.data = old_addr
        del ctx
    finally:
        cpu.close()


# ---- 2. the fast decode step -----------------------------------------------------------------

def _general_only(monkeypatch):
    monkeypatch.setattr(Context, "_arm_fast", lambda self, *a, **k: setattr(self, "_fast", None))


def _scenario(llm):
    """Greedy decoding with cache edits in between; every step's logits (copies), then the
    cells of every space."""
    ctx = llm.context
    out = []

    def greedy(seq, n, tok):
        for _ in range(n):
            x = llm.eval([tok], seq)
            assert x.shape == (llm.hparams.n_vocab,)
            out.append(x.copy())
            tok = int(np.argmax(x))
        return tok

    t = int(np.argmax(llm.eval([1, 5, 9, 14, 3, 7], 0)))
    t = greedy(0, 270, t)                  # past n_kv 256 (a new graph), the window's ring wraps
    ctx.seq_keep_first(0, 200)             # cells behind the end dropped: a hole refilled
    t = greedy(0, 20, t)
    u = int(np.argmax(llm.eval([2, 4, 6], 1)))
    for _ in range(12):                    # two sequences take turns, one token each
        t, u = greedy(0, 1, t), greedy(1, 1, u)
    ctx.seq_reset(0)
    u = greedy(1, 15, u)
    t = int(np.argmax(llm.eval([8, 3], 0)))
    greedy(0, 10, t)
    both = llm.decode_batch([([t], 0), ([u], 1)])      # a batch of two: the general path
    out += [both[0], both[1]]
    cells = {n: (sp.pos.copy(), sp.seqs.copy()) for n, sp in llm.kv.spaces.items()}
    return out, cells, ctx.fast_steps, [ctx.seq_tokens(s) for s in (0, 1)]


@pytest.mark.parametrize("arch,swa_full", [("gemma3", False), ("gemma3", True),
                                           ("llama", False)])
def test_fast_path_equals_general_path_bit_for_bit(tiny_models, monkeypatch, arch, swa_full):
    tm = tiny_models.get(arch=arch, weight_type="q8_0", n_layer=2, n_embd=64, n_ff=128)
    runs = []
    for fast in (True, False):
        if not fast:
            _general_only(monkeypatch)
        with LLM(tm.path, n_ctx=1024, n_ubatch=8, n_threads=2, n_seq_max=2,
                 swa_full=swa_full) as llm:
            if not swa_full and arch == "gemma3":
                assert "swa" in llm.kv.spaces
            runs.append(_scenario(llm))
    (got, cells_f, n_fast, toks_f), (want, cells_g, n_general, toks_g) = runs
    assert n_general == 0 and n_fast > 300        # nearly every single-token step went fast
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.tobytes() == b.tobytes(), f"step {i}: logits differ"
    assert toks_f == toks_g
    for name in cells_g:
        assert np.array_equal(cells_f[name][0], cells_g[name][0]), name
        assert np.array_equal(cells_f[name][1], cells_g[name][1]), name


def test_fast_path_logits_all_and_decode_counters(tiny_models):
    tm = tiny_models.get(arch="llama", weight_type="f32")
    with LLM(tm.path, n_ctx=64, n_threads=2, logits_all=True) as llm:
        llm.eval([1, 2, 3])
        x = llm.eval([4])                  # general path: arms the step
        st = llm.context.stats
        built, reused = st.graphs_built, st.graphs_reused
        y = llm.eval([5])
        assert llm.context.fast_steps == 1
        assert x.shape == y.shape == (1, llm.hparams.n_vocab)
        assert st.graphs_built == built and st.graphs_reused == reused + 1
        assert st.ubatch_sizes[-1] == 1 and llm.context.seq_tokens(0) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_fast_path_non_finite_logits_leave_the_cache(tiny_models, tmp_path, bad):
    tm = tiny_models.get(arch="llama", weight_type="f32")
    path = copy_with_tensor_filled(tm.path, tmp_path / "bad.gguf", "output_norm.weight", bad)
    with LLM(path, n_ctx=64, n_threads=2) as llm:
        ctx = llm.context
        with pytest.raises(PyggmlError, match="non-finite logits"):
            llm.eval([1])                  # general path (arms the step before its check)
        assert ctx._fast is not None
        before = llm.kv.spaces["full"].pos.copy()
        with pytest.raises(PyggmlError, match="non-finite logits"):
            llm.eval([2])                  # the fast path: the same error
        assert ctx.fast_steps == 0 and ctx.seq_len(0) == 0
        assert np.array_equal(llm.kv.spaces["full"].pos, before)


def test_step_args_layout_matches_the_library():
    import ctypes
    assert _native.decode_step_available()
    assert _native.fn("pg_decode_step_args_size")() == ctypes.sizeof(_native.DecodeStepArgs)
