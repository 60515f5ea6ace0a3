"""Before/after speed of two (or more) builds of libpyggml.so in one run, interleaved.

Each round runs every library once, in turn (the order alternates between rounds), in a fresh
process with PYGGML_LIB pointing at it, and takes pyggml.llm.bench's measurement there (one
repetition per test per round). The table gives, per test, the median over rounds of each
library's tokens/s and the ratio of medians against the first library. On a shared, noisy
machine this keeps both sides under the same background load.

Usage: .venv/bin/python tools/ab_libs.py --lib before=/tmp/a/libpyggml.so
           --lib after=build/native/libpyggml.so [-m MODEL] [-p 512] [-n 128] [-t 2] [--rounds 5]
           [--llamacpp-python PY]   (llama.cpp as one more contestant, in the same rotation)
           [--llamacpp-no-extra-bufts]   (llama.cpp without its AMX/repack buffer types)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys
from pyggml.llm.bench import bench_pyggml
a = json.loads(sys.argv[1])
rows = bench_pyggml(a["model"], a["prompts"], a["gens"], [a["threads"]], 1)
print(json.dumps({r.test: r.mean for r in rows}))
"""


def run_one(lib: str | None, args, llamacpp: str | None) -> dict[str, float]:
    if llamacpp:
        from pyggml.llm.bench import bench_llamacpp
        from pyggml.models_default import ensure_default_model
        model = args.model or str(ensure_default_model())
        rows = bench_llamacpp(model, args.prompts, args.gens, [args.threads], 1, llamacpp,
                              no_extra_bufts=args.llamacpp_no_extra_bufts)
        return {r.test: r.mean for r in rows}
    env = dict(os.environ, PYGGML_LIB=os.path.abspath(lib))
    spec = {"model": args.model, "prompts": args.prompts, "gens": args.gens,
            "threads": args.threads}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="LABEL=PATH (first: baseline)")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-p", "--prompts", default="512")
    ap.add_argument("-n", "--gens", default="0")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--llamacpp-python", default=None)
    ap.add_argument("--llamacpp-no-extra-bufts", action="store_true",
                    help="llama.cpp without its AMX/repack buffer types (SIGILL on some VMs)")
    args = ap.parse_args()
    args.prompts = [int(x) for x in args.prompts.split(",") if int(x) > 0]
    args.gens = [int(x) for x in args.gens.split(",") if int(x) > 0]
    libs = [tuple(s.split("=", 1)) for s in args.lib]
    if args.llamacpp_python:
        libs.append(("llama.cpp", None))
        from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
        announce_llamacpp(llamacpp_nondefaults(no_extra_bufts=args.llamacpp_no_extra_bufts),
                          file=sys.stdout)
    samples: dict[str, dict[str, list[float]]] = {label: {} for label, _ in libs}
    for rnd in range(args.rounds):
        order = libs if rnd % 2 == 0 else libs[::-1]
        for label, path in order:
            res = run_one(path, args, args.llamacpp_python if path is None else None)
            for test, tps in res.items():
                samples[label].setdefault(test, []).append(tps)
            print(f"round {rnd + 1} {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()),
                  file=sys.stderr, flush=True)
    base = libs[0][0]
    tests = list(samples[base])
    print(f"| test | t | " + " | ".join(f"{lb} t/s" for lb, _ in libs) + " | "
          + " | ".join(f"{lb} / {base}" for lb, _ in libs[1:]) + " |")
    print("|---|---|" + "---:|" * (2 * len(libs) - 1))
    for test in tests:
        med = {lb: statistics.median(samples[lb][test]) for lb, _ in libs}
        print(f"| {test} | {args.threads} | " + " | ".join(f"{med[lb]:.1f}" for lb, _ in libs)
              + " | " + " | ".join(f"{med[lb] / med[base]:.2f}" for lb, _ in libs[1:]) + " |")


if __name__ == "__main__":
    main()
