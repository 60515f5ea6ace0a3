"""llama.cpp's logits with quantized and bf16 KV caches (-ctk/-ctv), for tests/test_kv_types.py.
Run with the llama-cpp-python interpreter (0.3.36, built from source), never needed by the tests:

    .venv/bin/python tools/make_kv_type_refs.py --models /tmp/kv_models
    /work/ref/llamacpp-venv/bin/python tools/make_kv_type_refs.py --models /tmp/kv_models \
        --out tests/data/kv_type_refs.npz

The models: tools/make_arch_models.py's "qwen3" variant (head size 64: K and V rotated in
blocks of 64) and kv-d128, a llama variant with head size 128 (K rotated in blocks of 128, V
in blocks of 64: llama.cpp's choice), both deterministic (sha256 stored). For each model and
each KV type of TYPES (type_k = type_v), with flash attention (llama.cpp runs a quantized V
only with it; pyggml's path without it, which dequantizes V, is compared with these too):
make_arch_refs' settings (n_ctx 256, one batch of the fixed tokens, logits of every position,
2 threads, extra buffer types off). Also ggml's CPU row quantizers (from_float: what its
set_rows writes) on fixed rows (`rows.*`, row_refs). Keys `<model>.<type>.fa1.logits`
float16 [T, V].
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
MODELS = ("qwen3", "kv-d128")
# ggml's type ids (ggml.h; llama_cpp exports no GGML_TYPE_BF16)
GGML_TYPE_IDS = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
                 "bf16": 30}


def register_d128():
    """Add the head-size-128 variant to make_arch_models.VARIANTS (returns the module)."""
    import make_arch_models as M
    M.VARIANTS.setdefault("kv-d128", M.Spec("llama", ("q8_0", "q6_k"), n_layer=2, n_head=4,
                                            n_head_kv=2, head_dim=128, n_embd=256, seed=41))
    return M


def write_models(out: Path) -> dict[str, Path]:
    M = register_d128()
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokens.txt").write_text(" ".join(str(t) for t in M.TOKENS))
    return {m: M.write_variant(m, out / f"{m}.gguf") for m in MODELS}


def reference(path: Path, tokens, type_name: str, flash_attn: bool) -> np.ndarray:
    import llama_cpp
    from make_arch_refs import N_CTX, _no_extra_bufts
    _no_extra_bufts()
    t = GGML_TYPE_IDS[type_name]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=64, n_ubatch=64,
                          n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                          seed=0, flash_attn=flash_attn, type_k=t, type_v=t)
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return logits


ROW_TYPES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34, "iq4_nl": 18}


def row_refs() -> dict:
    """ggml's CPU from_float (what its set_rows writes into a KV cache) of fixed rows, from
    libggml-cpu's quantize_row_<type>: `rows.x` float32 [8, 256], `rows.<type>` uint8 bytes."""
    import ctypes

    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"))
    rng = np.random.default_rng(77)
    x = np.stack([rng.standard_normal(256), rng.uniform(-1, 1, 256), rng.standard_t(2, 256),
                  -np.abs(rng.standard_normal(256)), rng.standard_normal(256) * 1e-3,
                  np.repeat(rng.standard_normal(32), 8), rng.standard_normal(256) * 40,
                  np.where(rng.random(256) < 0.3, 0, rng.standard_normal(256))]
                 ).astype(np.float32)
    out = {"rows.x": x}
    for t, size in ROW_TYPES.items():
        f = getattr(lib, f"quantize_row_{t}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        q = np.zeros((len(x), 256 // 32 * size), np.uint8)
        for i in range(len(x)):
            f(x[i].ctypes.data, q[i].ctypes.data, 256)
        out[f"rows.{t}"] = q
    return out


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.out is None:                       # the pyggml side: write the models
        for m, p in write_models(a.models).items():
            print(m, p, hashlib.sha256(p.read_bytes()).hexdigest())
        return
    import llama_cpp
    tokens = [int(x) for x in (a.models / "tokens.txt").read_text().split()]
    out = {"tokens": np.array(tokens, np.int32),
           "llama_cpp_version": np.array(llama_cpp.__version__)}
    for m in MODELS:
        p = a.models / f"{m}.gguf"
        out[f"{m}.sha256"] = np.array(hashlib.sha256(p.read_bytes()).hexdigest())
        for t in TYPES:
            out[f"{m}.{t}.fa1.logits"] = reference(p, tokens, t, True).astype(np.float16)
            print(m, t, "done", flush=True)
    out.update(row_refs())
    np.savez_compressed(a.out, **out)


if __name__ == "__main__":
    main()
