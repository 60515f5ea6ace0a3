"""llama.cpp's logits on the random-weight architecture models (tools/make_arch_models.py), for
tests/test_llm_archs.py. Run with the llama-cpp-python interpreter (0.3.36, built from source),
never needed by the tests themselves:

    .venv/bin/python tools/make_arch_models.py /tmp/arch_models
    /work/ref/llamacpp-venv/bin/python tools/make_arch_refs.py /tmp/arch_models \
        tests/data/arch_refs.npz

For every model in the folder: the token sequence (make_arch_models.TOKENS, which the generator
writes to tokens.txt there: this interpreter has no pyggml), evaluated as one batch with
logits for every position (logits_all), n_ctx 256 (llama.cpp's minimum after padding), f16 KV
cache, 2 threads, with flash attention off (`fa0.`, llama-cpp-python's default) and on (`fa1.`:
the two differ in rounding: without it the softmax weights meet V in f16), and without
the CPU "extra buffer types" (AMX / repacked weights: its AMX tile kernels stop with SIGILL on
this machine, whose kernel does not grant AMX state; the plain ggml-cpu kernels remain, the same
vec_dot / quantization code). Stored per variant `<name>.fa0.` / `<name>.fa1.`: `logits`
float16 [T, V] (all of them), `top_ids`
int16 / `top_vals` float32 [T, 16] (exact values of the 16 largest), `sha256` of the GGUF (the
test checks that the regenerated file is the same bytes, stored once as `<name>.sha256`), plus
`tokens` and `llama_cpp_version`. Also per variant `<name>.greedy` int32 [GREEDY_N]: llama.cpp's
greedy continuation (flash attention on) of the first GREEDY_PROMPT tokens, one token per decode,
with `<name>.greedy_margin` float32 [GREEDY_N], the top-2 logit margin of each step.

One file per family, each made from a folder holding only its variants (so that one can be
remade without the others): arch_refs.npz, arch_refs_2026.npz (issue 32's types and
architectures), arch_refs_gemma4.npz, arch_refs_gemma3n.npz, e.g.

    .venv/bin/python tools/make_arch_models.py /tmp/g3n gemma3n
    /work/ref/llamacpp-venv/bin/python tools/make_arch_refs.py /tmp/g3n \
        tests/data/arch_refs_gemma3n.npz
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

N_CTX = 256
TOP = 16
GREEDY_PROMPT, GREEDY_N = 8, 16


def _no_extra_bufts() -> None:
    import llama_cpp
    import llama_cpp.llama as L
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p
    L.llama_cpp.llama_model_default_params = params


def reference(path: Path, tokens: list[int], flash_attn: bool) -> dict:
    import llama_cpp
    _no_extra_bufts()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=64, n_ubatch=64,
                          n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                          seed=0, flash_attn=flash_attn)
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
    return {"logits": logits.astype(np.float16), "top_ids": top.astype(np.int16),
            "top_vals": np.take_along_axis(logits, top, 1).astype(np.float32)}


def greedy(path: Path, tokens: list[int]) -> dict:
    """The greedy continuation of tokens[:GREEDY_PROMPT], decoded one token at a time."""
    import llama_cpp
    _no_extra_bufts()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=64, n_ubatch=64,
                          n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                          seed=0, flash_attn=True)
    llm.eval(tokens[:GREEDY_PROMPT])
    ids, margins = [], []
    for _ in range(GREEDY_N):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top = np.argsort(-row, kind="stable")[:2]
        ids.append(int(top[0]))
        margins.append(float(row[top[0]] - row[top[1]]))
        llm.eval([ids[-1]])
    llm.close()
    return {"greedy": np.array(ids, np.int32), "greedy_margin": np.array(margins, np.float32)}


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    import llama_cpp
    models, out = Path(argv[0]), Path(argv[1])
    tokens = [int(t) for t in (models / "tokens.txt").read_text().split()]
    data = {"tokens": np.array(tokens, np.int32),
            "llama_cpp_version": np.array(llama_cpp.__version__)}
    for p in sorted(models.glob("*.gguf")):
        data[f"{p.stem}.sha256"] = np.array(hashlib.sha256(p.read_bytes()).hexdigest())
        for fa in (0, 1):
            ref = reference(p, tokens, bool(fa))
            for k, v in ref.items():
                data[f"{p.stem}.fa{fa}.{k}"] = v
        for k, v in greedy(p, tokens).items():
            data[f"{p.stem}.{k}"] = v
        rms = float(np.sqrt((ref["logits"].astype(np.float32) ** 2).mean()))
        margin = float((ref["top_vals"][:, 0] - ref["top_vals"][:, 1]).min())
        print(f"{p.stem}: logits rms {rms:.3f}, min top-2 margin {margin:.4f}")
    np.savez_compressed(out, **data)
    print(f"{out}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
