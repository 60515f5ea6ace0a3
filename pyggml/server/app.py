"""The OpenAI-compatible HTTP API (Starlette): /v1/chat/completions, /v1/completions (both with
server-sent events when `stream` is true, ending in `data: [DONE]`), /v1/embeddings, /v1/models,
/health, /tokenize, /detokenize, /metrics (Prometheus text); the web page (GET /, its assets
under /web/) and the JSON it reads: /v1/pyggml/plan, /v1/pyggml/live (pyggml.server.webapi).

Requests are checked field by field (wrong type or range: 400 naming the field; a field this
server does not implement, set to anything but its "off" value: 400 "not supported: FIELD" —
NOT_SUPPORTED; other unknown fields are ignored, as OpenAI clients expect); sampling defaults are
llama-server's. Errors are
OpenAI-style objects: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from pyggml.errors import ChatTemplateError, GrammarError, ModelError, PyggmlError
from pyggml.llm.completion import (chat_logprobs, completion_logprobs,
                                   normalize_stop, openai_finish_reason, sampling_params)
from pyggml.llm.chatturn import ChatRequestError, ChatTurn
from pyggml.llm.generate import Generation
from pyggml.llm.grammar import constraint_for, request_spec
from pyggml.server import choices, guard, llamacpp_api, lora_api, rerank, webapi
from pyggml.server.http import (DEFAULTS, BadRequest, _json_body, bool_field,  # noqa: F401
                                 error_response, sse)
from pyggml.server.engine import Engine, Job, QueueFullError

# llama-server's sampling defaults
WAIT_POLL_S = 0.25          # how often a waiting non-streamed request checks for a disconnect
WEB_ASSETS = {"index.html": "text/html; charset=utf-8",
              "app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
# the page talks to this server only (a second line of defence behind its own code)
WEB_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PUBLIC_PATHS = ("/", "/health", "/v1/health")       # served without the API key (and /web/*)


def _grammar_param(body: dict, e: GrammarError) -> str:
    """The request field a GrammarError is about (with its path in a schema, if any)."""
    field = next((f for f in ("response_format", "json_schema", "grammar") if f in body),
                 "tools")
    where = getattr(e, "where", None)
    if field == "json_schema" and where and where.startswith("schema"):
        return "json_schema" + where[len("schema"):]
    if field == "response_format" and where and where.startswith("schema"):
        return "response_format.json_schema." + where
    return field


# ---- field checks ----------------------------------------------------------------------------
def _num(body, name, default, lo=None, hi=None, integer=False, lo_open=False):
    v = body.get(name, default)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise BadRequest(f"'{name}' must be {'an integer' if integer else 'a number'}, "
                         f"got {json.dumps(v)[:40]}", name)
    if v != v or v in (float("inf"), float("-inf")):
        raise BadRequest(f"'{name}' must be finite", name)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise BadRequest(f"'{name}' must be {'>' if lo_open else '>='} {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise BadRequest(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def _sampling(body) -> dict:
    return {
        "temperature": _num(body, "temperature", DEFAULTS["temperature"], 0.0, 100.0),
        "top_p": _num(body, "top_p", DEFAULTS["top_p"], 0.0, 1.0),
        "top_k": _num(body, "top_k", DEFAULTS["top_k"], 0, 1 << 20, integer=True),
        "min_p": _num(body, "min_p", DEFAULTS["min_p"], 0.0, 1.0),
        "repeat_penalty": _num(body, "repeat_penalty", DEFAULTS["repeat_penalty"], 0.0,
                               100.0, lo_open=True),
        "seed": _num(body, "seed", None, -(1 << 63), (1 << 64) - 1, integer=True),
        # llama.cpp's penalties sampler (pyggml/llm/sampler.py); OpenAI's range
        "presence_penalty": _num(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _num(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repeat_last_n": _num(body, "repeat_last_n", 64, -1, 1 << 20, integer=True),
        "logit_bias": _logit_bias(body),
        # llama-server's sampler extras (its names, its defaults; pyggml/llm/sampler.py)
        "typical_p": _num(body, "typical_p", 1.0, 0.0, 1.0),
        "mirostat": _num(body, "mirostat", 0, 0, 2, integer=True),
        "mirostat_tau": _num(body, "mirostat_tau", 5.0, 0.0, 1e6),
        "mirostat_eta": _num(body, "mirostat_eta", 0.1, 0.0, 1e6),
        "xtc_probability": _num(body, "xtc_probability", 0.0, 0.0, 1.0),
        "xtc_threshold": _num(body, "xtc_threshold", 0.1, 0.0, 1.0),
        "dry_multiplier": _num(body, "dry_multiplier", 0.0, 0.0, 1e6),
        "dry_base": _dry_base(body),
        "dry_allowed_length": _num(body, "dry_allowed_length", 2, 0, 1 << 20, integer=True),
        "dry_penalty_last_n": _num(body, "dry_penalty_last_n", 64, 0, 1 << 20, integer=True),
        "dry_sequence_breakers": _breakers(body),
        "min_keep": _num(body, "min_keep", 0, 0, 1 << 20, integer=True),
    }


def _dry_base(body) -> float:
    """llama-server's dry_base: a value below 1 means its default, 1.75."""
    v = _num(body, "dry_base", 1.75, 0.0, 1e6)
    return v if v >= 1.0 else 1.75


