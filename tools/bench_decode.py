"""Decode next to the memory: tokens/s of plain decoding and the read bandwidth measured in the
same run (alternating), the weight bytes a token reads (`pyggml mem`'s prediction), their
product as a share of the bandwidth; and what verifying n rows at once costs (a speculative
round's batch), which bounds what drafts can gain. BENCHMARKS.md, "AMX tile gemms ...".

    .venv/bin/python tools/bench_decode.py [-m MODEL] [-t 2] [-n 96] [-r 3] [--rows 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyggml import quants
from pyggml.llm.runtime import LLM
from pyggml.planning.memory import plan_memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=96, help="tokens decoded per repetition")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rows", default="1,2,4,8,16,32", help="verification batch sizes")
    args = ap.parse_args()
    llm = LLM(args.model, n_ctx=1024, n_threads=args.threads)
    per_token = plan_memory(llm.path, n_ctx=1024).weight_bytes_per_token
    tps, bws = [], []
    for _ in range(args.reps):
        bws.append(quants.read_bandwidth(args.threads))
        llm.reset()
        llm.eval([2, 100, 200])
        t0 = time.perf_counter()
        for i in range(args.n):
            llm.eval([300 + i])
        tps.append(args.n / (time.perf_counter() - t0))
    t, bw = statistics.median(tps), statistics.median(bws)
    print(f"decode {t:.2f} t/s (runs {', '.join(f'{x:.2f}' for x in tps)}); "
          f"{per_token / 1e6:.1f} MB a token -> {t * per_token / 1e9:.1f} GB/s; read bandwidth "
          f"{bw:.1f} GB/s (runs {', '.join(f'{x:.1f}' for x in bws)}): "
          f"{100 * t * per_token / 1e9 / bw:.0f}%")
    base = [int(x) for x in np.random.default_rng(0).integers(100, 30000, 64)]
    for n in (int(x) for x in args.rows.split(",")):
        ts = []
        for r in range(5):
            llm.reset()
            llm.eval(base)
            toks = [int(x) for x in np.random.default_rng(r).integers(100, 30000, n)]
            t0 = time.perf_counter()
            llm.decode_batch([(toks, 0)], all_logits=(0,))
            ts.append(time.perf_counter() - t0)
        print(f"verify {n:3d} rows: {1000 * statistics.median(ts):7.1f} ms")
    llm.close()


if __name__ == "__main__":
    main()
