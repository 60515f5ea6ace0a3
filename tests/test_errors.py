"""Bad input to the engine core and backends gets a typed PyggmlError naming the value and what is
allowed, never a raw ValueError / TypeError / KeyError / IndexError (the typed errors that were
ValueErrors stay ValueErrors, so older callers catching ValueError keep working)."""
import subprocess
import sys

import numpy as np
import pytest

from pyggml import Context, Graph, ops
from pyggml.alloc import DynAllocator, GraphAllocator
from pyggml.backend.base import BufferType
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.errors import (
    AllocatorError,
    InvalidArgumentError,
    ModelError,
    PyggmlError,
    ShapeError,
    UnsupportedTypeError,
)
from pyggml.llm.sampler import Sampler, SamplingParams
from pyggml.types import as_type
from conftest import REPO


def _ctx_and_a():
    ctx = Context(no_alloc=True)
    return ctx, ctx.new_tensor("f32", [4, 3], name="a")


CASES = [
    ("cpu n_threads 300", lambda: CpuBackend(300), InvalidArgumentError,
     "n_threads must be an integer in 1..256 (the CPU thread pool's limit), got 300"),
    ("cpu n_threads_batch -1", lambda: CpuBackend(2, -1), InvalidArgumentError,
     "n_threads_batch must be an integer in 1..256 (the CPU thread pool's limit), got -1"),
    ("cpu n_threads str", lambda: CpuBackend("4"), InvalidArgumentError, "got '4'"),
    ("set_n_threads above pool", lambda: CpuBackend(2).set_n_threads(9), InvalidArgumentError,
     "n_threads must be an integer in 1..2 (the pool size), got 9"),
    ("graph size", lambda: Graph(0), InvalidArgumentError, "graph size must be an integer > 0"),
    ("graph size str", lambda: Graph("big"), InvalidArgumentError, "got 'big'"),
    ("context arena", lambda: Context(no_alloc=False), InvalidArgumentError, "needs a mem_size"),
    ("gguf model from a path", lambda: __import__("pyggml.gguf").gguf.GGUFModel("m.gguf"),
     InvalidArgumentError, "GGUFModel('m.gguf'): takes opened parts; open a file with"),
    ("context size", lambda: Context(mem_size=-1, no_alloc=False), InvalidArgumentError,
     "mem_size must be >= 0, got -1"),
    ("ne not ints", lambda: Context().new_tensor("f32", ["a"], name="t"), ShapeError,
     "tensor 't': ne must be integers, got ne=['a']"),
    ("type id 1.5", lambda: as_type(1.5), UnsupportedTypeError, "unknown tensor type id 1.5"),
    ("rms_norm eps", lambda: ops.rms_norm(*_ctx_and_a(), -1.0), InvalidArgumentError,
     "rms_norm: eps must be >= 0, got -1.0"),
    ("rope mode", lambda: ops.rope_ext(*_ctx_and_a(), None, n_dims=4, mode=1),
     InvalidArgumentError, "rope: mode must be 0 (normal) or 2 (neox), got 1"),
    ("alibi without mask", lambda: ops.soft_max_ext(*_ctx_and_a(), None, max_bias=8.0),
     InvalidArgumentError, "max_bias=8.0 > 0 (ALiBi) needs a mask"),
    ("concat dim", lambda: (lambda c, a: ops.concat(c, a, a, 4))(*_ctx_and_a()),
     InvalidArgumentError, "concat: dim must be 0..3, got 4"),
    ("permute axes", lambda: ops.permute(*_ctx_and_a(), 0, 0, 1, 2), InvalidArgumentError,
     "axes must be a permutation of 0..3, got (0, 0, 1, 2)"),
    ("buffer type alignment", lambda: BufferType("X", alignment=48), InvalidArgumentError,
     "buffer type 'X': alignment must be a power of two, got 48"),
    ("allocator alignment", lambda: DynAllocator(alignment=3), InvalidArgumentError,
     "alignment must be a power of two, got 3"),
    ("allocator chunks", lambda: DynAllocator(max_chunks=0), InvalidArgumentError,
     "max_chunks must be >= 1, got 0"),
    ("sampling top_k str", lambda: Sampler(SamplingParams(top_k="x")), ModelError,
     "top_k must be an integer, got 'x'"),
    ("sampling temperature str", lambda: Sampler(SamplingParams(temperature="hot")), ModelError,
     "temperature must be a number, got 'hot'"),
    ("sample empty logits", lambda: Sampler(SamplingParams(seed=1)).sample(np.zeros(0)),
     ModelError, "logits must be one non-empty row [n_vocab], got shape (0,)"),
]