def _breakers(body):
    """llama-server's dry_sequence_breakers: a list of non-empty strings (None: the defaults)."""
    v = body.get("dry_sequence_breakers")
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) <= 64 and
            all(isinstance(x, str) and 0 < len(x) <= 1000 for x in v)):
        raise BadRequest("'dry_sequence_breakers' must be a list of at most 64 non-empty "
                         "strings", "dry_sequence_breakers")
    return v


def _logit_bias(body) -> tuple:
    """OpenAI's {"token id": bias} (bias -100..100) or llama-server's [[id, bias], ...] (bias
    false: never that token) as (id, bias) pairs; ids beyond the vocabulary are refused when
    sampling starts (ModelError -> 400)."""
    lb = body.get("logit_bias")
    if lb is None:
        return ()
    items = list(lb.items()) if isinstance(lb, dict) else lb
    if not isinstance(items, list):
        raise BadRequest("'logit_bias' must be an object {token id: bias}", "logit_bias")
    out = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise BadRequest("'logit_bias' list items must be [token id, bias]", "logit_bias")
        tok, bias = item
        if isinstance(tok, str) and tok.strip().lstrip("-").isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise BadRequest(f"not supported: logit_bias key {json.dumps(tok)[:40]} (token ids "
                             f"only, as OpenAI's: text keys are not tokenized here)",
                             "logit_bias")
        if bias is False:
            bias = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias \
                or not -100 <= bias <= 100:
            raise BadRequest(f"'logit_bias' values must be numbers in [-100, 100] (or false), got "
                             f"{json.dumps(bias)[:40]}", "logit_bias")
        out.append((tok, float(bias)))
    return tuple(out)


#: request fields this server does not implement, and the values that mean "off" (accepted):
#: any other value is a 400 "not supported: FIELD" (never ignored). docs/server.md has the table.
NOT_SUPPORTED = {
    "suffix": (None, ""), "best_of": (None, 1), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "web_search_options": (None,), "functions": (None, []),
    "function_call": (None, "none", "auto"), "store": (None, False), "service_tier": (
        None, "auto", "default"),
    # llama-server's sampler extras not in pyggml's chain (tfs_z: removed from llama.cpp too)
    "tfs_z": (None, 1, 1.0), "dynatemp_range": (None, 0, 0.0),
    "top_n_sigma": (None, -1, -1.0, 0, 0.0), "samplers": (None,),
    "n_keep": (None, 0, -1), "id_slot": (None, -1),
    "penalize_nl": (None, False), "n_indent": (None, 0), "t_max_predict_ms": (None, 0),
    # OpenAI's newer chat fields with nothing to do here
    "moderation": (None,), "prompt_cache_options": (None,),
    "prompt_cache_retention": (None, "in_memory"), "verbosity": (None, "medium"),
}
#: OpenAI's request fields that only label a request (its model name — one model is served —,
#: end user, metadata for stored completions, a cache-routing key: the prompt cache is always
#: on): type-checked, and they change no token
LABELS = {"model": str, "user": str, "safety_identifier": str, "prompt_cache_key": str,
          "metadata": dict}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _refuse_unsupported(body) -> None:
    def off(v, values):      # equal to an "off" value, and a boolean only where one is listed
        return any(v == o and isinstance(v, bool) == isinstance(o, bool) for o in values)
    for name, values in NOT_SUPPORTED.items():
        if name in body and not off(body[name], values):
            raise BadRequest(f"not supported: {name} (this server does not implement it; "
                             f"docs/server.md lists the fields it honours)", name)


