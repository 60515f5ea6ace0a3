"""Issue 36's decode harness, one script for any package and library (BENCHMARKS.md, "Decode on
AMD Zen 4"): LLM(MODEL, n_ctx=1024, n_threads=2), evaluate 8 random tokens, time 48 calls of
llm.eval([token]), median of 3 (REPS, NTOK override). Prints one JSON line: tps (the median),
tok (1 / the median token time: robust to a short disturbance), the path, `others` (cores other
processes used during the run, from /proc/stat minus this process's CPU time) and the load.

    flock /tmp/pyggml-cpu.lock env PYTHONPATH=PKG PYGGML_LIB=LIB [PYGGML_CPU_PATH=avx2] \
        .venv/bin/python tools/bench_eval_harness.py MODEL.gguf
"""
import os, statistics, sys, time, json
import numpy as np
import pyggml
path = sys.argv[1]
reps = int(os.environ.get("REPS", "3"))
n = int(os.environ.get("NTOK", "48"))
llm = pyggml.LLM(path, n_ctx=1024, n_threads=2)
rng = np.random.default_rng(0)
ts = []
tok = []
def busy():
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    return sum(f) - f[3] - f[4]
b0, c0, w0 = busy(), os.times(), time.perf_counter()
for r in range(reps):
    llm.reset()
    llm.eval([int(x) for x in rng.integers(100, 30000, 8)])
    toks = [int(x) for x in rng.integers(100, 30000, n)]
    t0 = time.perf_counter()
    for t in toks:
        a = time.perf_counter()
        llm.eval([t])
        tok.append(time.perf_counter() - a)
    ts.append(n / (time.perf_counter() - t0))
b1, c1, w1 = busy(), os.times(), time.perf_counter()
hz = os.sysconf('SC_CLK_TCK')
others = ((b1 - b0) / hz - ((c1.user + c1.system) - (c0.user + c0.system))) / (w1 - w0)
from pyggml import _native
try:
    p = _native.cpu_path()
except Exception as e:
    p = "?"
print(json.dumps({"tps": statistics.median(ts), "tok": 1 / statistics.median(tok), "runs": ts, "path": p, "others": round(others, 2), "load": open("/proc/loadavg").read().split()[:3]}))
