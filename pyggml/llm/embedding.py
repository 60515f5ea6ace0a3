"""Text embeddings of a generative model, as llama.cpp's embedding mode: the final normed
hidden state (the `result_norm` node, before the output matrix) of every token, pooled over
the text (mean, or the last token), L2-normalized (llama-cpp-python's `embed(normalize=True)`).

Each text is evaluated alone in one sequence (its cells are freed afterwards), in ubatches of
at most n_ubatch tokens; the ubatch graph is the model's graph with every row kept and the
normed hidden state marked as an output.
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.base import is_host_tensor, tensor_get
from pyggml.backend.cpu import host_array
from pyggml.errors import ModelError
from pyggml.llm.models import GraphParams, build_graph
from pyggml.offload import pin_phase_ops

POOLINGS = ("mean", "last")


def _hidden_states(llm, ids: list[int], seq_id: int) -> np.ndarray:
    """float32 [n_tokens, n_embd]: the final normed hidden state of every token of `ids`."""
    E = llm.hparams.n_embd
    rows = []
    pos0 = 0
    for i in range(0, len(ids), llm.n_ubatch):
        toks = np.asarray(ids[i:i + llm.n_ubatch], np.int32)
        T = len(toks)
        pos = np.arange(pos0, pos0 + T, dtype=np.int32)
        sids = np.full(T, seq_id, np.int64)
        cells = llm.kv.place(pos, sids)
        n_kv = llm.kv.n_kv()
        gp = GraphParams(T, T, n_kv["full"], n_kv.get("swa", 0))
        g, inp, _ = build_graph(llm.hparams, llm.weights, llm.kv, gp, llm.flash_attn, True,
                                embd_lookup=llm.run.embd_lookup)
        # the node is found once per ubatch graph, not per token
        hidden = next(t for t in g.nodes if t.name == "result_norm").set_output()
        sched = llm.sched["prefill"]
        pin_phase_ops(sched, g, llm.offload, "prefill", llm.weights, n_tokens=T)
        sched.alloc_graph(g)
        views = llm._input_views(inp, T)
        llm._write_inputs(views, toks, pos, sids, cells, np.arange(T, dtype=np.int32), n_kv)
        llm.backend.set_n_threads(llm.backend.n_threads_batch)
        sched.graph_compute(g)
        if is_host_tensor(hidden):
            rows.append(host_array(hidden).reshape(T, E).copy())
        else:
            rows.append(np.frombuffer(tensor_get(hidden, 0, T * E * 4), np.float32).reshape(T, E))
        pos0 += T
    return np.concatenate(rows)


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
                h = _hidden_states(llm, ids, seq_id)
            finally:
                llm.reset(seq_id)
        v = h.mean(axis=0, dtype=np.float64) if pooling == "mean" else h[-1].astype(np.float64)
        if normalize:
            n = np.linalg.norm(v)
            v = v / n if n > 0 else v
        out.append(v.astype(np.float32).tolist())
    return out[0] if single else out