def _embedding_encoder(body):
    """OpenAI's encoding_format: "float" (lists of numbers) or "base64" (the little-endian
    float32 bytes, as OpenAI and llama-server send them); `dimensions` is refused."""
    fmt = body.get("encoding_format", "float")
    if body.get("dimensions") is not None:
        raise BadRequest("not supported: dimensions (embeddings have the model's size)",
                         "dimensions")
    if fmt in (None, "float"):
        return lambda v: v
    if fmt == "base64":
        import base64

        import numpy as np
        return lambda v: base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
    raise BadRequest(f"'encoding_format' must be 'float' or 'base64', got "
                     f"{json.dumps(fmt)[:40]}", "encoding_format")


def _check_labels(body) -> None:
    for name, kind in LABELS.items():
        v = body.get(name)
        if v is not None and not isinstance(v, kind):
            raise BadRequest(f"'{name}' must be {'a string' if kind is str else 'an object'}, "
                             f"got {json.dumps(v)[:40]}", name)
    meta = body.get("metadata") or {}
    if any(not isinstance(v, str) for v in meta.values()):
        raise BadRequest("'metadata' values must be strings", "metadata")


def _template_kwargs(body) -> dict | None:
    """chat_template_kwargs with OpenAI's reasoning_effort read as llama-server reads it: "none"
    turns thinking off (enable_thinking false), another level is passed to the template."""
    kwargs = body.get("chat_template_kwargs")
    effort = body.get("reasoning_effort")
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        raise BadRequest(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, "
                         f"got {json.dumps(effort)[:40]}", "reasoning_effort")
    if kwargs is not None and not isinstance(kwargs, dict):
        return kwargs                   # ChatTurn's 400 names chat_template_kwargs
    kwargs = dict(kwargs or {})
    if effort == "none":
        kwargs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    else:
        kwargs["reasoning_effort"] = effort
    return kwargs


def _common(body, max_default=None):
    _refuse_unsupported(body)
    _check_labels(body)
    n = body.get("n")
    if n is not None and n != 1:
        _num(body, "n", 1, 1, None, integer=True)           # a bad value: the usual message
        raise BadRequest("not supported: n > 1 (one choice per request)", "n")
    mt = body.get("max_completion_tokens", body.get("max_tokens", max_default))
    max_tokens = _num({"max_tokens": mt}, "max_tokens", max_default, -1, 1 << 40, integer=True)
    try:
        stop = normalize_stop(body.get("stop"))
    except ModelError:
        raise BadRequest("'stop' must be a string or a list of strings", "stop") from None
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    return max_tokens, stop, bool_field(body, "stream")


