"""Worker for `pyggml bench --compare-llamacpp`: runs llama.cpp (llama-cpp-python) with the
same measurements as pyggml.llm.bench.bench_pyggml and prints one JSON line of rows.
Run by that command in an interpreter that has llama-cpp-python (never a pyggml dependency)."""

import json
import os
import sys
import time

import numpy as np



def _no_extra_bufts() -> None:
    """Load without llama.cpp's extra buffer types (CPU_REPACK, AMX): AMX tiles are not permitted
    on some VMs (the first eval dies with SIGILL). Llama() takes no such argument: its default
    model params are patched."""
    import llama_cpp
    import llama_cpp.llama as L
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p
    L.llama_cpp.llama_model_default_params = params

def main() -> None:
    from llama_cpp import Llama
    a = json.loads(sys.argv[1])
    rows = []
    n_ctx = max([*a["prompts"], *a["gens"], 1]) + 8
    for t in a["threads"]:
        if a.get("no_extra_bufts"):
            _no_extra_bufts()
        m = Llama(a["model"], n_ctx=n_ctx, n_batch=max(a["prompts"] + [512]), n_ubatch=512,
                  n_threads=t, n_threads_batch=t, flash_attn=a["flash_attn"],
                  n_gpu_layers=a.get("n_gpu_layers", 0), verbose=False)
        V = m.n_vocab()
        m.eval([int(x) for x in np.random.default_rng(0).integers(100, min(V, 30000), 8)])
        for n in a["prompts"]:
            tps = []
            for r in range(a["reps"]):
                m.reset()
                toks = [int(x) for x in np.random.default_rng(r).integers(100, min(V, 30000), n)]
                t0 = time.perf_counter()
                m.eval(toks)
                tps.append(n / (time.perf_counter() - t0))
            rows.append({"test": f"pp{n}", "n_threads": t, "tps": tps})
        for n in a["gens"]:
            tps = []
            for r in range(a["reps"]):
                m.reset()
                # as llama-bench and pyggml bench: drawn tokens, each one's logits read back
                toks = [int(x) for x in np.random.default_rng(r).integers(100, min(V, 30000), n)]
                t0 = time.perf_counter()
                for tok in toks:
                    m.eval([tok])
                tps.append(n / (time.perf_counter() - t0))
            rows.append({"test": f"tg{n}", "n_threads": t, "tps": tps})
        del m
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
