"""Anthropic's Messages API, `POST /v1/messages` and `POST /v1/messages/count_tokens`: a
translation onto the OpenAI chat path (`Server.chat_completion`, pyggml/server/app.py).

Request: `model` (any: the served model answers), `max_tokens` (required; an upper bound: more
than fits after the prompt means until the context is full), `system` (a string or text
blocks), `messages` (`user` / `assistant`, content a string or blocks: `text`, `tool_use`,
`tool_result`, `thinking`; `redacted_thinking` is dropped; images and documents are refused),
`tools` (custom tools: name, description, input_schema), `tool_choice` (auto / any / tool /
none, `disable_parallel_tool_use`), `thinking` (disabled: the template's enable_thinking false;
enabled / adaptive / between_tools: true), `output_config.format` (json_schema: the chat
path's response_format), `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`; llama-server's
sampling extras (`min_p`, `repeat_penalty`, `seed`) pass through. Reply: a `message` with
content blocks `thinking`, `text`, `tool_use`, `stop_reason` (end_turn, max_tokens,
tool_use) and usage (input_tokens without the prefix-cache hits, cache_read_input_tokens).
Streaming: message_start, content_block_start / content_block_delta (text_delta,
thinking_delta, input_json_delta) / content_block_stop, message_delta, message_stop; an error
after the start is an `error` event. Errors: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from starlette.responses import JSONResponse, Response, StreamingResponse

from pyggml.errors import PyggmlError
from pyggml.server.http import BadRequest, _json_body
from pyggml.server.translate import (copy_sampling, arguments_object, chat_with_limit,
                                     chunk_finish, chunk_parts, is_obj, jtype, message_parts,
                                     need, response_error, sse_event, usage_numbers)

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "content_filter": "refusal"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"), "message": message}}


def error_response(status: int, message: str, headers=None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


# ---- request ---------------------------------------------------------------------------------
def _text_of(blocks, field: str) -> str:
    """A string, or text blocks joined (Anthropic's system and tool_result content)."""
    if isinstance(blocks, str):
        return blocks
    need(isinstance(blocks, list), field, f"must be a string or an array of content blocks, "
                                          f"got {jtype(blocks)}")
    parts = []
    for j, b in enumerate(blocks):
        f = f"{field}[{j}]"
        need(is_obj(b), f, f"must be an object, got {jtype(b)}")
        kind = b.get("type")
        if kind == "text":
            need(isinstance(b.get("text"), str), f"{f}.text", "must be a string")
            parts.append(b["text"])
        elif kind in ("image", "document", "search_result"):
            raise BadRequest(f"'{f}': {kind} blocks are not supported (the model reads text)",
                             f"{f}.type")
        else:
            raise BadRequest(f"'{f}.type' must be 'text' here, got {json.dumps(kind)}",
                             f"{f}.type")
    return "\n".join(parts)


def _messages(msgs) -> list[dict]:
    """Anthropic messages as OpenAI chat messages: tool_result blocks become `tool` messages
    (before the user's text of the same turn), tool_use blocks an assistant's tool_calls,
    thinking blocks its reasoning_content."""
    need(isinstance(msgs, list) and len(msgs) > 0, "messages", "must be a non-empty array")
    out: list[dict] = []

    def add(m):
        prev = out[-1] if out else None
        if (prev is not None and prev["role"] == m["role"] and m["role"] in ("user", "assistant")
                and not prev.get("tool_calls") and not m.get("tool_calls")
                and not m.get("reasoning_content")):
            prev["content"] = "\n\n".join(x for x in (prev["content"], m["content"]) if x)
        else:
            out.append(m)

    for i, m in enumerate(msgs):
        f = f"messages[{i}]"
        need(is_obj(m), f, f"must be an object, got {jtype(m)}")
        role, content = m.get("role"), m.get("content")
        need(role in ("user", "assistant"), f"{f}.role",
             f"must be 'user' or 'assistant', got {json.dumps(role)}")
        if isinstance(content, str):
            add({"role": role, "content": content})
            continue
        need(isinstance(content, list), f"{f}.content",
             f"must be a string or an array of content blocks, got {jtype(content)}")
        text, reasoning, calls = [], [], []
        for j, b in enumerate(content):
            fb = f"{f}.content[{j}]"
            need(is_obj(b), fb, f"must be an object, got {jtype(b)}")
            kind = b.get("type")
            if kind == "text":
                need(isinstance(b.get("text"), str), f"{fb}.text", "must be a string")
                text.append(b["text"])
            elif kind == "tool_result" and role == "user":
                need(isinstance(b.get("tool_use_id"), str), f"{fb}.tool_use_id",
                     "must be a string")
                body = b.get("content", "")
                body = _text_of(body, f"{fb}.content") if body is not None else ""
                if b.get("is_error"):
                    body = f"Error: {body}"
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": body})
            elif kind == "tool_use" and role == "assistant":
                need(isinstance(b.get("id"), str), f"{fb}.id", "must be a string")
                need(isinstance(b.get("name"), str) and b["name"], f"{fb}.name",
                     "must be a non-empty string")
                need(is_obj(b.get("input", {})), f"{fb}.input", "must be an object")
                calls.append({"id": b["id"], "type": "function", "function": {
                    "name": b["name"],
                    "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}})
            elif kind == "thinking" and role == "assistant":
                need(isinstance(b.get("thinking"), str), f"{fb}.thinking", "must be a string")
                reasoning.append(b["thinking"])
            elif kind == "redacted_thinking" and role == "assistant":
                pass
            elif kind in ("image", "document", "search_result"):
                raise BadRequest(f"'{fb}': {kind} blocks are not supported (the model reads "
                                 f"text)", f"{fb}.type")
            else:
                allowed = ("'text', 'tool_result'" if role == "user" else
                           "'text', 'tool_use', 'thinking', 'redacted_thinking'")
                raise BadRequest(f"'{fb}.type' must be one of {allowed} in a {role} message, "
                                 f"got {json.dumps(kind)}", f"{fb}.type")
        if role == "user":
            if text or not content:
                add({"role": "user", "content": "\n".join(text)})
        else:
            msg = {"role": "assistant", "content": "\n".join(text)}
            if reasoning:
                msg["reasoning_content"] = "\n".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            add(msg)
    return out


def _tools(tools) -> list[dict]:
    need(isinstance(tools, list), "tools", f"must be an array, got {jtype(tools)}")
    out = []
    for i, t in enumerate(tools):
        f = f"tools[{i}]"
        need(is_obj(t), f, f"must be an object, got {jtype(t)}")
        kind = t.get("type", "custom")
        if kind not in ("custom", None):
            raise BadRequest(f"'{f}.type': {json.dumps(kind)} is one of Anthropic's server or "
                             f"client tools, which this server does not run; declare it as a "
                             f"custom tool with an input_schema", f"{f}.type")
        need(isinstance(t.get("name"), str) and t["name"], f"{f}.name",
             "must be a non-empty string")
        need(is_obj(t.get("input_schema")), f"{f}.input_schema", "must be a JSON schema object")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description") is not None:
            need(isinstance(t["description"], str), f"{f}.description", "must be a string")
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc):
    need(is_obj(tc), "tool_choice", f"must be an object, got {jtype(tc)}")
    kind = tc.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        need(isinstance(tc.get("name"), str) and tc["name"], "tool_choice.name",
             "must be a non-empty string")
        return {"type": "function", "function": {"name": tc["name"]}}
    raise BadRequest(f"'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', got "
                     f"{json.dumps(kind)}", "tool_choice.type")


#: every field of Anthropic's Messages request: honoured (read below), a label that changes no
#: token (type-checked), or refused by name unless it is absent / its "off" value
HONOURED = ("max_tokens", "messages", "system", "tools", "tool_choice", "thinking",
            "output_config", "stop_sequences", "stream", "temperature", "top_p", "top_k")
LABELS = {"model": str, "metadata": dict, "user_profile_id": str, "workspace_id": str,
          "inference_geo": str,
          # a prompt-caching hint: the prefix cache is always on
          "cache_control": dict}
REFUSED = {"container": (None,), "diagnostics": (None,), "service_tier": (None, "auto",
           "standard_only"), "speed": (None, "standard"), "mcp_servers": (None, []),
           "context_management": (None,)}


def _check_fields(body: dict) -> None:
    for name, kind in LABELS.items():
        v = body.get(name)
        need(v is None or isinstance(v, kind), name,
             f"must be {'a string' if kind is str else 'an object'}, got {jtype(v)}")
    for name, off in REFUSED.items():
        if name in body and body[name] not in off:
            raise BadRequest(f"not supported: {name} (this server does not implement it; "
                             f"docs/server.md lists the fields it honours)", name)


def to_chat(body: dict, count_only: bool = False) -> dict:
    """An Anthropic Messages request as an OpenAI chat-completions body (BadRequest naming the
    Anthropic field). count_only: /v1/messages/count_tokens's body (no max_tokens)."""
    _check_fields(body)
    chat: dict = {}
    if not count_only:
        mt = body.get("max_tokens")
        need(isinstance(mt, int) and not isinstance(mt, bool) and mt >= 1, "max_tokens",
             f"is required: an integer >= 1, got {json.dumps(mt)[:40]}")
        chat["max_tokens"] = mt
    msgs = _messages(body.get("messages"))
    system = body.get("system")
    if system is not None:
        s = _text_of(system, "system")
        if s:
            msgs.insert(0, {"role": "system", "content": s})
    chat["messages"] = msgs
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    tc = body.get("tool_choice")
    if tc is not None:
        choice = _tool_choice(tc)
        if "tools" in chat:
            chat["tool_choice"] = choice
        if tc.get("disable_parallel_tool_use") is not None:
            need(isinstance(tc["disable_parallel_tool_use"], bool),
                 "tool_choice.disable_parallel_tool_use", "must be a boolean")
            if "tools" in chat:
                chat["parallel_tool_calls"] = not tc["disable_parallel_tool_use"]
    th = body.get("thinking")
    if th is not None:
        need(is_obj(th), "thinking", f"must be an object, got {jtype(th)}")
        kind = th.get("type")
        need(kind in ("enabled", "disabled", "adaptive", "between_tools"), "thinking.type",
             f"must be 'enabled', 'disabled', 'adaptive' or 'between_tools', got "
             f"{json.dumps(kind)}")
        chat["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
    oc = body.get("output_config")
    if oc is not None:
        need(is_obj(oc), "output_config", f"must be an object, got {jtype(oc)}")
        fmt = oc.get("format")
        if fmt is not None:
            need(is_obj(fmt) and fmt.get("type") == "json_schema", "output_config.format",
                 "must be {\"type\": \"json_schema\", \"schema\": {...}}")
            need(is_obj(fmt.get("schema")), "output_config.format.schema",
                 "must be a JSON schema object")
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": fmt["schema"]}}
    if body.get("stop_sequences") is not None:
        ss = body["stop_sequences"]
        need(isinstance(ss, list) and all(isinstance(s, str) for s in ss), "stop_sequences",
             "must be an array of strings")
        if ss:
            chat["stop"] = ss
    if count_only:
        return chat
    copy_sampling(body, chat, ("temperature", "top_p", "top_k"))
    return chat


# ---- reply -----------------------------------------------------------------------------------
def _usage(usage: dict | None) -> dict:
    n_prompt, n_out, cached = usage_numbers(usage)
    return {"input_tokens": n_prompt - cached, "output_tokens": n_out,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def from_chat(out: dict, model: str) -> dict:
    """A chat.completion dict as an Anthropic `message`."""
    choice = out["choices"][0]
    reasoning, text, calls = message_parts(choice.get("message") or {})
    content = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text or not calls:
        content.append({"type": "text", "text": text})
    for c in calls:
        content.append({"type": "tool_use", "id": c["id"], "name": c["name"],
                        "input": arguments_object(c["arguments"])})
    finish = choice.get("finish_reason")
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": model, "content": content,
            "stop_reason": STOP_REASONS.get(finish, "end_turn"), "stop_sequence": None,
            "usage": _usage(out.get("usage"))}


async def stream_events(chunks, model: str, n_prompt: int):
    """chat.completion.chunk dicts as Anthropic's server-sent events (text lines)."""
    mid = f"msg_{uuid.uuid4().hex}"
    yield sse_event("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
    index, open_key = -1, None          # the open block: its index and (kind, tool index)
    finish, usage, any_block = None, None, False

    def close():
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})

    async for chunk in chunks:
        if "error" in chunk:
            err = chunk["error"]
            if open_key is not None:
                yield close()
            yield sse_event("error", error_body(int(err.get("code") or 500),
                                                str(err.get("message"))))
            return
        for kind, key, part in chunk_parts(chunk):
            if (kind, key) != open_key:
                if open_key is not None:
                    yield close()
                index, open_key, any_block = index + 1, (kind, key), True
                block = ({"type": "text", "text": ""} if kind == "text" else
                         {"type": "thinking", "thinking": "", "signature": ""}
                         if kind == "reasoning" else
                         {"type": "tool_use", "id": part["id"] or f"toolu_{index}",
                          "name": part["name"] or "", "input": {}})
                yield sse_event("content_block_start", {"type": "content_block_start",
                                                        "index": index, "content_block": block})
            if kind == "text":
                delta = {"type": "text_delta", "text": part}
            elif kind == "reasoning":
                delta = {"type": "thinking_delta", "thinking": part}
            elif part["arguments"]:
                delta = {"type": "input_json_delta", "partial_json": part["arguments"]}
            else:
                continue
            yield sse_event("content_block_delta", {"type": "content_block_delta",
                                                    "index": index, "delta": delta})
        finish = chunk_finish(chunk) or finish
        if chunk.get("usage"):
            usage = chunk["usage"]
    if not any_block:           # an empty reply is one empty text block, as Anthropic sends it
        index, open_key = 0, ("text", None)
        yield sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})
    if open_key is not None:
        yield close()
    yield sse_event("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": STOP_REASONS.get(finish, "end_turn"), "stop_sequence": None},
        "usage": _usage(usage)})
    yield sse_event("message_stop", {"type": "message_stop"})


