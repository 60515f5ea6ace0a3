"""What the chat-shaped APIs other than OpenAI's chat completions (/v1/messages:
anthropic_api.py, /v1/responses: responses_api.py) share: they are translations onto
`Server.chat_completion` (pyggml/server/app.py), which takes an OpenAI chat-completions body and
gives a chat.completion dict or an async iterator of chat.completion.chunk dicts. Here: reading
those results (the message's reasoning, text and tool calls; a chunk's deltas as parts of
blocks), field checks that raise the server's BadRequest naming the field, and calling the chat
path with an output limit that is an upper bound (as Anthropic's `max_tokens` and OpenAI's
`max_output_tokens` are) rather than a demand that must fit."""

from __future__ import annotations

import json

from starlette.responses import Response

from pyggml.server.http import BadRequest

# sampling fields both APIs pass through unchanged to the chat path (llama-server's extras that
# clients send in extra_body)
SAMPLING_EXTRAS = ("top_k", "min_p", "repeat_penalty", "seed", "presence_penalty",
                   "frequency_penalty")


def copy_sampling(body: dict, chat: dict, own: tuple = ()) -> None:
    """Into the chat body: the API's own sampling fields `own` and SAMPLING_EXTRAS that the
    request sets (not null), and "stream" (a boolean, else BadRequest naming it)."""
    for k in own + SAMPLING_EXTRAS:
        if body.get(k) is not None:
            chat[k] = body[k]
    if body.get("stream") is not None:
        need(isinstance(body["stream"], bool), "stream", "must be a boolean")
        chat["stream"] = body["stream"]


def jtype(v) -> str:
    """A JSON value's type, for error messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def need(cond: bool, field: str, what: str) -> None:
    """BadRequest "'field' must be what" unless cond."""
    if not cond:
        raise BadRequest(f"'{field}' {what}", field)


def is_obj(v) -> bool:
    return isinstance(v, dict)


def arguments_object(arguments) -> dict:
    """A tool call's OpenAI `arguments` (a JSON string) as an object (Anthropic's `input`):
    an unparsable or non-object string becomes {} (the chat path's parser gives JSON)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        v = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def message_parts(message: dict) -> tuple[str, str, list[dict]]:
    """A chat.completion message's reasoning text, text and tool calls
    ([{"id", "name", "arguments"}], arguments a JSON string)."""
    calls = []
    for k, tc in enumerate(message.get("tool_calls") or []):
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {}, ensure_ascii=False)
        calls.append({"id": tc.get("id") or f"call_{k}", "name": fn.get("name") or "",
                      "arguments": args})
    return message.get("reasoning_content") or "", message.get("content") or "", calls


def chunk_parts(chunk: dict) -> list[tuple]:
    """A chat.completion.chunk's deltas, in order, as block parts:
    ("reasoning", None, text), ("text", None, text), ("tool", index, {"id", "name",
    "arguments"}) (id and name only on a call's first delta, as OpenAI streams them)."""
    out = []
    for choice in chunk.get("choices") or []:
        d = choice.get("delta") or {}
        if d.get("reasoning_content"):
            out.append(("reasoning", None, d["reasoning_content"]))
        if d.get("content"):
            out.append(("text", None, d["content"]))
        for k, tc in enumerate(d.get("tool_calls") or []):
            fn = tc.get("function") or {}
            out.append(("tool", tc.get("index", k), {"id": tc.get("id"), "name": fn.get("name"),
                                                     "arguments": fn.get("arguments") or ""}))
    return out


def chunk_finish(chunk: dict) -> str | None:
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason"):
            return choice["finish_reason"]
    return None


def usage_numbers(usage: dict | None) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, prompt tokens from the prefix cache)."""
    u = usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0, cached


def response_error(resp: Response) -> tuple[int, str]:
    """The status and message of an error Response from the chat path (the job's error, or
    499 when the client went away)."""
    try:
        msg = json.loads(bytes(resp.body))["error"]["message"]
    except (ValueError, KeyError, TypeError, AttributeError):
        msg = "client closed the request" if resp.status_code == 499 else "error"
    return resp.status_code, msg


async def chat_with_limit(server, request, chat: dict):
    """server.chat_completion(request, chat), where chat's max_tokens is an upper bound (an
    agent asks for 32k tokens of a model served with 4k of context): the server clamps any
    max_tokens to what fits after the prompt (it ends with "length")."""
    return await server.chat_completion(request, chat)


def sse_event(name: str, data: dict) -> str:
    """One server-sent event with an event name (Anthropic's and the Responses API's form)."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