# ---- the app ---------------------------------------------------------------------------------
class Server:
    def __init__(self, llm, engine: Engine, model_name: str, chat_template=None,
                 api_key: str | None = None):
        self.llm, self.engine, self.model_name = llm, engine, model_name
        self.chat_template_spec = chat_template
        self.api_key = api_key
        # a pyggml.llm.grammar.GrammarSpec for requests that bring no constraint (serve -j)
        self.default_grammar = None
        self.slot_save_path = None      # llama-server's --slot-save-path: slot files' folder
        self.t_start = time.time()
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/completions", self.completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/", self.web_page, methods=["GET"]),
            Route("/web/{name}", self.web_asset, methods=["GET"]),
            Route("/v1/pyggml/plan", self.plan, methods=["GET", "POST"]),
            Route("/v1/pyggml/live", self.live, methods=["GET"]),
            Route("/v1/messages", self.anthropic_messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.anthropic_count_tokens, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/responses", self.responses, methods=["POST"]),
            Route("/props", self.props, methods=["GET"]),
            Route("/apply-template", self.apply_template, methods=["POST"]),
            Route("/completion", self._endpoint(llamacpp_api.completion, "completion"),
                  methods=["POST"]),
            Route("/infill", self._endpoint(llamacpp_api.infill, "infill"), methods=["POST"]),
            Route("/slots", self._endpoint(llamacpp_api.slots), methods=["GET"]),
            Route("/lora-adapters", self._endpoint(lora_api.list_adapters), methods=["GET"]),
            Route("/lora-adapters", self._endpoint(lora_api.set_adapters), methods=["POST"]),
            Route("/slots/{id_slot}", self._endpoint(llamacpp_api.slot_action),
                  methods=["POST"]),
            *[Route(p, self._endpoint(rerank.rerank, "rerank"), methods=["POST"])
              for p in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")],
        ]
        self.plans = webapi.PlanCache(llm)
        self.web = _web_assets()
        self.app = Starlette(routes=routes, exception_handlers={
            404: self._not_found, 405: self._not_allowed, BadRequest: self._bad_request,
            PyggmlError: self._pyggml_error, Exception: self._internal_error})
        self.app.add_middleware(_Auth, server=self)
        # outermost: Host / Content-Type checks and the bounded body read (pyggml.server.guard)
        self.limits, self.bind_host = guard.Limits(), "127.0.0.1"
        self.app.add_middleware(guard.Guard, server=self)

    async def _bad_request(self, request, e: BadRequest):
        return error_response(e.status, str(e), e.param, e.kind, e.headers)

    async def _pyggml_error(self, request, e: PyggmlError):
        return error_response(400, str(e))

    async def _internal_error(self, request, e: Exception):
        return error_response(500, f"internal error: {type(e).__name__}: {e}",
                              kind="server_error")

    async def _not_found(self, request, exc):
        return error_response(404, f"no such endpoint: {request.url.path}", kind="not_found")

    async def _not_allowed(self, request, exc):
        return error_response(405, f"{request.method} is not allowed on {request.url.path}")

    def _count(self, endpoint: str) -> None:
        r = self.engine.metrics.requests_total
        r[endpoint] = r.get(endpoint, 0) + 1

    # ---- simple endpoints ------------------------------------------------------------------
    async def health(self, request):
        from pyggml.server.health import health_body
        status, body = health_body(self.llm)
        return JSONResponse(body, status_code=status)

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": int(self.t_start),
             "owned_by": "pyggml", "meta": {"n_ctx": self.llm.n_ctx,
                                            "n_ctx_slot": self.engine.n_ctx_slot,
                                            "n_slots": len(self.engine.slots)}}]})

    async def tokenize(self, request):
        self._count("tokenize")
        body = await _json_body(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string", "content")
        add_special = bool_field(body, "add_special", False)
        ids = self.llm.tokenizer.encode(content, add_special=add_special, parse_special=True)
        if bool_field(body, "with_pieces", False):
            return JSONResponse({"tokens": [
                {"id": i, "piece": self.llm.tokenizer.token_to_piece(i).decode("utf-8", "replace")}
                for i in ids]})
        return JSONResponse({"tokens": ids})

    async def detokenize(self, request):
        self._count("detokenize")
        body = await _json_body(request)
        toks = body.get("tokens")
        V = self.llm.hparams.n_vocab
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                 and 0 <= t < V for t in toks):
            raise BadRequest(f"'tokens' must be a list of token ids in [0, {V})", "tokens")
        return JSONResponse({"content": self.llm.detokenize(toks)})

    async def metrics(self, request):
        m, e = self.engine.metrics, self.engine
        tps = m.generated_tokens_total / m.decode_seconds_total if m.decode_seconds_total else 0.0
        lines, seen = [], set()

        def metric(name, kind, help_, value, labels=""):
            if name not in seen:
                seen.add(name)
                lines.extend([f"# HELP pyggml_{name} {help_}", f"# TYPE pyggml_{name} {kind}"])
            lines.append(f"pyggml_{name}{labels} {value}")
        for ep, n in sorted(m.requests_total.items()) or [("chat", 0)]:
            metric("requests_total", "counter", "Requests received, by endpoint.", n,
                   f'{{endpoint="{ep}"}}')
        metric("requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
               m.requests_rejected_total)
        metric("requests_cancelled_total", "counter", "Requests whose client went away.",
               m.requests_cancelled_total)
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", m.prompt_tokens_total)
        metric("prompt_tokens_reused_total", "counter",
               "Prompt tokens kept from a slot's prefix cache.", m.prompt_tokens_reused_total)
        metric("tokens_predicted_total", "counter", "Tokens generated.", m.generated_tokens_total)
        metric("decode_steps_total", "counter", "decode_batch calls of the decode loop.",
               m.decode_steps_total)
        metric("decode_steps_multi_seq_total", "counter",
               "Decode steps that carried two or more sequences.", m.decode_steps_multi_seq_total)
        metric("decode_max_seqs_per_step", "gauge", "Most sequences in one decode step.",
               m.max_seqs_per_step)
        metric("predicted_tokens_seconds", "gauge",
               "Generated tokens per second of decode-loop time.", f"{tps:.3f}")
        metric("draft_tokens_total", "counter", "Tokens drafted (speculative decoding).",
               m.draft_tokens_total)
        metric("draft_accepted_tokens_total", "counter",
               "Drafted tokens the model accepted (speculative decoding).",
               m.draft_accepted_total)
        metric("queue_length", "gauge", "Requests waiting for a slot.", e.queue_length())
        metric("slots_busy", "gauge", "Slots serving a request.", e.busy_slots())
        metric("slots_total", "gauge", "Slots (sequences of the KV cache).", len(e.slots))
        metric("kv_cells_used", "gauge", "KV cache cells in use.", self.llm.kv.n_used())
        metric("kv_cells_total", "gauge", "KV cache cells.", self.llm.n_ctx)
        return PlainTextResponse("\n".join(lines) + "\n",
                                 media_type="text/plain; version=0.0.4")

    # ---- the web page and its JSON ---------------------------------------------------------
    async def web_page(self, request):
        return self._asset("index.html")

    async def web_asset(self, request):
        name = request.path_params["name"]
        if name not in self.web or name == "index.html":
            return error_response(404, f"no such file: /web/{name}", kind="not_found")
        return self._asset(name)

    def _asset(self, name: str) -> Response:
        return Response(self.web[name], media_type=WEB_ASSETS[name],
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": WEB_CSP,
                                 "X-Content-Type-Options": "nosniff"})

    async def plan(self, request):
        self._count("plan")
        if request.method == "GET":
            return JSONResponse(await asyncio.to_thread(self.plans.running))
        body = await _json_body(request)
        try:
            return JSONResponse(await asyncio.to_thread(self.plans.what_if, body))
        except webapi.PlanRequestError as e:
            raise BadRequest(str(e), e.param) from None
        except webapi.PlannerBusy as e:
            raise BadRequest(f"planner busy: {e}", status=503, kind="server_busy",
                             headers={"Retry-After": "1"}) from None

    async def live(self, request):
        return JSONResponse(webapi.live_json(self))

    # ---- other chat-shaped APIs, translated onto chat_completion ---------------------------
    async def anthropic_messages(self, request):
        from pyggml.server import anthropic_api
        self._count("messages")
        return await anthropic_api.messages(self, request)

    async def anthropic_count_tokens(self, request):
        from pyggml.server import anthropic_api
        return await anthropic_api.count_tokens(self, request)

    async def responses(self, request):
        from pyggml.server import responses_api
        self._count("responses")
        return await responses_api.responses(self, request)

    async def props(self, request):
        from pyggml.server import props
        return await props.get_props(self, request)

    def _endpoint(self, handler, counted: str | None = None):
        """A route's endpoint for handler(server, request) of an API module (counted in
        /metrics' requests under `counted`)."""
        async def endpoint(request):
            if counted is not None:
                self._count(counted)
            return await handler(self, request)
        return endpoint

    async def apply_template(self, request):
        from pyggml.server import props
        return await props.apply_template(self, request)

    # ---- generation ------------------------------------------------------------------------
    def _generation(self, ids, body, max_default, n_logprobs, token_filter=None,
                    prompt_field: str = "prompt") -> tuple[Generation, bool]:
        """The Generation of a request for prompt `ids` (from the body's `prompt_field`, named
        when it cannot fit): max_tokens beyond what fits in the context after the prompt is
        clamped (it ends with "length"), as llama-server's unified cache does."""
        max_tokens, stop, stream = _common(body, max_default)
        n_ctx = self.llm.n_ctx
        if len(ids) >= n_ctx:
            raise BadRequest(f"the prompt has {len(ids)} tokens but the context holds {n_ctx} "
                             f"(n_ctx, shared by the {len(self.engine.slots)} slots): at least "
                             f"one more token must fit", prompt_field,
                             kind="context_length_exceeded")
        room = n_ctx - len(ids)
        budget = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        try:
            params = sampling_params(**_sampling(body))
        except ModelError as e:
            raise BadRequest(str(e)) from None
        if self.llm.speculator is not None and not params.fixed_distribution:
            field = "mirostat" if params.mirostat else "xtc_probability"
            raise BadRequest(f"not supported: {field} with speculative decoding (this server "
                             f"drafts: mirostat and XTC draw their own tokens)", field)
        bad = [t for t, _ in params.logit_bias if t >= self.llm.hparams.n_vocab]
        if bad:
            raise BadRequest(f"'logit_bias': token id {bad[0]} is outside the vocabulary "
                             f"(n_vocab {self.llm.hparams.n_vocab})", "logit_bias")
        stop_at_eog = not bool_field(body, "ignore_eos", False)       # llama-server's extra field
        lora = lora_api.request_scales(self.llm, body)          # llama-server's "lora" field
        return Generation(self.llm.tokenizer, ids, budget, params, stop, n_logprobs,
                          stop_at_eog, token_filter=token_filter, lora=lora), stream

    def _submit(self, job: Job, choice=None) -> None:
        """Hand a job to the engine; choice: its Group member when it is one of n choices
        (pyggml/server/choices.py: submitted together, the prompt evaluated once)."""
        if job.kind == "complete" and not job.ids:
            raise BadRequest("the prompt is empty (the chat template rendered nothing, or it "
                             "tokenizes to no tokens)")
        if choice is not None:
            return choice(job, self._submit)
        try:
            self.engine.submit(job)
        except QueueFullError as e:
            raise BadRequest(f"server busy: {e}; retry later", status=503, kind="server_busy",
                             headers={"Retry-After": "1"}) from None

    async def _collect_text(self, request, job, gen):
        """(the generated text pieces, None), or (None, the response to send instead: the
        job's error, or 499 when the client went away)."""
        text = []
        async for ev in self._events(request, job, False):
            if ev[0] == "text":
                text.append(ev[1])
            elif ev[0] == "error":
                return None, error_response(ev[1], ev[2], kind="server_error")
        if not gen.done:
            return None, Response(status_code=499)
        return text, None

    async def _events(self, request, job: Job, streaming: bool):
        """The job's events; a client that goes away cancels it."""
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(job.events.get(), WAIT_POLL_S)
                except asyncio.TimeoutError:
                    if not streaming and await request.is_disconnected():
                        return
                    continue
                yield ev
                if ev[0] in ("done", "error", "embeddings"):
                    return
        finally:
            if not job.cancelled.is_set():
                job.cancelled.set()
                self.engine.wake()

    def _new_job(self, ids, gen) -> Job:
        return Job("complete", asyncio.get_running_loop(), asyncio.Queue(), ids=ids, gen=gen)

    @staticmethod
    def _usage(job: Job) -> dict:
        n_p, n_c = len(job.ids), len(job.gen.tokens)
        return {"prompt_tokens": n_p, "completion_tokens": n_c, "total_tokens": n_p + n_c,
                "prompt_tokens_details": {"cached_tokens": job.n_reused}}

    async def chat(self, request):
        self._count("chat")
        return _sent(await self.chat_completion(request, await _json_body(request)))

    async def chat_completion(self, request, body: dict, choice=None):
        """One chat completion request (OpenAI's body, checked here): the chat.completion
        dict, or with "stream" an async iterator of chat.completion.chunk dicts (an error
        after the start comes as an {"error": ...} item), or a Response to send instead (the
        job's error, 499 when the client went away). BadRequest for a bad body. The other
        chat-shaped APIs (/v1/messages, /v1/responses) translate onto this."""
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        if choices.wanted(body):            # n > 1: n one-choice requests, merged
            bodies = choices.choice_bodies(body, len(self.engine.slots))
            group = choices.members(len(bodies), len(bodies))
            if bool_field(body, "stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return choices.merged_stream([await self.chat_completion(request, b, c)
                                              for b, c in zip(bodies, group)], usage,
                                             len(bodies))
            return await choices.merged([self.chat_completion(request, b, c)
                                         for b, c in zip(bodies, group)], len(bodies))
        # rendering and compiling a grammar take a while (the first grammar for a model
        # builds its vocabulary table): off the event loop
        turn, token_filter = await asyncio.to_thread(self._chat_turn, body)
        ids = turn.ids
        logprobs = bool_field(body, "logprobs", False)
        top = _num(body, "top_logprobs", 0, 0, 20, integer=True)
        gen, stream = self._generation(ids, body, None, top if logprobs else None,
                                       token_filter, "messages")
        job = self._new_job(ids, gen)
        self._submit(job, choice)
        cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta, finish):
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": self.model_name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}
        if stream:
            async def chunks():
                yield chunk({"role": "assistant", "content": ""}, None)
                async for ev in self._events(request, job, True):
                    if ev[0] == "text":
                        for d in turn.feed(ev[1]):
                            yield chunk(d, None)
                    elif ev[0] == "done":
                        for d in turn.finish():
                            yield chunk(d, None)
                        last = chunk({}, turn.finish_reason(gen))
                        last["usage"] = self._usage(job)
                        yield last
                        if include_usage:
                            u = chunk({}, None)
                            u["choices"], u["usage"] = [], self._usage(job)
                            yield u
                    elif ev[0] == "error":
                        yield {"error": {"message": ev[2], "type": "server_error",
                                         "code": ev[1]}}
            return chunks()
        text, failed = await self._collect_text(request, job, gen)
        if failed is not None:
            return failed
        for piece in text:
            turn.feed(piece)
        turn.finish()
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": self.model_name,
            "choices": [{"index": 0, "message": turn.message(),
                         "logprobs": chat_logprobs(gen) if logprobs else None,
                         "finish_reason": turn.finish_reason(gen)}],
            "usage": self._usage(job)}

    def _own_or_default(self, body: dict) -> dict:
        """The request's constraint fields, or the server's default grammar (--grammar, -j)
        when it brings none (and no tools)."""
        fields = {k: body.get(k) for k in ("grammar", "json_schema", "response_format")}
        default = self.default_grammar
        if default is not None and not body.get("tools") and all(
                v is None or (k == "response_format" and v == {"type": "text"})
                for k, v in fields.items()):
            fields["grammar"], fields["response_format"] = default, None
        return fields

    def _constraint(self, body: dict):
        """The token filter of a completion body's grammar / json_schema / response_format."""
        try:
            f = self._own_or_default(body)
            return constraint_for(self.llm, request_spec(f["grammar"], f["json_schema"],
                                                         f["response_format"]))
        except GrammarError as e:
            raise BadRequest(str(e), _grammar_param(body, e)) from None

    def _chat_turn(self, body: dict):
        """(ChatTurn, its token filter) of a chat body; BadRequest naming the field."""
        try:
            template = self.llm.get_chat_template(self.chat_template_spec)
            turn = ChatTurn(self.llm, template, body["messages"], tools=body.get("tools"),
                            tool_choice=body.get("tool_choice"),
                            parallel_tool_calls=body.get("parallel_tool_calls"),
                            **self._own_or_default(body),
                            chat_template_kwargs=_template_kwargs(body),
                            reasoning_format=body.get("reasoning_format"),
                            reasoning_budget=body.get("reasoning_budget"))
            return turn, turn.token_filter()
        except ChatTemplateError as e:
            raise BadRequest(str(e), "messages") from None
        except ChatRequestError as e:
            raise BadRequest(str(e), e.param) from None
        except GrammarError as e:
            raise BadRequest(str(e), _grammar_param(body, e)) from None

    async def completions(self, request):
        self._count("completions")
        return _sent(await self.text_completion(request, await _json_body(request)))

    async def text_completion(self, request, body: dict, choice=None):
        """One completions request (OpenAI's legacy body, checked here): the text_completion
        dict, or with "stream" an async iterator of its chunk dicts (an error after the start
        comes as an {"error": ...} item), or a Response to send instead; as chat_completion."""
        batch = choices.prompt_bodies(body, len(self.engine.slots))
        if batch is None and choices.wanted(body):      # n > 1: n one-choice requests
            batch = choices.choice_bodies(body, len(self.engine.slots)), body["n"]
        if batch is not None:                           # ... or several prompts: merged
            bodies, n = batch
            group = choices.members(len(bodies), n)
            if bool_field(body, "stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return choices.merged_stream([await self.text_completion(request, b, c)
                                              for b, c in zip(bodies, group)], usage, n)
            return await choices.merged([self.text_completion(request, b, c)
                                         for b, c in zip(bodies, group)], n)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        V = self.llm.hparams.n_vocab
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("'prompt' must not be empty", "prompt")
            ids = await _tokenize(self.llm, prompt)
        elif (isinstance(prompt, list) and prompt and
              all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in prompt)):
            ids = list(prompt)
        else:
            raise BadRequest(f"'prompt' must be a non-empty string, a list of token ids in "
                             f"[0, {V}), or a list of such prompts", "prompt")
        n_lp = body.get("logprobs", body.get("n_probs"))
        n_lp = None if n_lp is None else _num({"logprobs": n_lp}, "logprobs", 0, 0, 20,
                                               integer=True)
        echo = bool_field(body, "echo", False)
        token_filter = await asyncio.to_thread(self._constraint, body)
        gen, stream = self._generation(ids, body, None, n_lp, token_filter)
        job = self._new_job(ids, gen)
        self._submit(job, choice)
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        prefix = (prompt if isinstance(prompt, str) else self.llm.detokenize(ids)) if echo else ""

        def chunk(text, finish, lp=None):
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": self.model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp,
                                 "finish_reason": finish}]}
        if stream:
            async def chunks():
                if prefix:
                    yield chunk(prefix, None)
                n_seen, off = 0, len(prefix)
                async for ev in self._events(request, job, True):
                    if ev[0] == "text":
                        lp = None
                        if n_lp is not None:
                            lps = gen.token_logprobs[n_seen:]
                            n_seen += len(lps)
                            lp = completion_logprobs(lps, off)
                        off += len(ev[1])
                        yield chunk(ev[1], None, lp)
                    elif ev[0] == "done":
                        last = chunk("", openai_finish_reason(gen))
                        last["usage"] = self._usage(job)
                        yield last
                    elif ev[0] == "error":
                        yield {"error": {"message": ev[2], "type": "server_error",
                                         "code": ev[1]}}
            return chunks()
        text, failed = await self._collect_text(request, job, gen)
        if failed is not None:
            return failed
        lp = completion_logprobs(gen.token_logprobs, len(prefix)) if n_lp is not None else None
        return {**chunk(prefix + "".join(text), openai_finish_reason(gen), lp),
                "usage": self._usage(job)}

    async def embeddings(self, request):
        self._count("embeddings")
        body = await _json_body(request)
        inp = body.get("input")
        V = self.llm.hparams.n_vocab
        is_ids = lambda x: (isinstance(x, list) and x and all(      # noqa: E731
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in x))
        if isinstance(inp, str) or is_ids(inp):
            items = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(x, str) or is_ids(x) for x in inp):
            items = inp
        else:
            raise BadRequest("'input' must be a string, a list of strings or of token-id lists",
                             "input")
        if any(isinstance(x, str) and not x for x in items):
            raise BadRequest("'input' strings must not be empty", "input")
        if len(items) > 256:
            raise BadRequest(f"'input' has {len(items)} items, at most 256 are taken", "input")
        pooling = body.get("pooling", "mean")
        if pooling not in ("mean", "last"):
            raise BadRequest("'pooling' must be 'mean' or 'last'", "pooling")
        enc = _embedding_encoder(body)
        sizes = await _tokenize(self.llm, items, count=True)
        for k, n in enumerate(sizes):
            if n > self.llm.n_ubatch * 8 or n > self.engine.n_ctx_slot:
                raise BadRequest(f"input {k} has {n} tokens; the limit is "
                                 f"{min(self.llm.n_ubatch * 8, self.engine.n_ctx_slot)}",
                                 "input", kind="context_length_exceeded")
        job = Job("embed", asyncio.get_running_loop(), asyncio.Queue(), texts=items,
                  pooling=pooling)
        self._submit(job)
        async for ev in self._events(request, job, False):
            if ev[0] == "error":
                return error_response(ev[1], ev[2])
            if ev[0] == "embeddings":
                vecs, n = ev[1], ev[2]
                return JSONResponse({"object": "list", "model": self.model_name,
                                     "data": [{"object": "embedding", "index": i,
                                               "embedding": enc(v)}
                                              for i, v in enumerate(vecs)],
                                     "usage": {"prompt_tokens": n, "total_tokens": n}})
        return Response(status_code=499)


