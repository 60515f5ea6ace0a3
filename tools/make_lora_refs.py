"""Random-weight LoRA adapters in llama.cpp's GGUF adapter format, for random-weight base models
of tools/make_arch_models.py, and llama.cpp's logits with them applied (tests/test_lora.py).
Two steps, as the architecture references (the llama-cpp-python venv has no gguf package and no
pyggml; llama.cpp is never needed by the tests):

    .venv/bin/python tools/make_lora_refs.py models /tmp/lora_models
    /work/ref/llamacpp-venv/bin/python tools/make_lora_refs.py refs /tmp/lora_models \
        tests/data/lora_refs.npz

`models` writes the base variants (make_arch_models.write_variant), the adapters of ADAPTERS
(deterministic: fixed seeds, F16 / F32 pairs named "<base tensor>.lora_a" / ".lora_b",
general.type "adapter", adapter.type "lora", adapter.lora.alpha) and tokens.txt.
`refs` runs every case of CASES through llama-cpp-python 0.3.36 (n_ctx 256, 2 threads, f16 KV,
without the CPU extra buffer types, as tools/make_arch_refs.py): one adapter through
`Llama(lora_path=, lora_scale=)`, several through llama_adapter_lora_init +
llama_set_adapters_lora. Stored per case `<case>.fa0.` / `<case>.fa1.` (flash attention off /
on): `logits` float16 [T, V] of the 24-token sequence (logits_all), `top_ids` int16 / `top_vals`
float32 [T, 16]; `<case>.greedy` int32 [16]: 16 greedy tokens after the first 8 tokens (flash
attention on, one token per decode) and `<case>.greedy_margin` float32 [16]: the top-2 margin
at each of those steps; the sha256 of every file (`<file>.sha256`) so that the test can check
that the regenerated files are the same bytes.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_CTX = 256
TOP = 16
N_PROMPT, N_GREEDY = 8, 16


@dataclass(frozen=True)
class AdapterSpec:
    base: str                 # make_arch_models variant
    rank: int
    alpha: float              # 0: scale alone (no alpha/rank factor)
    targets: tuple            # layer tensors adapted (short names), plus "token_embd", "output"
    type: str = "f16"
    seed: int = 0
    b_std: float = 0.3        # B's std · 1/sqrt(rank): the delta is of the size of W·x


_ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
_FFN = ("ffn_gate", "ffn_up", "ffn_down")
ADAPTERS = {
    # every matmul llama.cpp adapts in a dense model: attention, FFN, the embedding lookup
    # (token_embd: A [r, V] looked up, B [r, E]) and the output
    "qwen3-all": AdapterSpec("qwen3", rank=8, alpha=16.0,
                             targets=_ATTN + _FFN + ("token_embd", "output"), seed=1),
    # a second adapter on the same base: f32 pairs, no alpha (scale alone), some tensors
    "qwen3-attn": AdapterSpec("qwen3", rank=4, alpha=0.0, targets=("attn_q", "attn_v",
                                                                   "attn_output", "ffn_down"),
                              type="f32", seed=2, b_std=0.15),
    # experts (build_lora_mm_id: A [E, r, X], B [r, F, X]), the router and attention
    "mixtral-exps": AdapterSpec("mixtral", rank=8, alpha=8.0,
                                targets=_ATTN + ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                                                 "ffn_down_exps"), seed=3, b_std=0.2),
}
#: case → (base variant, [(adapter, scale), ...])
CASES = {
    "qwen3-all": ("qwen3", [("qwen3-all", 1.0)]),
    "qwen3-all-half": ("qwen3", [("qwen3-all", 0.5)]),
    "qwen3-two": ("qwen3", [("qwen3-all", 0.75), ("qwen3-attn", -1.5)]),
    "mixtral-exps": ("mixtral", [("mixtral-exps", 1.0)]),
}


def _shapes(path: Path) -> dict:
    """{tensor name: ne (ggml order)} of a GGUF."""
    import gguf
    r = gguf.GGUFReader(str(path))
    return {t.name: [int(x) for x in t.shape] for t in r.tensors}


def write_adapter(name: str, base_path: Path, path: Path) -> Path:
    """Write adapter `name` (ADAPTERS) for the base model file base_path to path."""
    import gguf
    s = ADAPTERS[name]
    shapes = _shapes(base_path)
    arch = gguf.GGUFReader(str(base_path)).fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    rng = np.random.default_rng(5000 + s.seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_name(f"pyggml-random-lora-{name}")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", s.alpha)
    dt = np.float16 if s.type == "f16" else np.float32
    r = s.rank
    for tname, ne in shapes.items():
        short = tname.split(".")[2] if tname.startswith("blk.") else tname.split(".")[0]
        if short not in s.targets or not tname.endswith(".weight"):
            continue
        if tname == "token_embd.weight":
            E, V = ne[0], ne[1]
            a = rng.normal(0, 1.0 / math.sqrt(r), (V, r))             # ne [r, V]
            b = rng.normal(0, s.b_std, (E, r))                        # ne [r, E]
        else:
            n_in, n_out = ne[0], ne[1]
            lead = (ne[2],) if len(ne) > 2 else ()
            a = rng.normal(0, 1.0 / math.sqrt(n_in), lead + (r, n_in))     # ne [n_in, r(, X)]
            b = rng.normal(0, s.b_std / math.sqrt(r), lead + (n_out, r))  # ne [r, n_out(, X)]
        w.add_tensor(tname + ".lora_a", a.astype(dt))
        w.add_tensor(tname + ".lora_b", b.astype(dt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_models(out: Path) -> dict[str, Path]:
    """The base variants and adapters into `out`; {file stem: path}."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_arch_models as M
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokens.txt").write_text(" ".join(map(str, M.TOKENS)) + "\n")
    paths = {}
    for v in sorted({b for b, _ in CASES.values()}):
        paths[v] = M.write_variant(v, out / f"{v}.gguf")
    for name, s in ADAPTERS.items():
        paths[f"lora-{name}"] = write_adapter(name, paths[s.base], out / f"lora-{name}.gguf")
    return paths


