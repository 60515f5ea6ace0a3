"""llama.cpp's sampler chain on fixed logits, for tests/test_sampler_chain.py. Run with the
llama-cpp-python interpreter (0.3.36, built from source), never needed by the tests themselves:

    /work/ref/llamacpp-venv/bin/python tools/make_sampler_refs.py \
        ~/.cache/pyggml/models/SmolLM2-135M-Instruct.Q4_1.gguf tests/data/sampler_refs.json

Each case builds the chain common_sampler_init builds (common/sampling.cpp: logit_bias, then
penalties, DRY, top_k, typical_p, top_p, min_p, XTC, temperature, dist; or temperature and
mirostat v1 / v2) from llama.cpp's low-level llama_sampler_* API, accepts a fixed history (the
prompt: penalties and DRY see it), then for each step applies the chain to that step's logits,
records the token it selected and accepts it. The logits of step s are `logits(case_seed, s)`
below (numpy's legacy RandomState, whose stream is frozen across numpy versions, so the test
makes the same rows); a few "hot" tokens get +6 so that tokens repeat and the penalties and DRY
have something to act on. The vocabulary (SmolLM2's, n_vocab 49152) is only used to tokenize
DRY's sequence breakers; the test loads the same file.
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

N_STEPS = 24
HOT = [28, 29, 30, 31, 32, 33, 34, 35, 198, 42, 44]      # hot tokens (198: "\n" and friends)
PROMPT = [28, 29, 30, 31, 198, 28, 29, 30, 31, 198, 28, 29, 30]

# name -> params (llama.cpp's common defaults for what is not named; seed 1234)
CASES = {
    "default": {},
    "no_topk_unsorted_minp": {"top_k": 0, "top_p": 1.0, "min_p": 0.05, "temperature": 1.0},
    "no_topk_top_p": {"top_k": 0, "top_p": 0.9, "min_p": 0.0, "temperature": 1.2},
    "typical": {"typical_p": 0.7, "temperature": 1.0},
    "typical_top_k100": {"top_k": 100, "typical_p": 0.5, "min_p": 0.0, "temperature": 1.3},
    "typical_greedy": {"typical_p": 0.3, "temperature": 0.0},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1, "temperature": 1.0},
    "xtc_always_greedy": {"xtc_probability": 1.0, "xtc_threshold": 0.05, "temperature": 0.0},
    "mirostat1": {"mirostat": 1, "mirostat_tau": 5.0, "mirostat_eta": 0.1},
    "mirostat1_hot": {"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.3,
                      "temperature": 1.0},
    "mirostat2": {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2, "temperature": 1.0},
    "mirostat2_bias": {"mirostat": 2, "logit_bias": [[30, 3.0], [31, -100.0]]},
    "dry_no_breakers": {"dry_multiplier": 0.8, "dry_sequence_breakers": [],
                        "temperature": 0.0},
    "dry_no_breakers_sampled": {"dry_multiplier": 1.5, "dry_base": 2.0, "dry_allowed_length": 1,
                                "dry_sequence_breakers": [], "temperature": 1.0},
    "dry_default_breakers": {"dry_multiplier": 0.8, "temperature": 0.0},
    "dry_breakers_long": {"dry_multiplier": 1.0, "dry_allowed_length": 3,
                          "dry_penalty_last_n": 16, "temperature": 0.7,
                          "dry_sequence_breakers": ["\n", "The end", "ing."]},
    "everything": {"repeat_penalty": 1.1, "frequency_penalty": 0.3, "presence_penalty": 0.2,
                   "dry_multiplier": 0.5, "typical_p": 0.9, "xtc_probability": 0.3,
                   "xtc_threshold": 0.2, "min_keep": 2, "logit_bias": [[44, 2.0]],
                   "temperature": 0.9},
}
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
            "repeat_penalty": 1.0, "repeat_last_n": 64, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "dry_multiplier": 0.0,
            "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
            "dry_sequence_breakers": ["\n", ":", "\"", "*"], "min_keep": 0, "logit_bias": [],
            "seed": 1234}


def logits(case_seed: int, step: int, n_vocab: int) -> np.ndarray:
    """Step `step`'s logits (float32 [n_vocab]); the test has the same function."""
    x = np.random.RandomState(case_seed * 1000 + step).standard_normal(n_vocab) * 2.0
    x[HOT] += 6.0
    return x.astype(np.float32)


