"""Decode speed and traffic of a model split over loopback rpc-servers.

    .venv/bin/python tools/bench_rpc.py [--model PATH] [--tokens 32] [--reps 3] [--threads 1]

Runs, interleaved per repetition (the machine is noisy): CPU only; every layer on one server
(-ngl all); layers split over two servers (-ngl all, -ts 1,1). Servers: llama.cpp's rpc-server
from build/rpc-server/bin (make setup), on 127.0.0.1, `--threads` threads each, the same number
the local CPU backend gets. Prints per configuration the median decode tokens/s, the ratio to
CPU only, and per decoded token: bytes sent and received, and the commands sent.
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

from pyggml.backend import rpc  # noqa: E402
from pyggml.llm.runtime import LLM  # noqa: E402
from support.rpc_server import RpcServer  # noqa: E402

PROMPT = "The capital of France is"


def decode_run(llm, n_tokens: int, regs) -> tuple[float, dict]:
    """Decode tokens/s over n_tokens after the prompt, and traffic per decoded token."""
    gen = llm.generate(PROMPT, n_tokens + 1, temperature=0, stop_at_eog=False)
    next(gen)                           # prompt processed, first token sampled
    before = [r.traffic() for r in regs]
    t0 = time.perf_counter()
    n = sum(1 for _ in gen)
    dt = time.perf_counter() - t0
    after = [r.traffic() for r in regs]
    per = {"sent": 0.0, "received": 0.0, "commands": {}}
    for b, a in zip(before, after):
        per["sent"] += (a.bytes_sent - b.bytes_sent) / n
        per["received"] += (a.bytes_received - b.bytes_received) / n
        for c, k in a.commands.items():
            d = (k - b.commands.get(c, 0)) / n
            if d:
                per["commands"][c] = per["commands"].get(c, 0) + d
    return n / dt, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.model is None:
        from pyggml.models_default import ensure_default_model
        a.model = ensure_default_model()
    servers = [RpcServer.start(threads=a.threads) for _ in range(2)]
    try:
        eps = [s.endpoint for s in servers]
        regs = rpc.register_endpoints(eps, timeout_s=120)
        devs = [f"RPC[{e}]" for e in eps]
        configs = {
            "cpu": None,
            "1 server": {"devices": devs[:1], "gpu_layers": "all"},
            "2 servers": {"devices": devs, "gpu_layers": "all", "tensor_split": [1, 1]},
        }
        llms = {name: LLM(a.model, config=cfg, n_ctx=512, n_threads=a.threads)
                for name, cfg in configs.items()}
        speeds = {name: [] for name in configs}
        traffic = {}
        for _ in range(a.reps):
            for name, llm in llms.items():
                tps, per = decode_run(llm, a.tokens, regs)
                speeds[name].append(tps)
                traffic[name] = per
        base = statistics.median(speeds["cpu"])
        print(f"model {Path(a.model).name}, {a.tokens} decoded tokens x {a.reps} reps, "
              f"{a.threads} thread(s) per process")
        print(f"{'config':<10} {'tok/s':>7} {'x cpu':>6} {'sent B/tok':>11} {'recv B/tok':>11}"
              f"  commands per token")
        for name in configs:
            med = statistics.median(speeds[name])
            per = traffic[name]
            cmds = ", ".join(f"{c} {k:.1f}" for c, k in sorted(per["commands"].items()))
            print(f"{name:<10} {med:7.2f} {med / base:6.2f} {per['sent']:11.0f} "
                  f"{per['received']:11.0f}  {cmds or '-'}")
        for llm in llms.values():
            llm.close()
    finally:
        rpc.unregister_endpoints([s.endpoint for s in servers])
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
