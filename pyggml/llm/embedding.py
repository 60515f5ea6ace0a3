"""Text embeddings of a generative model, as llama.cpp's embedding mode: the final normed
hidden state (the `result_norm` node, before the output matrix) of every token, pooled over
the text (mean, or the last token), L2-normalized (llama-cpp-python's `embed(normalize=True)`).

Each text is evaluated alone in one sequence (its cells are freed afterwards) by the context's
one ubatch path with output="hidden" (pyggml/llm/context.py): the model's graph with every row
kept and the normed hidden state marked as an output.
"""

from __future__ import annotations

import numpy as np

from pyggml.errors import ModelError

POOLINGS = ("mean", "last")


def embed(llm, texts, pooling: str = "mean", normalize: bool = True, seq_id: int = 0):
    """Embeddings of `texts` (a string or a list of strings / token-id lists): a list of
    float lists (one per text; a single string gives one list of floats)."""
    if pooling not in POOLINGS:
        raise ModelError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    single = isinstance(texts, str)
    items = [texts] if single else list(texts)
    if not items:
        raise ModelError("embed: no input texts")
    out = []
    for k, text in enumerate(items):
        ids = llm.tokenize(text) if isinstance(text, str) else [int(t) for t in text]
        if not ids:
            raise ModelError(f"embed: input {k} has no tokens")
        if len(ids) > llm.n_ctx:
            raise ModelError(f"embed: input {k} has {len(ids)} tokens, more than the context "
                             f"of {llm.n_ctx} (n_ctx)")
        with llm.lock:                 # one evaluation at a time (LLM's lock is reentrant)
            llm.reset(seq_id)
            try:
                h = llm.context.decode([(ids, seq_id)], output="hidden")[seq_id]
            finally:
                llm.reset(seq_id)
        v = h.mean(axis=0, dtype=np.float64) if pooling == "mean" else h[-1].astype(np.float64)
        if normalize:
            n = np.linalg.norm(v)
            v = v / n if n > 0 else v
        out.append(v.astype(np.float32).tolist())
    return out[0] if single else out
