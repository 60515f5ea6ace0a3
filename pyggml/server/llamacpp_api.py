"""llama-server's native endpoints, for clients written against it: POST /completion and
POST /infill (fill-in-the-middle with the model's FIM tokens).

Requests use llama-server's names: `prompt` (a string, a list of token ids, or a mixed list of
strings and ids; a list of such prompts gives one result each, in order), `n_predict` (-1: until
the model stops or the context is full), `stream`, `stop`, `return_tokens`, `cache_prompt`
(the prompt cache is always on: false changes no token), and every sampling and constraint field
/v1/completions takes (the same checks, the same "not supported: FIELD" refusals). Answers have
llama-server's shape: `content`, `tokens`, `stop`, `stop_type` (eos | word | limit),
`stopping_word`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `prompt`, `timings`;
streamed, one `data: {...}` event per piece with `stop: false`, then the final object.

Timings are measured where the request waits: prompt_ms runs from submission to the first
generated piece (queueing included), predicted_ms from there to the end.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

from starlette.responses import JSONResponse, Response

from pyggml.llm.generate import FINISH_STOP
from pyggml.server.http import BadRequest, _json_body, sse

# the chunk separator llama-server puts between extra files when the model has no FIM_SEP token
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
FIM_REPO_NAME = "myproject\n"       # llama-server's repo-level FIM header (not an input there)
FIM_FILE_NAME = "filename\n"        # ... and its name for the file being completed


def _mixed_ids(llm, prompt, field: str) -> list[int]:
    """Token ids of one llama-server prompt: a string (tokenized as /v1/completions does, with
    the model's BOS), a list of ids, or a mixed list (strings tokenized without BOS)."""
    V = llm.hparams.n_vocab

    def tok_id(t):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V:
            raise BadRequest(f"'{field}' token ids must be integers in [0, {V}), got "
                             f"{json.dumps(t)[:40]}", field)
        return t
    if isinstance(prompt, str):
        return llm.tokenize(prompt)
    if isinstance(prompt, list) and prompt:
        ids, first = [], True
        for part in prompt:
            if isinstance(part, str):       # llama-server: BOS before the first string only
                ids += llm.tokenize(part, add_special=first)
                first = False
            else:
                ids.append(tok_id(part))
        return ids
    raise BadRequest(f"'{field}' must be a non-empty string, a list of token ids or of strings "
                     f"and ids, or a list of such prompts", field)


def _prompts(llm, body) -> list[list[int]]:
    """The request's prompts as token ids (several: a list whose items are strings or lists)."""
    prompt = body.get("prompt")
    if prompt in (None, "", []):
        raise BadRequest("'prompt' is required and must not be empty", "prompt")
    several = isinstance(prompt, list) and len(prompt) > 1 and all(
        isinstance(p, (str, list)) for p in prompt) and any(isinstance(p, list) for p in prompt)
    several = several or (isinstance(prompt, list) and len(prompt) > 1
                          and all(isinstance(p, str) for p in prompt))
    items = prompt if several else [prompt]
    if len(items) > 64:
        raise BadRequest(f"'prompt' has {len(items)} prompts, at most 64 are taken", "prompt")
    return [_mixed_ids(llm, p, "prompt") for p in items]


def _openai_fields(body: dict) -> dict:
    """The body with llama-server's names read as /v1/completions' (n_predict -> max_tokens,
    n_probs -> logprobs)."""
    out = dict(body)
    if "n_predict" in body:
        n = body["n_predict"]
        if isinstance(n, bool) or not isinstance(n, int) or n < -2:
            raise BadRequest(f"'n_predict' must be an integer >= -1 (-1: until the end), got "
                             f"{json.dumps(n)[:40]}", "n_predict")
        out["max_tokens"] = None if n < 0 else n
        del out["n_predict"]
    if body.get("cache_prompt") is not None and not isinstance(body["cache_prompt"], bool):
        raise BadRequest("'cache_prompt' must be a boolean", "cache_prompt")
    n_probs = body.get("n_probs")
    if n_probs not in (None, 0):
        raise BadRequest("not supported: n_probs on /completion (/v1/completions' logprobs "
                         "gives the probabilities)", "n_probs")
    for name in ("return_tokens",):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise BadRequest(f"'{name}' must be a boolean", name)
    out.pop("cache_prompt", None)
    out.pop("n_probs", None)
    return out


def _stop_type(gen) -> str:
    if gen.finish_reason == FINISH_STOP:
        return "word" if gen.stopping_word else "eos"
    return "limit" if gen.finish_reason is not None else "none"


class _Run:
    """One prompt's job and the clock of its answer."""

    def __init__(self, server, ids, body, token_filter, index: int):
        self.ids, self.index = ids, index
        self.gen, self.stream = server._generation(ids, body, None, None, token_filter)
        self.job = server._new_job(ids, self.gen)
        self.t0 = time.perf_counter()
        self.t_first = None

    def piece(self, server, text: str) -> dict:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        return {"index": self.index, "content": text, "tokens": [], "stop": False,
                "id_slot": -1, "tokens_predicted": len(self.gen.tokens),
                "tokens_evaluated": len(self.ids)}

    def final(self, server, content: str, return_tokens: bool) -> dict:
        t_end = time.perf_counter()
        t_first = self.t_first or t_end
        gen, n_p = self.gen, len(self.ids)
        n_g = len(gen.tokens) + (gen.eog_token is not None)    # llama-server counts the EOG
        p_ms, g_ms = (t_first - self.t0) * 1e3, (t_end - t_first) * 1e3
        return {
            "index": self.index, "content": content,
            # llama-server lists the end-of-generation token too
            "tokens": (list(gen.tokens) + ([gen.eog_token] if gen.eog_token is not None else [])
                       if return_tokens else []),
            "id_slot": -1, "stop": True, "model": server.model_name,
            "tokens_predicted": n_g, "tokens_evaluated": n_p,
            "generation_settings": {"n_predict": gen.max_tokens if gen.max_tokens is not None
                                    else -1, "stop": list(gen.stop),
                                    "temperature": gen.params.temperature,
                                    "top_k": gen.params.top_k, "top_p": gen.params.top_p,
                                    "min_p": gen.params.min_p,
                                    "repeat_penalty": gen.params.repeat_penalty},
            "prompt": server.llm.detokenize(self.ids, special=True),
            "has_new_line": "\n" in content, "truncated": False,
            "stop_type": _stop_type(gen), "stopping_word": gen.stopping_word,
            "tokens_cached": n_p + n_g,
            "timings": {"prompt_n": n_p - self.job.n_reused, "prompt_ms": p_ms,
                        "prompt_per_token_ms": p_ms / max(n_p - self.job.n_reused, 1),
                        "prompt_per_second": (n_p - self.job.n_reused) / p_ms * 1e3 if p_ms
                        else 0.0,
                        "predicted_n": n_g, "predicted_ms": g_ms,
                        "predicted_per_token_ms": g_ms / max(n_g, 1),
                        "predicted_per_second": n_g / g_ms * 1e3 if g_ms else 0.0}}


async def _answer(server, request, body: dict, prompts: list[list[int]]):
    """Run the prompts (in parallel slots) and answer as llama-server: one object, or a list
    of objects for several prompts; streamed: their pieces as they come, each with its index."""
    body = _openai_fields(body)
    return_tokens = bool(body.get("return_tokens"))
    token_filter = await asyncio.to_thread(server._constraint, body)
    runs = []
    for k, ids in enumerate(prompts):
        if k and token_filter is not None:        # each run has its own grammar state
            token_filter = await asyncio.to_thread(server._constraint, body)
        runs.append(_Run(server, ids, body, token_filter, k))
    for r in runs:
        server._submit(r.job)
    if runs[0].stream:
        return _event_stream(server, request, runs, return_tokens)
    results = await asyncio.gather(*(_collect(server, request, r, return_tokens)
                                     for r in runs))
    failed = next((x for x in results if isinstance(x, Response)), None)
    if failed is not None:
        return failed
    return JSONResponse(results[0] if len(results) == 1 else results)


async def _collect(server, request, run: _Run, return_tokens: bool):
    parts = []
    async for ev in server._events(request, run.job, False):
        if ev[0] == "text":
            run.piece(server, ev[1])
            parts.append(ev[1])
        elif ev[0] == "error":
            from pyggml.server.http import error_response
            return error_response(ev[1], ev[2], kind="server_error")
    if not run.gen.done:
        return Response(status_code=499)
    return run.final(server, "".join(parts), return_tokens)


def _event_stream(server, request, runs, return_tokens: bool):
    from starlette.responses import StreamingResponse

    async def events():
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(run):
            parts = []
            async for ev in server._events(request, run.job, True):
                if ev[0] == "text":
                    parts.append(ev[1])
                    msg = run.piece(server, ev[1])
                    if return_tokens:
                        msg["tokens"] = list(run.gen.tokens[msg["tokens_predicted"] - 1:]
                                             if msg["tokens_predicted"] else [])
                    await queue.put(msg)
                elif ev[0] == "done":
                    await queue.put(run.final(server, "".join(parts), return_tokens)
                                    | {"content": ""})
                elif ev[0] == "error":
                    await queue.put({"error": {"message": ev[2], "type": "server_error",
                                               "code": ev[1]}})
            await queue.put(None)
        tasks = [asyncio.create_task(pump(r)) for r in runs]
        try:
            n_open = len(tasks)
            while n_open:
                msg = await queue.get()
                if msg is None:
                    n_open -= 1
                    continue
                yield sse(msg)
        finally:
            for t in tasks:
                t.cancel()
    # llama-server ends its native stream with the final object, not OpenAI's [DONE]
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def completion(server, request):
    """POST /completion."""
    body = await _json_body(request)
    prompts = await asyncio.to_thread(_prompts, server.llm, body)
    return await _answer(server, request, body, prompts)


def infill_ids(llm, prefix: str, suffix: str, extra: list[dict], prompt_ids: list[int],
               n_batch: int, n_predict: int, n_ctx: int) -> list[int]:
    """The token ids of a fill-in-the-middle request, laid out as llama-server does:
    [FIM_REP]myproject / [FIM_SEP]file, text... (extra files; fill the context's rest) /
    [FIM_SEP]filename / [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]. The prefix
    keeps its last 3/4 of a batch, the suffix its first 1/4 less the prompt and two tokens."""
    tok = llm.tokenizer
    fim = {k: getattr(tok, f"{k}_id", None) for k in ("fim_pre", "fim_suf", "fim_mid",
                                                      "fim_rep", "fim_sep")}

    def text_ids(s: str) -> list[int]:
        return llm.tokenize(s, add_special=False, parse_special=False) if s else []
    extra_ids: list[int] = []
    if fim["fim_rep"] is not None:
        extra_ids += [fim["fim_rep"]] + text_ids(FIM_REPO_NAME)
    for chunk in extra:
        if fim["fim_sep"] is not None:
            extra_ids += [fim["fim_sep"]] + text_ids(chunk.get("filename", "tmp") + "\n")
        else:
            extra_ids += text_ids(SNIPPET_SEPARATOR)
        extra_ids += text_ids(chunk["text"])
    if fim["fim_sep"] is not None:
        extra_ids += [fim["fim_sep"]] + text_ids(FIM_FILE_NAME)
    pre, suf = text_ids(prefix), text_ids(suffix)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [fim["fim_pre"]] + pre[len(pre) - n_pre:] + list(prompt_ids)
    if tok.add_bos and tok.bos_id is not None:
        head = [tok.bos_id] + head
    return (extra_ids[len(extra_ids) - n_extra:] + head + [fim["fim_suf"]] + suf[:n_suf]
            + [fim["fim_mid"]])


async def infill(server, request):
    """POST /infill: input_prefix, input_suffix (required), input_extra ([{filename, text}]),
    prompt (text that starts the middle); then as /completion."""
    llm = server.llm
    tok = llm.tokenizer
    missing = [k for k in ("fim_pre", "fim_suf", "fim_mid") if getattr(tok, f"{k}_id") is None]
    if missing:
        raise BadRequest(f"not supported: infill (the model has no {', '.join(missing)} token)",
                         "input_prefix", status=501)
    body = await _json_body(request)
    for f in ("input_prefix", "input_suffix"):
        if not isinstance(body.get(f), str):
            raise BadRequest(f"'{f}' is required and must be a string", f)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string", "prompt")
    extra = body.get("input_extra", [])
    if not isinstance(extra, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str)
            and isinstance(c.get("filename", ""), str) for c in extra):
        raise BadRequest("'input_extra' must be a list of {\"filename\": string, \"text\": "
                         "string}", "input_extra")
    def ids():
        prompt_ids = llm.tokenize(prompt, add_special=False) if prompt else []
        # llama-server sizes the extra files by its own -n (-1 here, as its default), not by
        # the request's n_predict
        return infill_ids(llm, body["input_prefix"], body["input_suffix"], extra, prompt_ids,
                          llm.n_batch, -1, server.engine.n_ctx_slot)
    return await _answer(server, request, dict(body, prompt=None), [await asyncio.to_thread(ids)])


