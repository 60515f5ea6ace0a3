"""llama-server's reranking endpoint: POST /rerank, /reranking, /v1/rerank, /v1/reranking, for
a reranker model (a GGUF with pooling type rank and a classifier head, such as Qwen3-Reranker:
pyggml/llm/embedding.py `rank_head`). Any other model gets a 400 saying why it is none.

Jina's request (llama-server's default): {model, query, documents: [str], top_n,
return_documents} → {model, object: "list", usage: {prompt_tokens, total_tokens}, results:
[{index, relevance_score[, document: {text}]}]}, the most relevant first, at most top_n.
TEI's request (a `texts` list instead of `documents`, as llama-server reads it): the bare list
[{index, score[, text]}] (`return_text`). Each document is one prompt (the model's rerank
template with the query and the document, or query and document joined by its special
tokens), evaluated as an embedding job on the engine's slots (one prompt per step per slot, so
generations keep flowing) whose output is the head's softmax; the score is its first value.
Fields outside these are refused by name ("not supported: FIELD"), as everywhere in the server.
"""

from __future__ import annotations

import asyncio
import json
import weakref

from starlette.responses import JSONResponse, Response

from pyggml.errors import ModelError
from pyggml.llm.embedding import rank_head, rank_prompt, ranked
from pyggml.server.http import BadRequest, _json_body, bool_field, error_response

#: documents in one request at most (each is a prompt of its own)
MAX_DOCUMENTS = 256
#: fields taken, and those refused unless set to their "off" value
FIELDS = {"model", "query", "documents", "texts", "top_n", "return_documents", "return_text"}
OFF_ONLY = {"raw_scores": (False, None), "truncate": (False, None)}

# per LLM: its RankHead, or the ModelError saying why it is not a reranker (read once)
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def head_of(llm):
    """The model's RankHead; ModelError (cached) when the model is no reranker."""
    got = _HEADS.get(llm)
    if got is None:
        try:
            got = rank_head(llm)
        except ModelError as e:
            got = e
        _HEADS[llm] = got
    if isinstance(got, ModelError):
        raise ModelError(str(got))
    return got




def _check(body: dict) -> tuple[str, list[str], str, int | None]:
    """(query, documents, the documents' field, top_n) of a request; BadRequest naming the
    field that is wrong."""
    for k, v in body.items():
        if k not in FIELDS and not (k in OFF_ONLY and v in OFF_ONLY[k]):
            raise BadRequest(f"not supported: {k}", k)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {json.dumps(model)[:40]}", "model")
    query = body.get("query")
    if query is None:
        raise BadRequest("'query' is required", "query")
    if not isinstance(query, str):
        raise BadRequest(f"'query' must be a string, got {json.dumps(query)[:40]}", "query")
    field = "texts" if "texts" in body and "documents" not in body else "documents"
    docs = body.get(field)
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise BadRequest(f"'{field}' must be a non-empty list of strings", field)
    if len(docs) > MAX_DOCUMENTS:
        raise BadRequest(f"'{field}' has {len(docs)} documents, at most {MAX_DOCUMENTS} are "
                         f"taken", field)
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                              or top_n < 1):
        raise BadRequest(f"'top_n' must be an integer >= 1 (at most the documents are "
                         f"returned), got {json.dumps(top_n)[:40]}", "top_n")
    return query, docs, field, top_n


async def rerank(server, request) -> Response:
    """POST /v1/rerank (and llama-server's other spellings of it)."""
    body = await _json_body(request)
    query, docs, field, top_n = _check(body)
    return_text = bool_field(body, "return_documents" if field == "documents" else "return_text")
    llm = server.llm
    try:            # read once per model (off the event loop: it waits for the model's lock)
        head = head_of(llm) if llm in _HEADS else await asyncio.to_thread(head_of, llm)
    except ModelError as e:
        raise BadRequest(f"reranking needs a reranker model: {e}", "model") from None

    def prompts():
        return [rank_prompt(llm, head, query, d) for d in docs]
    n_chars = len(query) * len(docs) + sum(map(len, docs))
    ids = prompts() if n_chars <= 4096 else await asyncio.to_thread(prompts)
    limit = server.engine.n_ctx_slot
    for k, p in enumerate(ids):
        if len(p) > limit:
            raise BadRequest(f"'{field}'[{k}]: its prompt has {len(p)} tokens; the context "
                             f"holds {limit}", field, kind="context_length_exceeded")
    from pyggml.server.engine import Job
    job = Job("embed", asyncio.get_running_loop(), asyncio.Queue(), texts=ids, pooling="rank")
    server._submit(job)
    async for ev in server._events(request, job, False):
        if ev[0] == "error":
            return error_response(ev[1], ev[2])
        if ev[0] == "embeddings":
            results = ranked([v[0] for v in ev[1]], top_n)
            n = ev[2]
            if field == "texts":            # TEI's shape: the bare list
                return JSONResponse([dict({"index": r["index"], "score": r["relevance_score"]},
                                          **({"text": docs[r["index"]]} if return_text else {}))
                                     for r in results])
            if return_text:
                for r in results:
                    r["document"] = {"text": docs[r["index"]]}
            return JSONResponse({"model": body.get("model") or server.model_name,
                                 "object": "list", "results": results,
                                 "usage": {"prompt_tokens": n, "total_tokens": n}})
    return Response(status_code=499)
