"""Host time of one decode token: wall time per `llm.eval([tok])` minus the time in the native
graph compute (issue 36 item 2). Works with this tree's package and library and with older ones
(A/B: PYTHONPATH / PYGGML_LIB of another checkout):

  - the general path: the compute is timed around its ctypes call (pg_graph_compute_validated
    or pg_plan_compute);
  - the fast path (pg_decode_step): the compute's own time as the step reports it
    (t_compute_ns, which also holds the logits copy the threads do at its end), and the step
    call's time besides.

  python tools/bench_decode_step.py MODEL.gguf [N_TOKENS] [prof]

Three rounds of N_TOKENS (64) single-token evals after an 8-token prompt, 2 threads, n_ctx 512;
`prof` adds a cProfile of the last round (which inflates the Python part)."""
import cProfile
import io
import pstats
import sys
import time

import numpy as np

import pyggml.backend.cpu as cpu
from pyggml import _native
from pyggml.llm.runtime import LLM

model = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
mode = sys.argv[3] if len(sys.argv) > 3 else "time"
t_native = [0]          # ns in timed native computes (the general path)
t_call = [0]            # ns in pg_decode_step calls (the fast path)


def timed(f, acc):
    def w(*a):
        t = time.perf_counter_ns()
        r = f(*a)
        acc[0] += time.perf_counter_ns() - t
        return r
    return w


_orig = cpu._compute_fn
cpu._compute_fn = lambda v: timed(_orig(v), t_native)
for name, acc in (("pg_plan_compute", t_native), ("pg_decode_step", t_call)):
    try:
        _native._bound[name] = timed(_native.fn(name), acc)
    except Exception:       # an older library: the general path only
        pass


def fast_ns(ctx) -> int:
    f = getattr(ctx, "_fast", None)
    return f.args.t_compute_ns if f is not None else 0


with LLM(model, n_ctx=512, n_threads=2, n_threads_batch=2) as llm:
    V = llm.hparams.n_vocab
    rng = np.random.default_rng(0)
    llm.eval([int(x) for x in rng.integers(0, V, 8)])
    toks = [int(x) for x in rng.integers(0, V, N)]
    for rep in range(3):
        llm.truncate(0, 8)
        llm.eval([toks[0]])
        t_native[0] = t_call[0] = 0
        fast0 = fast_ns(llm.context)
        pr = cProfile.Profile() if mode == "prof" and rep == 2 else None
        if pr:
            pr.enable()
        t0 = time.perf_counter_ns()
        for t in toks:
            llm.eval([t])
        dt = time.perf_counter_ns() - t0
        if pr:
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
            print(s.getvalue())
        kern = t_native[0] + fast_ns(llm.context) - fast0
        extra = (f", python {(dt - t_call[0] - t_native[0]) / N / 1e3:.1f} us, step call - "
                 f"compute {(t_call[0] - (kern - t_native[0])) / N / 1e3:.1f} us"
                 if t_call[0] else "")
        print(f"rep {rep}: {dt / N / 1e6:.3f} ms/token, kernel {kern / N / 1e6:.3f}, "
              f"host {(dt - kern) / N / 1e3:.1f} us/token{extra}")