async def slots(server, request):
    """GET /slots: llama-server's slot monitor (what each slot is doing, no prompt text);
    `?fail_on_no_slot=1` answers 503 when every slot is busy."""
    e = server.engine
    out = []
    for s in e.slots:
        job = s.job
        gen = job.gen if job is not None else None
        params = ({"n_predict": gen.max_tokens if gen.max_tokens is not None else -1,
                   "temperature": gen.params.temperature, "top_k": gen.params.top_k,
                   "top_p": gen.params.top_p, "min_p": gen.params.min_p,
                   "stop": list(gen.stop)} if gen is not None else {})
        n_decoded = len(gen.tokens) if gen is not None else 0
        out.append({"id": s.seq_id, "id_task": -1, "n_ctx": e.n_ctx_slot,
                    "speculative": bool(gen is not None and gen.spec is not None),
                    "is_processing": job is not None, "params": params,
                    "next_token": {"has_next_token": gen is not None and not gen.done,
                                   "has_new_line": gen is not None and "\n" in gen.text,
                                   "n_remain": (gen.max_tokens - n_decoded
                                                if gen is not None and gen.max_tokens is not None
                                                else -1),
                                   "n_decoded": n_decoded,
                                   "stopping_word": gen.stopping_word if gen else ""}})
    if request.query_params.get("fail_on_no_slot") not in (None, "", "0", "false") and \
            all(x["is_processing"] for x in out):
        raise BadRequest("no slot available", status=503, kind="unavailable_error")
    return JSONResponse(out)