def chain(L, vocab, n_vocab: int, p: dict):
    ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda s: L.llama_sampler_chain_add(ch, s)    # noqa: E731
    if p["logit_bias"]:
        arr = (L.llama_logit_bias * len(p["logit_bias"]))(
            *[L.llama_logit_bias(t, b) for t, b in p["logit_bias"]])
        add(L.llama_sampler_init_logit_bias(n_vocab, len(p["logit_bias"]), arr))
    if p["mirostat"] == 0:
        add(L.llama_sampler_init_penalties(n_vocab, p["repeat_last_n"], p["repeat_penalty"],
                                           p["frequency_penalty"], p["presence_penalty"]))
        br = [s.encode() for s in p["dry_sequence_breakers"]]
        c_br = (ctypes.c_char_p * max(len(br), 1))(*br)
        add(L.llama_sampler_init_dry(vocab, p["dry_multiplier"], p["dry_base"],
                                     p["dry_allowed_length"], p["dry_penalty_last_n"], c_br,
                                     len(br)))
        add(L.llama_sampler_init_top_k(p["top_k"]))
        add(L.llama_sampler_init_typical(p["typical_p"], p["min_keep"]))
        add(L.llama_sampler_init_top_p(p["top_p"], p["min_keep"]))
        add(L.llama_sampler_init_min_p(p["min_p"], p["min_keep"]))
        add(L.llama_sampler_init_xtc(p["xtc_probability"], p["xtc_threshold"], p["min_keep"],
                                     p["seed"]))
        add(L.llama_sampler_init_temp_ext(p["temperature"], 0.0, 1.0))
        add(L.llama_sampler_init_dist(p["seed"]))
    else:
        add(L.llama_sampler_init_temp(p["temperature"]))
        if p["mirostat"] == 1:
            add(L.llama_sampler_init_mirostat(n_vocab, p["seed"], p["mirostat_tau"],
                                              p["mirostat_eta"], 100))
        else:
            add(L.llama_sampler_init_mirostat_v2(p["seed"], p["mirostat_tau"],
                                                 p["mirostat_eta"]))
    return ch


def run_case(L, vocab, n_vocab: int, case_seed: int, p: dict) -> list[int]:
    ch = chain(L, vocab, n_vocab, p)
    for t in PROMPT:
        L.llama_sampler_accept(ch, t)
    out = []
    for step in range(N_STEPS):
        row = logits(case_seed, step, n_vocab)
        data = (L.llama_token_data * n_vocab)()
        for i in range(n_vocab):
            data[i].id, data[i].logit, data[i].p = i, float(row[i]), 0.0
        arr = L.llama_token_data_array(data, n_vocab, -1, False)
        L.llama_sampler_apply(ch, ctypes.byref(arr))
        assert 0 <= arr.selected < arr.size, (p, step, arr.selected)
        tok = int(arr.data[arr.selected].id)
        L.llama_sampler_accept(ch, tok)
        out.append(tok)
    L.llama_sampler_free(ch)
    return out


def main(model_path: str, out_path: str) -> None:
    import llama_cpp
    import llama_cpp as L
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cases = {}
    for k, (name, over) in enumerate(CASES.items()):
        p = dict(DEFAULTS, **over)
        cases[name] = {"params": p, "case_seed": k + 1,
                       "tokens": run_case(L, vocab, n_vocab, k + 1, p)}
        print(name, cases[name]["tokens"])
    L.llama_model_free(model)
    with open(out_path, "w") as f:
        json.dump({"llama_cpp_version": llama_cpp.__version__, "n_vocab": n_vocab,
                   "n_steps": N_STEPS, "hot": HOT, "prompt": PROMPT, "cases": cases}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