# ---- llama.cpp (the llama-cpp-python venv) -----------------------------------------------------
def _llama(base: Path, adapters, flash_attn: bool, folder: Path):
    import ctypes

    import llama_cpp
    import llama_cpp.llama as L
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False       # see tools/make_arch_refs.py
        return p
    L.llama_cpp.llama_model_default_params = params
    kw = {}
    if len(adapters) == 1:
        kw = {"lora_path": str(folder / f"lora-{adapters[0][0]}.gguf"),
              "lora_scale": adapters[0][1]}
    llm = llama_cpp.Llama(model_path=str(base), n_ctx=N_CTX, n_batch=64, n_ubatch=64,
                          n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                          seed=0, flash_attn=flash_attn, **kw)
    if len(adapters) > 1:
        ptrs = [llama_cpp.llama_adapter_lora_init(llm._model.model,
                                                  str(folder / f"lora-{a}.gguf").encode())
                for a, _ in adapters]
        assert all(ptrs), "an adapter failed to load"
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(ptrs))(*ptrs)
        scales = (ctypes.c_float * len(ptrs))(*[s for _, s in adapters])
        assert llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(ptrs), scales) == 0
        llm._pyggml_adapters = ptrs          # freed with the model
    return llm


def reference(folder: Path, case: str, tokens: list[int]) -> dict:
    base, adapters = CASES[case]
    out = {}
    for fa in (0, 1):
        llm = _llama(folder / f"{base}.gguf", adapters, bool(fa), folder)
        llm.eval(tokens)
        logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
        out[f"{case}.fa{fa}.logits"] = logits.astype(np.float16)
        out[f"{case}.fa{fa}.top_ids"] = top.astype(np.int16)
        out[f"{case}.fa{fa}.top_vals"] = np.take_along_axis(logits, top, 1).astype(np.float32)
        if fa:
            llm.reset()
            llm.eval(tokens[:N_PROMPT])
            greedy, margins = [], []
            for _ in range(N_GREEDY):
                row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
                two = np.sort(row)[-2:]
                t = int(np.argmax(row))
                greedy.append(t)
                margins.append(float(two[1] - two[0]))
                llm.eval([t])
            out[f"{case}.greedy"] = np.array(greedy, np.int32)
            out[f"{case}.greedy_margin"] = np.array(margins, np.float32)
        llm.close()
    return out


def main(argv) -> int:
    if len(argv) < 2 or argv[0] not in ("models", "refs") or \
            (argv[0] == "refs") != (len(argv) == 3):
        print(__doc__)
        return 2
    folder = Path(argv[1])
    if argv[0] == "models":
        for name, p in write_models(folder).items():
            print(f"{p} ({p.stat().st_size} bytes)")
        return 0
    import llama_cpp
    tokens = [int(t) for t in (folder / "tokens.txt").read_text().split()]
    data = {"tokens": np.array(tokens, np.int32),
            "llama_cpp_version": np.array(llama_cpp.__version__)}
    for p in sorted(folder.glob("*.gguf")):
        data[f"{p.stem}.sha256"] = np.array(hashlib.sha256(p.read_bytes()).hexdigest())
    for case in CASES:
        data.update(reference(folder, case, tokens))
        a = data[f"{case}.fa0.logits"].astype(np.float32)
        b = data[f"{case}.fa1.logits"].astype(np.float32)
        print(f"{case}: logits rms {float(np.sqrt((a ** 2).mean())):.3f}, fa0 vs fa1 rms "
              f"{float(np.sqrt(((a - b) ** 2).mean())):.4f}, greedy {data[case + '.greedy']}")
    out = Path(argv[2])
    np.savez_compressed(out, **data)
    print(f"{out}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
