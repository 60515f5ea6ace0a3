"""Where the time of one ubatch goes, per op (and weight type for MUL_MAT): the CPU backend's
evaluation callback timestamps each node. The callback itself costs ~10-20 µs per node, so use it
for prompt processing (ms per node), not to split a decode step.

Usage: .venv/bin/python tools/profile_ops.py [-m MODEL] [-p 512] [-t 1] [--no-fa]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyggml.llm.runtime import LLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--no-fa", action="store_true")
    args = ap.parse_args()
    llm = LLM(args.model, n_ctx=args.n_prompt + 16, n_threads=args.threads,
              flash_attn=not args.no_fa)
    toks = [int(x) for x in np.random.default_rng(0).integers(100, 30000, args.n_prompt)]
    llm.eval(toks)          # warm-up: graph built, pages touched
    llm.reset()
    times: dict[str, float] = {}
    last = [0.0]

    def cb(t, _arr):
        now = time.perf_counter()
        key = t.op.name + (f" {t.src[0].type.name}" if t.op.name == "MUL_MAT" else "")
        times[key] = times.get(key, 0.0) + now - last[0]
        last[0] = now
        return True

    llm.backend.set_eval_callback(cb)
    t0 = last[0] = time.perf_counter()
    llm.eval(toks)
    total = time.perf_counter() - t0
    llm.backend.set_eval_callback(None)
    print(f"pp{args.n_prompt}, {args.threads} thread(s): {total * 1e3:.0f} ms "
          f"({args.n_prompt / total:.0f} t/s with the callback's overhead)\n")
    print("| op | ms | share |\n|---|---:|---:|")
    for k, v in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v * 1e3:.1f} | {100 * v / total:.0f}% |")


if __name__ == "__main__":
    main()
