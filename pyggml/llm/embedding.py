"""Text embeddings of a generative model, as llama.cpp's embedding mode: the final normed
hidden state (the `result_norm` node, before the output matrix) of every token, pooled over
the text (mean, or the last token), L2-normalized (llama-cpp-python's `embed(normalize=True)`).

Each text is evaluated alone in one sequence (its cells are freed afterwards) by the context's
one ubatch path with output="hidden" (pyggml/llm/context.py): the model's graph with every row
kept and the normed hidden state marked as an output.

Rank pooling (llama.cpp's LLAMA_POOLING_TYPE_RANK, for reranker models such as
Qwen3-Reranker): the last token's normed hidden state through the classifier head
`cls.output.weight` [n_embd, n_cls_out], then a softmax (qwen3's graph applies one); the
relevance score of a (query, document) prompt is the first output. `rerank` formats the prompts
as llama-server's /v1/rerank does and sorts the documents by score.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pyggml import quants
from pyggml.errors import ModelError, UnsupportedTypeError
from pyggml.types import GGMLType

POOLINGS = ("mean", "last", "rank")

#: llama.cpp's llama_pooling_type values (the GGUF's {arch}.pooling_type)
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
#: architectures that pyggml runs and whose graph llama.cpp gives a rank head (cls.output, then
#: a softmax: src/models/qwen3.cpp, llm_graph_context::build_pooling); llama.cpp's other
#: rerankers are BERT-family models (bert, jina-bert-v2, modern-bert, neo-bert), which pyggml
#: does not run
RANK_ARCHS = ("qwen3",)
CLS_OUT = "cls.output.weight"


def embed(llm, texts, pooling: str = "mean", normalize: bool = True, seq_id: int = 0):
    """Embeddings of `texts` (a string or a list of strings / token-id lists): a list of
    float lists (one per text; a single string gives one list of floats). pooling "rank" (a
    reranker model only, else ModelError naming why): the classifier's n_cls_out outputs per
    text, whose first is the relevance score (normalize does not apply)."""
    if pooling not in POOLINGS:
        raise ModelError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    head = rank_head(llm) if pooling == "rank" else None
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
        if pooling == "rank":
            out.append(head.scores(h[-1]))
            continue
        v = h.mean(axis=0, dtype=np.float64) if pooling == "mean" else h[-1].astype(np.float64)
        if normalize:
            n = np.linalg.norm(v)
            v = v / n if n > 0 else v
        out.append(v.astype(np.float32).tolist())
    return out[0] if single else out


@dataclass(frozen=True)
class RankHead:
    """A reranker's classifier head, read from the GGUF."""
    weight: np.ndarray          # the rows of cls.output.weight: [n_cls_out, bytes per row]
    type: GGMLType              # its type (computed with the engine's own dot kernels)
    labels: tuple               # classifier.output_labels (Qwen3-Reranker: "yes", "no")
    template: str | None        # tokenizer.chat_template.rerank: the prompt, {query} {document}
    softmax: bool               # a softmax over the outputs (qwen3's graph has one)

    def scores(self, h: np.ndarray) -> list[float]:
        """The head's outputs for one normed hidden state h F32 [n_embd]: a mul_mat as
        llama.cpp's (h in the weight's vec_dot_type), then the softmax."""
        logits = quants.matvec(self.weight, self.type, np.ascontiguousarray(h, np.float32))
        if self.softmax:
            e = np.exp(logits.astype(np.float64) - float(logits.max()))
            logits = (e / e.sum()).astype(np.float32)
        return [float(x) for x in logits]


def rank_head(llm) -> RankHead:
    """The classifier head of a reranker model; ModelError saying why when the model is none:
    its pooling type is not rank, its architecture has no rank head, or the head is missing or
    malformed. ClosedError after llm.close()."""
    with llm.lock:              # the file stays mapped while it is read (close takes the lock)
        llm.context.check_open()
        return _read_rank_head(llm)


