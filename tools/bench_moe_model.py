"""MoE decode on the CPU: pyggml next to llama.cpp's llama-bench on the same OLMoE-1B-7B-shaped
file (tools/make_moe_bench_model.py), and the weight bytes a decoded token reads, measured from
the routing taken vs what `pyggml mem` / `pyggml plan` predict. BENCHMARKS.md, "MoE decode".

    .venv/bin/python tools/bench_moe_model.py [-m MODEL] [-t 2] [-n 32] [-r 3]
        [--llama-bench PATH] [--routing-tokens 64] [--json FILE]

1. Prediction: planning.memory.plan_memory(...).weight_bytes_per_token (every non-expert weight
   once, except token_embd of which get_rows reads one row; each routed expert tensor × k/n).
2. Routing: decode of --routing-tokens random tokens (one per step, as the tg tests do) with
   the CPU backend's evaluation callback
   recording every `*-topk` node (the expert ids, I32 [k, T]); bytes read per token = the
   non-expert bytes + per layer the distinct experts chosen × one expert's bytes (gate, up,
   down). Also: how many of the n experts each layer used over the run, and the share of the
   choices that went to each layer's 8 most used (a concentrated routing would keep experts in
   the 300 MB L3 of this host and flatter both engines' speed).
3. Speed: `pyggml bench -p 0 -n N -t T -fa on` and `llama-bench -p 0 -n N -t T -fa on`
   (llama.cpp defaults otherwise: mmap, its CPU repack buffer type; AMX compiled out),
   alternating A B A B, -r repetitions each with -r 1 inside; medians. On a CPU-only host
   `-ot exps=CPU` changes nothing (every tensor is on the CPU already), so it is not run.
4. Effective bandwidth = tokens/s × bytes per token, next to the read bandwidth measured in the
   same run (pg_bench_read over 512 MiB, T threads).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache/pyggml/bench/olmoe-1b-7b-shape-q4_k_m.gguf"
LLAMA_BENCH = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-bench"


def read_bandwidth(n_threads: int) -> float:
    from pyggml import quants
    return quants.read_bandwidth(n_threads)


def predicted(model: str) -> tuple[int, dict]:
    from pyggml.planning.memory import plan_memory
    rp = plan_memory(model, n_ctx=512)
    return rp.weight_bytes_per_token, dict(rp.tensor_bytes)


def routing(model: str, n_tokens: int, threads: int, tensor_bytes: dict) -> dict:
    """Expert ids of every decode step, and the bytes they make a token read."""
    from pyggml.llm.runtime import LLM
    llm = LLM(model, n_ctx=512, n_threads=threads)
    try:
        hp = llm.hparams
        steps: list[dict[int, list[int]]] = []
        cur: dict[int, list[int]] = {}

        k = hp.n_expert_used

        def cb(t, arr):
            # "ffn_moe-<il>-topk (argsort)": I32 [n_expert, T], the descending argsort whose
            # first k columns are the experts chosen (T = 1 in decode)
            m = re.fullmatch(r"ffn_moe-(\d+)-topk \(argsort\)", t.name or "")
            if m and arr is not None:
                cur[int(m.group(1))] = [int(x) for x in np.asarray(arr).reshape(-1)[:k]]
            return True

        # random tokens, one per step, as llama-bench's and pyggml bench's tg tests decode
        toks = np.random.default_rng(0).integers(260, hp.n_vocab, n_tokens + 1)
        llm.eval([int(toks[0])])
        llm.backend.set_eval_callback(cb)
        for t in toks[1:]:
            llm.eval([int(t)])
            steps.append(dict(cur))
            cur.clear()
        llm.backend.set_eval_callback(None)
    finally:
        llm.close()
    n_layer = max(max(s) for s in steps) + 1
    exp = {}                                        # layer -> bytes of one expert (gate+up+down)
    for name, n in tensor_bytes.items():
        m = re.match(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$", name)
        if m:
            exp[int(m.group(1))] = exp.get(int(m.group(1)), 0) + n
    non_expert = sum(n for name, n in tensor_bytes.items()
                     if "_exps." not in name and not name.startswith("token_embd"))
    n_expert = hp.n_expert
    per_token = []
    for s in steps:
        per_token.append(non_expert + sum(len(set(ids)) * exp[il] // n_expert
                                          for il, ids in s.items()))
    used = {il: {} for il in range(n_layer)}
    for s in steps:
        for il, ids in s.items():
            for e in ids:
                used[il][e] = used[il].get(e, 0) + 1
    distinct = [len(used[il]) for il in range(n_layer)]
    top8 = [sum(sorted(used[il].values(), reverse=True)[:8]) / sum(used[il].values())
            for il in range(n_layer)]
    return {"steps": len(steps), "k_per_layer": len(next(iter(steps[0].values()))),
            "bytes_per_token": statistics.median(per_token),
            "distinct_experts_per_layer": {"min": min(distinct), "median":
                                           statistics.median(distinct), "max": max(distinct)},
            "share_of_top8_experts": round(statistics.median(top8), 3)}


def ours(model: str, n: int, threads: int) -> float:
    out = subprocess.run([str(REPO / ".venv/bin/pyggml"), "bench", "-m", model, "-p", "0",
                          "-n", str(n), "-t", str(threads), "-r", "1", "-fa", "on"],
                         capture_output=True, text=True, check=True).stdout
    row = [ln for ln in out.splitlines() if f"tg{n}" in ln][-1]
    return float(row.split("|")[-2].split("±")[0])


def theirs(bin_: Path, model: str, n: int, threads: int, repack: int = 1) -> float:
    out = subprocess.run([str(bin_), "-m", model, "-p", "0", "-n", str(n), "-t", str(threads),
                          "-r", "1", "-fa", "on", "--repack", str(repack), "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--routing-tokens", type=int, default=64)
    ap.add_argument("--llama-bench", type=Path, default=LLAMA_BENCH)
    ap.add_argument("--no-speed", action="store_true", help="prediction and routing only")
    ap.add_argument("--no-routing", action="store_true", help="skip the routing measurement")
    ap.add_argument("--also-no-repack", action="store_true",
                    help="also llama-bench --repack 0 (llama.cpp without its repacked layouts)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not Path(a.model).exists():
        sys.exit(f"{a.model} missing: run tools/make_moe_bench_model.py")
    res = {"model": a.model, "threads": a.threads, "load_before": load()}
    from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
    res["llamacpp_nondefaults"] = llamacpp_nondefaults()   # the "--repack 0" row says its own
    announce_llamacpp(res["llamacpp_nondefaults"], file=sys.stdout)
    print(f"load average before: {res['load_before']}", flush=True)
    pred, tb = predicted(a.model)
    res["predicted_bytes_per_token"] = pred
    print(f"predicted (pyggml mem): {pred / 2**20:.2f} MiB per decoded token", flush=True)
    if a.no_routing:
        r = {"bytes_per_token": pred}
    else:
        r = routing(a.model, a.routing_tokens, a.threads, tb)
        print(f"routing over {r['steps']} decode steps: {r['bytes_per_token'] / 2**20:.2f} MiB "
              f"per token; distinct experts per layer {r['distinct_experts_per_layer']}; share "
              f"of each layer's 8 most used experts {r['share_of_top8_experts']}", flush=True)
    res["routing"] = r
    if not a.no_speed:
        sp = {"pyggml": [], "llama.cpp": []}
        if a.also_no_repack:
            sp["llama.cpp --repack 0"] = []
        bw = []
        for i in range(a.repetitions):
            order = [("pyggml", lambda: ours(a.model, a.n, a.threads)),
                     ("llama.cpp", lambda: theirs(a.llama_bench, a.model, a.n, a.threads))]
            if a.also_no_repack:
                order.append(("llama.cpp --repack 0",
                              lambda: theirs(a.llama_bench, a.model, a.n, a.threads, 0)))
            for name, fn in order if i % 2 == 0 else order[::-1]:
                sp[name].append(fn())
                print(f"  {name}: {sp[name][-1]:.2f} t/s", flush=True)
            bw.append(read_bandwidth(a.threads))
        med = {k: statistics.median(v) for k, v in sp.items()}
        res["tg_tps"] = {k: {"median": round(med[k], 2), "runs": [round(x, 2) for x in v]}
                         for k, v in sp.items()}
        res["ratio"] = {k: round(med["pyggml"] / med[k], 2) for k in med if k != "pyggml"}
        res["read_bandwidth_GBps"] = round(statistics.median(bw), 1)
        res["effective_GBps"] = {k: round(med[k] * r["bytes_per_token"] / 1e9, 1) for k in med}
    res["load_after"] = load()
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