@pytest.mark.parametrize("what,call,cls,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_typed_error(what, call, cls, message):
    with pytest.raises(PyggmlError) as e:
        call()
    assert isinstance(e.value, cls), f"{what}: {type(e.value).__name__}: {e.value}"
    assert message in str(e.value)
    if isinstance(e.value, InvalidArgumentError):
        assert isinstance(e.value, ValueError)


def test_plan_lookup_of_an_unknown_tensor():
    ctx, a = _ctx_and_a()
    g = Graph()
    g.build_forward_expand(ops.scale(ctx, a, 2.0, name="s"))
    galloc = GraphAllocator(cpu_buffer_type())
    galloc.reserve(g)
    rep = galloc.report()
    assert rep.tensor("s").name == "s"
    with pytest.raises(AllocatorError, match=r"no tensor named 'nope' in this plan \(\d+ tensors\)"):
        rep.tensor("nope")


def test_kv_cache_arguments():
    from pyggml.llm.hparams import HParams
    from pyggml.llm.kv_cache import KVCache
    hp = HParams(arch="llama", n_layer=2, n_embd=8, n_ff=[16] * 2, n_head=[2] * 2,
                 n_head_kv=[1] * 2, head_dim_k=4, head_dim_v=4, n_rot=4, n_vocab=10,
                 n_ctx_train=64, rms_eps=1e-6, rope_base=1e4, rope_base_swa=1e4,
                 rope_freq_scale=1.0, rope_neox=False, sliding_window=0)
    with pytest.raises(ModelError, match="KV cache n_ctx must be an integer in 1.., got 0"):
        KVCache(hp, 0)
    with pytest.raises(ModelError, match="KV cache n_seq_max must be an integer in 1..64, got 65"):
        KVCache(hp, 32, n_seq_max=65)
    with pytest.raises(ModelError, match="1 buffer types for 2 layers"):
        KVCache(hp, 32, buffer_types=[cpu_buffer_type()])
    kv = KVCache(hp, 32, n_seq_max=2)
    kv.seq_rm(-1)
    kv.seq_cp(0, 1)
    assert kv.seq_pos_max(1) == -1
    with pytest.raises(ModelError, match=r"seq_cp: dst must be a sequence id in 0..1 "
                                         r"\(n_seq_max=2\), got 2"):
        kv.seq_cp(0, 2)
    with pytest.raises(ModelError, match=r"seq_rm: seq_id must be a sequence id in -1..1 "
                                         r"\(n_seq_max=2; -1: all\), got -3"):
        kv.seq_rm(-3)
    with pytest.raises(ModelError, match="seq_pos_max: seq_id .* got 64"):
        kv.seq_pos_max(64)


def test_cli_thread_limit_is_a_one_line_error():
    """`pyggml run -t 300` (issue 14): an error line naming the value and the limit, exit 1,
    no traceback."""
    p = subprocess.run([sys.executable, "-m", "pyggml.cli", "run", "-t", "300", "-n", "1",
                        "-p", "hi"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert ("pyggml: error: n_threads must be an integer in 1..256 (the CPU thread pool's "
            "limit), got 300") in p.stderr


def test_arena_tensors_keep_their_context_alive():
    """A tensor of a Context(no_alloc=False) points into the context's arena: dropping the
    context must not free memory the tensor still reads."""
    import ctypes
    import gc

    def make():
        ctx = Context(mem_size=1 << 20, no_alloc=False)
        t = ctx.new_tensor("f32", [4096], name="t")
        np.ctypeslib.as_array((ctypes.c_float * 4096).from_address(t.data))[:] = 7
        return t
    t = make()
    gc.collect()
    for _ in range(50):                       # reuse the freed pages if they were freed
        np.ones(1 << 18, dtype=np.float32)
    got = np.ctypeslib.as_array((ctypes.c_float * 4096).from_address(t.data))
    assert (got == 7).all()