def _read_rank_head(llm) -> RankHead:
    model, hp = llm.file.model, llm.hparams
    name, arch = os.path.basename(llm.path), hp.arch
    key = f"{arch}.pooling_type"
    ptype = model.get(key)
    if ptype != 4:
        found = ("has no " + key if ptype is None else
                 f"has {key} = {ptype} ({POOLING_NAMES.get(ptype, 'unknown')})")
        raise ModelError(f"{name} is not a reranker: it {found}; a reranker's is 4 (rank)")
    if arch not in RANK_ARCHS:
        raise ModelError(f"{name}: architecture {arch} has no rank head (rerankers pyggml runs: "
                         f"{', '.join(RANK_ARCHS)}; BERT-family rerankers are not supported)")
    if CLS_OUT not in model.tensors:
        raise ModelError(f"{name} has pooling type rank but no tensor '{CLS_OUT}' "
                         f"(the classifier head)")
    labels = tuple(model.get(f"{arch}.classifier.output_labels") or ("score",))
    info = model.tensor_info(CLS_OUT)
    ne = list(info.ne[:max(info.n_dims, 1)]) + [1]
    if ne[0] != hp.n_embd or ne[1] != len(labels) or any(x != 1 for x in ne[2:]):
        raise ModelError(f"{name}: tensor '{CLS_OUT}' has shape {ne[:info.n_dims]}, expected "
                         f"[{hp.n_embd}, {len(labels)}] (n_embd, the classifier's labels)")
    rows = np.array(model.tensor_bytes(CLS_OUT)).reshape(len(labels), -1)     # a copy
    try:
        quants.vec_dot_type(info.type)
    except UnsupportedTypeError:
        raise ModelError(f"{name}: tensor '{CLS_OUT}' has type {GGMLType(info.type).name}, "
                         f"which has no dot kernel here") from None
    template = model.get("tokenizer.chat_template.rerank")
    return RankHead(rows, GGMLType(info.type), labels,
                    template if isinstance(template, str) else None, arch in RANK_ARCHS)


def rank_prompt(llm, head: RankHead, query: str, document: str) -> list[int]:
    """The tokens llama-server's /v1/rerank evaluates for (query, document): the model's
    rerank template with {query} and {document} replaced, tokenized without BOS and with
    special tokens parsed; without a template [BOS] query [EOS] [SEP] document [EOS], each
    special token as the vocabulary's add_* flags say (EOS falls back to SEP)."""
    tok = llm.tokenizer
    if head.template is not None:
        text = head.template.replace("{query}", query).replace("{document}", document)
        return tok.encode(text, add_special=False, parse_special=True)
    add_sep = bool(llm.file.model.get("tokenizer.ggml.add_sep_token", False))
    eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
    out = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    out += tok.encode(query, add_special=False, parse_special=False)
    if tok.add_eos and eos is not None:
        out.append(eos)
    if add_sep and tok.sep_id is not None:
        out.append(tok.sep_id)
    out += tok.encode(document, add_special=False, parse_special=False)
    if tok.add_eos and eos is not None:
        out.append(eos)
    return out


def rerank(llm, query: str, documents, top_n: int | None = None) -> list[dict]:
    """llama-server's /v1/rerank in Python: [{"index", "relevance_score"}] of the documents
    (strings), the most relevant first, at most top_n (None: all). ModelError for a model that
    is no reranker, no documents or a prompt longer than the context."""
    head = rank_head(llm)
    if not isinstance(query, str):
        raise ModelError(f"rerank: query must be a string, got {type(query).__name__}")
    docs = list(documents)
    if not docs or not all(isinstance(d, str) for d in docs):
        raise ModelError("rerank: documents must be a non-empty list of strings")
    prompts = [rank_prompt(llm, head, query, d) for d in docs]
    scores = [v[0] for v in embed(llm, prompts, pooling="rank")]
    return ranked(scores, top_n)


def ranked(scores: list[float], top_n: int | None = None) -> list[dict]:
    """[{"index", "relevance_score"}] by score, highest first (ties: the earlier document), at
    most top_n."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if top_n is not None:
        order = order[:max(0, top_n)]
    return [{"index": i, "relevance_score": scores[i]} for i in order]
