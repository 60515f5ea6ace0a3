"""Decode speed under the C executor's schedule modes (pg_graph_set_schedule: 0 a barrier after
every node, 1 barriers only where needed + element-wise nodes fused into the decode MUL_MAT,
2 = 1 + an early thread prefetching its next weight rows), in one process, interleaved: each
round runs every mode once (the order reversed every other round), 48 tokens of llm.eval([tok])
after 8 random prompt tokens. Runs where other processes used more than 0.15 of a core (from
/proc/stat minus this process's CPU time) are dropped and counted. Prints per mode the runs, their
median and 1 / the median token time.

    flock /tmp/pyggml-cpu.lock env [PYGGML_CPU_PATH=avx2] [R=6] [MODES=0,1,2] \\
        .venv/bin/python tools/bench_schedule_modes.py MODEL.gguf
"""
import os
import statistics
import sys
import time

import numpy as np

from pyggml import _native
from pyggml.llm.runtime import LLM


def main() -> None:
    set_mode = _native.fn("pg_graph_set_schedule")
    llm = LLM(sys.argv[1], n_ctx=1024, n_threads=2)
    rng = np.random.default_rng(0)
    modes = [int(m) for m in os.environ.get("MODES", "0,1,2").split(",")]
    rounds, n = int(os.environ.get("R", "6")), int(os.environ.get("N", "48"))
    runs: dict[int, list[float]] = {m: [] for m in modes}
    toks: dict[int, list[float]] = {m: [] for m in modes}
    hz = os.sysconf("SC_CLK_TCK")

    def busy() -> int:
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(f) - f[3] - f[4]

    dropped = 0
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            set_mode(m)
            llm.reset()
            llm.eval([int(x) for x in rng.integers(100, 30000, 8)])
            gen = [int(x) for x in rng.integers(100, 30000, n)]
            b0, c0, t0 = busy(), os.times(), time.perf_counter()
            tt = []
            for t in gen:
                a = time.perf_counter()
                llm.eval([t])
                tt.append(time.perf_counter() - a)
            wall = time.perf_counter() - t0
            b1, c1 = busy(), os.times()
            others = ((b1 - b0) / hz - ((c1.user + c1.system) - (c0.user + c0.system))) / wall
            if others > 0.15:
                dropped += 1
                continue
            runs[m].append(n / wall)
            toks[m] += tt
    set_mode(2)
    for m in modes:
        if runs[m]:
            print(f"mode {m}: runs {[round(x, 1) for x in runs[m]]} median "
                  f"{statistics.median(runs[m]):.2f} t/s, 1/median token {1 / statistics.median(toks[m]):.2f}")
    print(f"dropped (others > 0.15): {dropped}; load {open('/proc/loadavg').read().split()[:3]}; "
          f"path {os.environ.get('PYGGML_CPU_PATH', 'default')}")


if __name__ == "__main__":
    main()
