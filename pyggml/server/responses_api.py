"""OpenAI's Responses API, `POST /v1/responses`, stateless: a translation onto the chat path
(`Server.chat_completion`, pyggml/server/app.py).

Request: `input` (a string, or items: messages with role user / assistant / system / developer
and content a string or input_text / output_text parts; `function_call` and
`function_call_output` items; `reasoning` items, whose text goes back as the next assistant
turn's reasoning_content), `instructions` (a system message first), `tools` (function tools:
name, description, parameters), `tool_choice` (auto / none / required / {"type": "function",
"name"}), `parallel_tool_calls`, `max_output_tokens` (an upper bound), `temperature`,
`top_p`, `text.format` (text / json_object / json_schema: the chat path's response_format),
`reasoning.effort` ("none" turns the template's enable_thinking off), `stream`, `metadata`
(echoed); llama-server's sampling extras (top_k, min_p, repeat_penalty, seed) pass through.
Nothing is stored: `previous_response_id`, `conversation`, `background` and item references
are refused (400). Reply: a `response` whose `output` holds a `reasoning` item, a `message`
(output_text) and `function_call` items; status `completed`, or `incomplete` with
incomplete_details.reason `max_output_tokens`. Streaming events: response.created,
response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta / .done, response.reasoning_text.delta / .done,
response.function_call_arguments.delta / .done, response.content_part.done,
response.output_item.done, response.completed (or response.incomplete; an error after the
start: response.failed)."""

from __future__ import annotations

import json
import time
import uuid

from starlette.responses import JSONResponse, Response, StreamingResponse

from pyggml.server.http import BadRequest, _json_body, error_response
from pyggml.server.translate import (copy_sampling, chat_with_limit, chunk_finish,
                                     chunk_parts, is_obj, jtype, message_parts, need,
                                     response_error, sse_event, usage_numbers)

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


