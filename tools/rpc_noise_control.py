"""A control for the RPC benchmarks: one client, two identical connections.

    .venv/bin/python tools/rpc_noise_control.py [--rounds 10] [--tokens 48] [--model PATH]

Two unmodified rpc-servers (1 thread each), one LLM on each with every layer remote (-ngl 99),
the same model and context (72 cells, as `pyggml bench -p 64 -n 32`). They decode in turn, the
order alternating per round. Both sides are the same code on the same machine, so whatever
separates them is the machine. The pair ratios show how far apart two equal contestants land;
that is the resolution of tools/bench_rpc.py's ours / llama.cpp ratios on that machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402

from pyggml.backend import rpc  # noqa: E402
from pyggml.llm.runtime import LLM  # noqa: E402
from support.rpc_server import RpcServer  # noqa: E402

N_CTX = 72


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    a = ap.parse_args()
    if a.rounds < 1 or not 1 <= a.tokens < N_CTX:
        sys.exit(f"need --rounds >= 1 and --tokens in 1..{N_CTX - 1}")
    if a.model is None:
        from pyggml.models_default import ensure_default_model
        a.model = str(ensure_default_model())
    servers = [RpcServer.start(threads=1) for _ in range(2)]
    eps = [s.endpoint for s in servers]
    llms = []
    try:
        rpc.register_endpoints(eps, timeout_s=120)
        for e in eps:
            cfg = {"devices": [f"RPC[{e}]"], "gpu_layers": "all"}
            llms.append(LLM(a.model, config=cfg, n_ctx=N_CTX, n_threads=1, n_threads_batch=1,
                            flash_attn=True))
        for m in llms:                          # graphs built and uploaded before timing
            m.eval(list(range(1, 9)))
        speeds: list[list[float]] = [[], []]
        for r in range(a.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                m = llms[k]
                m.reset()
                tok = 5
                t0 = time.perf_counter()
                for _ in range(a.tokens):
                    tok = int(np.argmax(m.eval([tok])))
                speeds[k].append(a.tokens / (time.perf_counter() - t0))
        pairs = [x / y for x, y in zip(*speeds)]
        for k in range(2):
            print(f"connection {k}: tg{a.tokens} t/s {[round(x, 1) for x in speeds[k]]}, "
                  f"median {statistics.median(speeds[k]):.1f}")
        print(f"pair ratios 0/1: {[round(x, 2) for x in pairs]}; median "
              f"{statistics.median(pairs):.2f}, range {min(pairs):.2f}..{max(pairs):.2f}")
    finally:
        for m in llms:
            m.close()
        rpc.unregister_endpoints(eps)
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