# ---- the endpoints ---------------------------------------------------------------------------
async def messages(server, request) -> Response:
    """POST /v1/messages."""
    try:
        body = await _json_body(request)
        chat = to_chat(body)
        n_prompt = 0
        if chat.get("stream"):
            # message_start carries the prompt's tokens, before the chat path reports them
            from pyggml.server.props import prompt_ids
            n_prompt = len(await asyncio.to_thread(prompt_ids, server, chat))
        out = await chat_with_limit(server, request, chat)
    except BadRequest as e:
        return error_response(e.status, str(e), e.headers)
    except PyggmlError as e:
        return error_response(400, str(e))
    model = body.get("model") if isinstance(body.get("model"), str) else server.model_name
    if isinstance(out, Response):
        if out.status_code == 499:
            return out
        return error_response(*response_error(out))
    if isinstance(out, dict):
        return JSONResponse(from_chat(out, model))
    return StreamingResponse(stream_events(out, model, n_prompt), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def count_tokens(server, request) -> Response:
    """POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt /v1/messages would
    evaluate for the same body."""
    from pyggml.server.props import prompt_ids
    try:
        body = await _json_body(request)
        chat = to_chat(body, count_only=True)
        n = len(await asyncio.to_thread(prompt_ids, server, chat))
    except BadRequest as e:
        return error_response(e.status, str(e), e.headers)
    except PyggmlError as e:
        return error_response(400, str(e))
    return JSONResponse({"input_tokens": n})