async def _tokenize(llm, what, count: bool = False):
    """llm.tokenize(what) (count: the token counts of a list of strings / id lists), off the
    event loop when there is more than a little text (a 10 MB prompt takes seconds)."""
    def run():
        if not count:
            return llm.tokenize(what)
        return [len(llm.tokenize(x)) if isinstance(x, str) else len(x) for x in what]
    n_chars = (len(what) if isinstance(what, str) else
               sum(len(x) for x in what if isinstance(x, str)))
    return run() if n_chars <= 4096 else await asyncio.to_thread(run)


def _web_assets() -> dict[str, bytes]:
    """The page's files, shipped in the package (pyggml/server/web/), read once."""
    from importlib.resources import files
    root = files("pyggml.server") / "web"
    return {name: (root / name).read_bytes() for name in WEB_ASSETS}




def _sent(out):
    """What chat_completion / text_completion returned, as the HTTP response: a Response as
    it is, a dict as JSON, an async iterator of chunk dicts as server-sent events."""
    if isinstance(out, Response):
        return out
    if isinstance(out, dict):
        return JSONResponse(out)

    async def events():
        async for c in out:
            yield sse(c)
    return _event_stream(events())


def _event_stream(events) -> StreamingResponse:
    """Server-sent events from an async iterator of `data:` lines, ended by [DONE]."""
    async def body():
        async for line in events:
            yield line
        yield "data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


class _Auth:
    """ASGI middleware: with an API key, every endpoint but /health and the web page's files
    (which hold no data: the page asks for the key) needs `Authorization: Bearer KEY` (401
    otherwise)."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        key = self.server.api_key
        path = scope.get("path", "")
        if (scope["type"] == "http" and key and path not in PUBLIC_PATHS
                and not path.startswith("/web/")):
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            # Anthropic's clients send the key as x-api-key
            x_key = headers.get(b"x-api-key", b"").decode("latin-1")
            scheme, _, token = auth.strip().partition(" ")
            # the scheme is case-insensitive (RFC 7235); constant-time comparisons
            ok = (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(
                "utf-8", "replace"), key.encode())) or (x_key and hmac.compare_digest(
                    x_key.encode("utf-8", "replace"), key.encode()))
            if not ok:
                resp = error_response(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                      kind="authentication_error")
                return await resp(scope, receive, send)
        await self.app(scope, receive, send)