SLOT_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")   # a plain file name, no path


async def slot_action(server, request):
    """POST /slots/ID?action=save|restore|erase, as llama-server: save writes the slot's
    sequence (tokens, KV rows, recurrent rows) to --slot-save-path/FILENAME, restore loads one
    back (then a request sharing its prefix reuses it), erase forgets the slot's cells. The slot
    must be idle (409 otherwise); the worker admits nothing while an action runs."""
    from pyggml.llm.state import StateError, load_state, read_state, save_state, write_state
    action = request.query_params.get("action")
    if action not in ("save", "restore", "erase"):
        raise BadRequest(f"'action' must be save, restore or erase, got "
                         f"{json.dumps(action)[:40]}", "action")
    engine = server.engine
    sid = request.path_params.get("id_slot", "")
    slot = next((s for s in engine.slots if str(s.seq_id) == sid), None)
    if slot is None:
        raise BadRequest(f"no slot {sid[:20]!r} (slots 0..{len(engine.slots) - 1})", "id_slot",
                         status=404)
    path = None
    if action != "erase":
        if server.slot_save_path is None:
            raise BadRequest(f"not supported: slot {action} without --slot-save-path (where "
                             f"slot files go)", "action", status=501)
        body = await _json_body(request)
        name = body.get("filename")
        if not isinstance(name, str) or not SLOT_FILE.fullmatch(name):
            raise BadRequest("'filename' must be a plain file name (letters, digits, '.', '_', "
                             "'-'; no path; at most 255)", "filename")
        path = Path(server.slot_save_path) / name

    def run():
        t0 = time.perf_counter()
        with engine._cv:                      # nothing is admitted to a slot meanwhile
            if slot.job is not None:
                raise BadRequest(f"slot {sid} is busy", "id_slot", status=409)
            llm = server.llm
            if action == "erase":
                n = llm.context.seq_len(slot.seq_id)
                llm.context.seq_reset(slot.seq_id)
                return {"id_slot": slot.seq_id, "n_erased": n}
            if action == "save":
                state = save_state(llm, slot.seq_id)
                n_bytes = write_state(state, path)
                return {"id_slot": slot.seq_id, "filename": path.name,
                        "n_saved": state.n_tokens, "n_written": n_bytes,
                        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
            if not path.is_file():
                raise BadRequest(f"no slot file {path.name!r} in --slot-save-path", "filename",
                                 status=404)
            try:
                state = read_state(path)
                load_state(llm, state, slot.seq_id)
            except StateError as e:
                raise BadRequest(f"{path.name}: {e}", "filename") from None
            return {"id_slot": slot.seq_id, "filename": path.name,
                    "n_restored": state.n_tokens, "n_read": path.stat().st_size,
                    "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
    return JSONResponse(await asyncio.to_thread(run))
