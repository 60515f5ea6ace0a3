"""Decode under a background load (issue 36 item 6): tg N of pyggml and of llama.cpp's own
llama-bench (at its defaults: BENCHMARKS.md's protocol), each with the machine otherwise as it
is and with one core kept busy by another process (a spinning Python loop, not pinned: the OS
schedules it as it would a laptop's other program), interleaved A/B/A/B, medians.

    .venv/bin/python tools/bench_background_load.py [-m MODEL] [-n 128] [-t 2] [--rounds 3]

Prints per engine the median tokens/s quiet and loaded and the loaded/quiet ratio: pyggml
must degrade no more than llama.cpp does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyggml import settings
from pyggml.llm.bench import LLAMA_BENCH, announce_llamacpp, llamacpp_nondefaults

QWEN = Path.home() / ".cache/pyggml/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def busy() -> subprocess.Popen:
    """Another program that keeps one core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def tg_pyggml(model, n, t) -> float:
    out = subprocess.run([sys.executable, "-m", "pyggml.cli", "bench", "-m", str(model),
                          "-p", "0", "-n", str(n), "-t", str(t), "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=1800)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def tg_llamacpp(model, n, t) -> float:
    out = subprocess.run([str(LLAMA_BENCH), "-m", str(model), "-p", "0", "-n", str(n), "-t",
                          str(t), "-r", "1", "-o", "json"], capture_output=True, text=True,
                         check=True, timeout=1800, env=settings.child_environment())
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=str(QWEN))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    announce_llamacpp(llamacpp_nondefaults())
    runs = {(e, loaded): [] for e in ("pyggml", "llama.cpp") for loaded in (False, True)}
    fns = {"pyggml": tg_pyggml, "llama.cpp": tg_llamacpp}
    for r in range(a.rounds):
        order = ["pyggml", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "pyggml"]
        for loaded in (False, True):
            for e in order:
                p = busy() if loaded else None
                try:
                    time.sleep(0.5 if p else 0)
                    runs[(e, loaded)].append(fns[e](a.model, a.n, a.t))
                finally:
                    if p:
                        p.kill()
                        p.wait()
        print(f"round {r + 1}: " + ", ".join(f"{e}{' loaded' if l else ''} {v[-1]:.2f}"
                                            for (e, l), v in runs.items()), flush=True)
    for e in ("pyggml", "llama.cpp"):
        q, l = statistics.median(runs[(e, False)]), statistics.median(runs[(e, True)])
        print(f"{e}: tg{a.n} quiet {q:.2f} t/s, one core busy {l:.2f} t/s, ratio {l / q:.2f}")


if __name__ == "__main__":
    main()
