"""Perplexity of a fixed text with each KV cache type (issue 36: q4_0 with llama.cpp's rotation
within 1% of f16), measured as llama-perplexity does: the text's tokens in chunks of n_ctx, each
chunk evaluated alone from an empty cache, the log-likelihood of every token in the second half
of the chunk (the first half is context only).

    .venv/bin/python tools/kv_perplexity.py -m ~/.cache/pyggml/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
        [--text /usr/share/common-licenses/GPL-3] [-c 1024] [--chunks 4] [-t 2]
        [--types f16,q8_0,q4_0,q8_0/q4_0] [--no-rotation q4_0]   (K/V as TYPE_K/TYPE_V;
        --no-rotation: also these without llama.cpp's rotation)
    /work/ref/llamacpp-venv/bin/python tools/kv_perplexity.py --llamacpp -m ...   (llama.cpp,
        through llama-cpp-python, at its defaults but for -ctk/-ctv; rotation as it decides,
        off with LLAMA_ATTN_ROT_DISABLE=1 in its environment)

Prints one line per type: perplexity, its ratio to f16's, and the seconds it took.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np


def log_softmax_at(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(ids[i]) under logits[i] (float64)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return x[np.arange(len(ids)), ids] - lse


def chunk_nll(all_logits: np.ndarray, chunk: list[int]) -> tuple[float, int]:
    """Σ −log p over the second half of a chunk (logits [n_ctx, V] of every position)."""
    n = len(chunk)
    first = n // 2
    ids = np.asarray(chunk[first + 1:])
    return float(-log_softmax_at(all_logits[first:n - 1], ids).sum()), len(ids)


def run_pyggml(a, tokens_of_text) -> None:
    from pyggml.llm import kv_cache
    from pyggml.llm.runtime import LLM
    results = {}
    cases = [(t, True) for t in a.types] + [(t, False) for t in a.no_rotation]
    for t, rot in cases:
        kv_cache.ROTATE_QUANTIZED = rot
        t0 = time.perf_counter()
        tk, _, tv = t.partition("/")
        with LLM(a.model, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=512, n_threads=a.threads,
                 logits_all=True, type_k=tk, type_v=tv or tk) as llm:
            toks = tokens_of_text(llm.tokenize)
            nll, n = 0.0, 0
            for c in range(a.chunks):
                chunk = toks[c * a.ctx:(c + 1) * a.ctx]
                llm.reset()
                s, k = chunk_nll(llm.eval(chunk), chunk)
                nll, n = nll + s, n + k
        results[(t, rot)] = (math.exp(nll / n), time.perf_counter() - t0, n)
    report(results)


def run_llamacpp(a, tokens_of_text) -> None:
    import llama_cpp
    ids = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
           "bf16": 30, "f32": 0}
    results = {}
    for t in a.types:
        t0 = time.perf_counter()
        tk, _, tv = t.partition("/")
        m = llama_cpp.Llama(a.model, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=512,
                            n_threads=a.threads, n_threads_batch=a.threads, logits_all=True,
                            verbose=False, flash_attn=True, type_k=ids[tk],
                            type_v=ids[tv or tk])
        toks = tokens_of_text(lambda text: m.tokenize(text.encode(), add_bos=True))
        nll, n = 0.0, 0
        for c in range(a.chunks):
            chunk = toks[c * a.ctx:(c + 1) * a.ctx]
            m.reset()
            m.eval(chunk)
            s, k = chunk_nll(np.array(m.scores[:len(chunk)], dtype=np.float32), chunk)
            nll, n = nll + s, n + k
        m.close()
        results[(t, True)] = (math.exp(nll / n), time.perf_counter() - t0, n)
    report(results)


def report(results) -> None:
    base = results.get(("f16", True), (None,))[0]
    for (t, rot), (ppl, secs, n) in results.items():
        ratio = f"{ppl / base:.4f}" if base else "-"
        print(f"{t:7s} rotation {'on ' if rot else 'off'}  ppl {ppl:.4f}  vs f16 {ratio}  "
              f"({n} tokens scored, {secs:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--no-rotation", default="q4_0")
    ap.add_argument("--llamacpp", action="store_true")
    a = ap.parse_args()
    a.types = [t for t in a.types.split(",") if t]
    a.no_rotation = [t for t in a.no_rotation.split(",") if t]
    text = open(a.text, encoding="utf-8").read()

    def tokens_of_text(tokenize):
        toks = list(tokenize(text))
        need = a.ctx * a.chunks
        if len(toks) < need:
            raise SystemExit(f"{a.text}: {len(toks)} tokens, {need} needed")
        return toks
    (run_llamacpp if a.llamacpp else run_pyggml)(a, tokens_of_text)


if __name__ == "__main__":
    main()