# ---- request ---------------------------------------------------------------------------------
def _content_text(content, field: str, role: str) -> str:
    if isinstance(content, str):
        return content
    need(isinstance(content, list), field, f"must be a string or an array of content parts, "
                                           f"got {jtype(content)}")
    parts = []
    for j, p in enumerate(content):
        f = f"{field}[{j}]"
        need(is_obj(p), f, f"must be an object, got {jtype(p)}")
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            need(isinstance(p.get("text"), str), f"{f}.text", "must be a string")
            parts.append(p["text"])
        elif kind == "refusal":
            need(isinstance(p.get("refusal"), str), f"{f}.refusal", "must be a string")
            parts.append(p["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise BadRequest(f"'{f}': {kind} parts are not supported (the model reads text)",
                             f"{f}.type")
        else:
            raise BadRequest(f"'{f}.type' must be 'input_text' or 'output_text', got "
                             f"{json.dumps(kind)}", f"{f}.type")
    return "\n".join(parts)


def _input(inp) -> list[dict]:
    """`input` as OpenAI chat messages: consecutive function_call items join one assistant
    message's tool_calls (the assistant message just before them, if any), a
    function_call_output item is a `tool` message."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    need(isinstance(inp, list) and len(inp) > 0, "input",
         "must be a string or a non-empty array of items")
    out: list[dict] = []
    reasoning: list[str] = []
    for i, item in enumerate(inp):
        f = f"input[{i}]"
        need(is_obj(item), f, f"must be an object, got {jtype(item)}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            need(role in ROLES, f"{f}.role", f"must be 'user', 'assistant', 'system' or "
                                             f"'developer', got {json.dumps(role)}")
            msg = {"role": ROLES[role],
                   "content": _content_text(item.get("content"), f"{f}.content", role)}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "\n".join(reasoning), []
            out.append(msg)
        elif kind == "function_call":
            need(isinstance(item.get("call_id"), str) and item["call_id"], f"{f}.call_id",
                 "must be a non-empty string")
            need(isinstance(item.get("name"), str) and item["name"], f"{f}.name",
                 "must be a non-empty string")
            args = item.get("arguments", "{}")
            need(isinstance(args, str), f"{f}.arguments", "must be a string (JSON)")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": args}}
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and not reasoning:
                prev.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = "\n".join(reasoning), []
                out.append(msg)
        elif kind == "function_call_output":
            need(isinstance(item.get("call_id"), str) and item["call_id"], f"{f}.call_id",
                 "must be a non-empty string")
            body = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _content_text(body, f"{f}.output", "tool")})
        elif kind == "reasoning":
            texts = []
            for key in ("content", "summary"):
                if item.get(key):
                    texts.append(_content_text(item[key], f"{f}.{key}", "assistant"))
                    break
            reasoning.extend(t for t in texts if t)
        elif kind == "item_reference":
            raise BadRequest(f"'{f}': item references need stored responses; this server "
                             f"stores nothing: send the items themselves", f"{f}.type")
        else:
            raise BadRequest(f"'{f}.type' must be 'message', 'function_call', "
                             f"'function_call_output' or 'reasoning', got {json.dumps(kind)}",
                             f"{f}.type")
    return out


def _tools(tools) -> list[dict]:
    need(isinstance(tools, list), "tools", f"must be an array, got {jtype(tools)}")
    out = []
    for i, t in enumerate(tools):
        f = f"tools[{i}]"
        need(is_obj(t), f, f"must be an object, got {jtype(t)}")
        if t.get("type") != "function":
            raise BadRequest(f"'{f}.type': only function tools are supported, got "
                             f"{json.dumps(t.get('type'))}", f"{f}.type")
        need(isinstance(t.get("name"), str) and t["name"], f"{f}.name",
             "must be a non-empty string")
        fn = {"name": t["name"]}
        if t.get("parameters") is not None:
            need(is_obj(t["parameters"]), f"{f}.parameters", "must be a JSON schema object")
            fn["parameters"] = t["parameters"]
        if t.get("description") is not None:
            need(isinstance(t["description"], str), f"{f}.description", "must be a string")
            fn["description"] = t["description"]
        if t.get("strict") is not None:
            fn["strict"] = bool(t["strict"])
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc):
    if tc in ("auto", "none", "required"):
        return tc
    if is_obj(tc) and tc.get("type") == "function":
        need(isinstance(tc.get("name"), str) and tc["name"], "tool_choice.name",
             "must be a non-empty string")
        return {"type": "function", "function": {"name": tc["name"]}}
    raise BadRequest("'tool_choice' must be 'auto', 'none', 'required' or "
                     "{\"type\": \"function\", \"name\": ...}", "tool_choice")


def _text_format(text) -> dict | None:
    need(is_obj(text), "text", f"must be an object, got {jtype(text)}")
    fmt = text.get("format")
    if fmt is None:
        return None
    need(is_obj(fmt), "text.format", f"must be an object, got {jtype(fmt)}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        need(is_obj(fmt.get("schema")), "text.format.schema", "must be a JSON schema object")
        js = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            js["strict"] = bool(fmt["strict"])
        if fmt.get("description") is not None:
            js["description"] = fmt["description"]
        return {"type": "json_schema", "json_schema": js}
    raise BadRequest(f"'text.format.type' must be 'text', 'json_object' or 'json_schema', got "
                     f"{json.dumps(kind)}", "text.format.type")


def to_chat(body: dict) -> dict:
    """A Responses request as an OpenAI chat-completions body (BadRequest naming the field)."""
    for f, why in (("previous_response_id", "previous responses"),
                   ("conversation", "conversations")):
        if body.get(f) is not None:
            raise BadRequest(f"'{f}': this server stores no {why}: send the whole "
                             f"conversation in 'input'", f)
    if body.get("background"):
        raise BadRequest("'background': background responses are not supported", "background")
    if "input" not in body:
        raise BadRequest("'input' is required", "input")
    msgs = _input(body["input"])
    instr = body.get("instructions")
    if instr is not None:
        if isinstance(instr, list):
            msgs = _input(instr) + msgs
        else:
            need(isinstance(instr, str), "instructions", "must be a string")
            if instr:
                msgs.insert(0, {"role": "system", "content": instr})
    chat: dict = {"messages": msgs}
    mt = body.get("max_output_tokens")
    if mt is not None:
        need(isinstance(mt, int) and not isinstance(mt, bool) and mt >= 1, "max_output_tokens",
             f"must be an integer >= 1, got {json.dumps(mt)[:40]}")
        chat["max_tokens"] = mt
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        choice = _tool_choice(body["tool_choice"])
        if "tools" in chat:
            chat["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        need(isinstance(body["parallel_tool_calls"], bool), "parallel_tool_calls",
             "must be a boolean")
        if "tools" in chat:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("text") is not None:
        rf = _text_format(body["text"])
        if rf is not None:
            chat["response_format"] = rf
    r = body.get("reasoning")
    if r is not None:
        need(is_obj(r), "reasoning", f"must be an object, got {jtype(r)}")
        if r.get("effort") is not None:
            chat["chat_template_kwargs"] = {"enable_thinking": r["effort"] != "none"}
    copy_sampling(body, chat, ("temperature", "top_p"))
    return chat


# ---- reply -----------------------------------------------------------------------------------
def _usage(usage: dict | None) -> dict:
    n_prompt, n_out, cached = usage_numbers(usage)
    return {"input_tokens": n_prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_prompt + n_out}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _shell(body: dict, chat: dict, rid: str, created: int, model: str) -> dict:
    """The response object without its output (status in_progress)."""
    fmt = (body.get("text") or {}).get("format") if is_obj(body.get("text")) else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "model": model, "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "store": False, "temperature": chat.get("temperature", 0.8),
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": chat.get("top_p", 0.95), "truncation": "disabled", "usage": None,
        "user": None, "metadata": body.get("metadata") or {}}


def _finish(resp: dict, finish: str | None, usage: dict | None) -> dict:
    if finish == "length":
        resp["status"] = "incomplete"
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        resp["status"] = "completed"
    resp["usage"] = _usage(usage)
    return resp


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(mid: str, text: str, status="completed") -> dict:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [_text_part(text)] if status == "completed" else []}


def _reasoning_item(rid: str, text: str) -> dict:
    return {"type": "reasoning", "id": rid, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(fid: str, call_id: str, name: str, arguments: str, status="completed") -> dict:
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def from_chat(out: dict, body: dict, chat: dict, model: str) -> dict:
    """A chat.completion dict as a Responses `response`."""
    choice = out["choices"][0]
    reasoning, text, calls = message_parts(choice.get("message") or {})
    resp = _shell(body, chat, _new_id("resp"), int(out.get("created") or time.time()), model)
    if reasoning:
        resp["output"].append(_reasoning_item(_new_id("rs"), reasoning))
    if text or not calls:
        resp["output"].append(_message_item(_new_id("msg"), text))
    for c in calls:
        resp["output"].append(_call_item(_new_id("fc"), c["id"], c["name"], c["arguments"]))
    return _finish(resp, choice.get("finish_reason"), out.get("usage"))


async def stream_events(chunks, body: dict, chat: dict, model: str):
    """chat.completion.chunk dicts as the Responses API's server-sent events (text lines)."""
    seq = 0
    resp = _shell(body, chat, _new_id("resp"), int(time.time()), model)

    def ev(kind, **data):
        nonlocal seq
        seq += 1
        return sse_event(kind, {"type": kind, "sequence_number": seq - 1, **data})
    yield ev("response.created", response=json.loads(json.dumps(resp)))
    yield ev("response.in_progress", response=json.loads(json.dumps(resp)))
    output: list[dict] = []       # items done
    cur: dict | None = None       # the open item: {"key", "item", "text"}
    finish, usage = None, None

    def close():
        item, k, text = cur["item"], len(output), cur["text"]
        evs = []
        if item["type"] == "message":
            part = _text_part(text)
            evs.append(ev("response.output_text.done", item_id=item["id"], output_index=k,
                          content_index=0, text=text, logprobs=[]))
            evs.append(ev("response.content_part.done", item_id=item["id"], output_index=k,
                          content_index=0, part=part))
            item = _message_item(item["id"], text)
        elif item["type"] == "reasoning":
            evs.append(ev("response.reasoning_text.done", item_id=item["id"], output_index=k,
                          content_index=0, text=text))
            evs.append(ev("response.content_part.done", item_id=item["id"], output_index=k,
                          content_index=0, part={"type": "reasoning_text", "text": text}))
            item = _reasoning_item(item["id"], text)
        else:
            evs.append(ev("response.function_call_arguments.done", item_id=item["id"],
                          output_index=k, name=item["name"], arguments=text))
            item = _call_item(item["id"], item["call_id"], item["name"], text)
        evs.append(ev("response.output_item.done", output_index=k, item=item))
        output.append(item)
        return evs

    def open_(kind, part):
        k = len(output)
        if kind == "text":
            item = _message_item(_new_id("msg"), "", "in_progress")
            evs = [ev("response.output_item.added", output_index=k, item=item),
                   ev("response.content_part.added", item_id=item["id"], output_index=k,
                      content_index=0, part=_text_part(""))]
        elif kind == "reasoning":
            item = {"type": "reasoning", "id": _new_id("rs"), "summary": [], "content": []}
            evs = [ev("response.output_item.added", output_index=k, item=item),
                   ev("response.content_part.added", item_id=item["id"], output_index=k,
                      content_index=0, part={"type": "reasoning_text", "text": ""})]
        else:
            item = _call_item(_new_id("fc"), part["id"] or _new_id("call"), part["name"] or "",
                              "", "in_progress")
            evs = [ev("response.output_item.added", output_index=k, item=item)]
        return item, evs

    async for chunk in chunks:
        if "error" in chunk:
            err = chunk["error"]
            for line in close() if cur is not None else []:
                yield line
            resp["status"], resp["output"] = "failed", output
            resp["error"] = {"code": "server_error", "message": str(err.get("message"))}
            yield ev("response.failed", response=resp)
            return
        for kind, key, part in chunk_parts(chunk):
            if cur is None or cur["key"] != (kind, key):
                if cur is not None:
                    for line in close():
                        yield line
                item, evs = open_(kind, part)
                cur = {"key": (kind, key), "item": item, "text": ""}
                for line in evs:
                    yield line
            delta = part["arguments"] if kind == "tool" else part
            if not delta:
                continue
            cur["text"] += delta
            item, k = cur["item"], len(output)
            if kind == "text":
                yield ev("response.output_text.delta", item_id=item["id"], output_index=k,
                         content_index=0, delta=delta, logprobs=[])
            elif kind == "reasoning":
                yield ev("response.reasoning_text.delta", item_id=item["id"], output_index=k,
                         content_index=0, delta=delta)
            else:
                yield ev("response.function_call_arguments.delta", item_id=item["id"],
                         output_index=k, delta=delta)
        finish = chunk_finish(chunk) or finish
        if chunk.get("usage"):
            usage = chunk["usage"]
    if cur is None:                 # an empty reply is one empty message, as non-streamed
        item, evs = open_("text", None)
        cur = {"key": ("text", None), "item": item, "text": ""}
        for line in evs:
            yield line
    for line in close():
        yield line
    resp["output"] = output
    _finish(resp, finish, usage)
    yield ev("response.completed" if resp["status"] == "completed" else "response.incomplete",
             response=resp)


# ---- the endpoint ----------------------------------------------------------------------------
async def responses(server, request) -> Response:
    """POST /v1/responses."""
    body = await _json_body(request)
    chat = to_chat(body)
    out = await chat_with_limit(server, request, chat)
    model = body.get("model") if isinstance(body.get("model"), str) else server.model_name
    if isinstance(out, Response):
        if out.status_code == 499:
            return out
        status, msg = response_error(out)
        return error_response(status, msg, kind="server_error")
    if isinstance(out, dict):
        return JSONResponse(from_chat(out, body, chat, model))
    return StreamingResponse(stream_events(out, body, chat, model),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
