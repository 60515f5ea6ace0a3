"""llama-server's `GET /props` (the server's settings, its chat template and what the template
can show: tools, tool calls, a system role, thinking) and `POST /apply-template` (the prompt a
chat request renders to, without generating); and the prompt of a chat body, which
/v1/messages/count_tokens and the Anthropic stream's message_start count."""

from __future__ import annotations

import asyncio
import weakref

from starlette.responses import JSONResponse

import pyggml
from pyggml.errors import ChatTemplateError
from pyggml.server.http import DEFAULTS, BadRequest, _json_body

_CAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _template(server):
    try:
        return server.llm.get_chat_template(server.chat_template_spec)
    except ChatTemplateError as e:
        raise BadRequest(str(e), "messages") from None


def _turn(server, body: dict):
    """The chat path's ChatTurn of an OpenAI chat body (the prompt as it renders it: tools and
    tool results through the family's format); BadRequest naming the field."""
    from pyggml.llm.chatturn import ChatRequestError, ChatTurn
    if "messages" not in body:
        raise BadRequest("'messages' is required", "messages")
    template = _template(server)
    try:
        return ChatTurn(server.llm, template, body["messages"], tools=body.get("tools"),
                        tool_choice=body.get("tool_choice"),
                        parallel_tool_calls=body.get("parallel_tool_calls"),
                        chat_template_kwargs=body.get("chat_template_kwargs"),
                        reasoning_format=body.get("reasoning_format"))
    except ChatTemplateError as e:
        raise BadRequest(str(e), "messages") from None
    except ChatRequestError as e:
        raise BadRequest(str(e), e.param) from None


def prompt_text(server, body: dict) -> str:
    """The prompt text the chat path renders for an OpenAI chat body (messages, tools,
    tool_choice, chat_template_kwargs)."""
    return _turn(server, body).prompt


def prompt_ids(server, body: dict) -> list[int]:
    """Token ids of prompt_text (special tokens parsed, BOS once), as the chat path."""
    return _turn(server, body).ids


# ---- what the template can show --------------------------------------------------------------
_TOOL = {"type": "function", "function": {
    "name": "probe_tool_7f3a", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string"}},
                   "required": ["arg"]}}}


def _render(template, messages, tools=None, **extra) -> str | None:
    try:
        return template.render(messages, True, tools, **extra)
    except ChatTemplateError:
        return None


def template_caps(template) -> dict:
    """llama.cpp's chat_template_caps, found as it does by rendering probe conversations (a
    capability is there when the probe's marker reaches the prompt), plus supports_thinking
    (the template reads enable_thinking: llama-server's test) and supports_reasoning_content
    (an assistant turn's reasoning_content reaches the prompt)."""
    if template in _CAPS:
        return _CAPS[template]
    user = {"role": "user", "content": "USER_MARKER_51c2"}
    out = _render(template, [user]) or ""
    sys_out = _render(template, [{"role": "system", "content": "SYSTEM_MARKER_9d0e"}, user])
    typed = _render(template, [{"role": "user", "content": [
        {"type": "text", "text": "TYPED_MARKER_2b6c"}]}])
    tools_out = _render(template, [user], [_TOOL])
    def calls_out(calls):
        history = [user, {"role": "assistant", "content": "", "tool_calls": calls},
                   {"role": "tool", "tool_call_id": "call00001", "content": "TOOL_RESULT_6e2f"},
                   {"role": "assistant", "content": "The tool said so."},
                   {"role": "user", "content": "More."}]
        return _render(template, history, [_TOOL]) or ""

    def call(k, name, args):
        return {"id": f"call0000{k}", "type": "function",
                "function": {"name": name, "arguments": args}}
    # arguments as an object first (what most templates take), then as a JSON string
    args = {"arg": "value"}
    one = calls_out([call(1, "called_tool_4e1b", args)])
    if "called_tool_4e1b" not in one:
        args = '{"arg": "value"}'
        one = calls_out([call(1, "called_tool_4e1b", args)])
    two = calls_out([call(1, "called_tool_4e1b", args), call(2, "second_tool_c55d", args)])
    on = _render(template, [user], None, enable_thinking=True)
    off = _render(template, [user], None, enable_thinking=False)
    reasoning_out = _render(template, [user, {"role": "assistant", "content": "Answer.",
                                              "reasoning_content": "REASONING_MARKER_3f7d"},
                                       {"role": "user", "content": "More."}], None,
                            enable_thinking=True) or ""
    src = template.source or ""
    caps = {
        "supports_string_content": "USER_MARKER_51c2" in out,
        "supports_typed_content": typed is not None and "TYPED_MARKER_2b6c" in typed,
        "supports_system_role": sys_out is not None and "SYSTEM_MARKER_9d0e" in sys_out,
        "supports_tools": tools_out is not None and "probe_tool_7f3a" in tools_out,
        "supports_tool_calls": "called_tool_4e1b" in one,
        "supports_parallel_tool_calls": "second_tool_c55d" in two,
        "supports_tool_responses": "TOOL_RESULT_6e2f" in one,
        "supports_object_arguments": "called_tool_4e1b" in one and isinstance(args, dict),
        "supports_thinking": on is not None and off is not None and on != off,
        "supports_reasoning_content": "REASONING_MARKER_3f7d" in reasoning_out
                                      or "reasoning_content" in src,
    }
    _CAPS[template] = caps
    return caps


def props(server) -> dict:
    """GET /props, in llama-server's shape (the fields that mean something here)."""
    llm, engine = server.llm, server.engine
    from pyggml.llm import reasoning, toolcalls
    try:
        template = llm.get_chat_template(server.chat_template_spec)
        source, caps = template.source, template_caps(template)
    except ChatTemplateError:
        template, source, caps = None, None, {}
    rfmt = reasoning.reasoning_for_template(source) if template is not None else None
    tok = llm.tokenizer
    text = lambda i: tok.decode([i], special=True) if i is not None else ""   # noqa: E731
    params = {"n_predict": -1, "seed": 4294967295, "temperature": DEFAULTS["temperature"],
              "top_k": DEFAULTS["top_k"], "top_p": DEFAULTS["top_p"],
              "min_p": DEFAULTS["min_p"], "repeat_last_n": 64,
              "repeat_penalty": DEFAULTS["repeat_penalty"], "presence_penalty": 0.0,
              "frequency_penalty": 0.0, "stop": [], "max_tokens": -1, "n_probs": 0,
              "stream": False, "samplers": ["penalties", "top_k", "top_p", "min_p",
                                            "temperature"]}
    out = {
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": engine.n_ctx_slot,
            "speculative": getattr(llm, "speculator", None) is not None,
            "is_processing": engine.busy_slots() > 0, "params": params},
        "total_slots": len(engine.slots),
        "n_ctx": llm.n_ctx,
        "n_ctx_slot": engine.n_ctx_slot,
        "model_alias": server.model_name,
        "model_path": str(getattr(llm, "path", "")),
        "modalities": {"vision": False, "audio": False, "video": False},
        "chat_template": source,
        "chat_template_name": template.name if template is not None else None,
        "chat_template_caps": caps,
        # how the chat path parses tool calls for this template ("generic": the template cannot
        # show tools; they and a JSON reply format are described in the system message) and
        # the reasoning markers it splits off (null: none)
        "tool_call_format": (toolcalls.format_for_template(source).name
                             if template is not None else None),
        "reasoning_format": rfmt.name if rfmt is not None else None,
        "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_id),
        "build_info": f"pyggml {pyggml.__version__}",
        "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
        "is_sleeping": False,
    }
    return out


async def get_props(server, request):
    return JSONResponse(await asyncio.to_thread(props, server))


async def apply_template(server, request):
    """POST /apply-template: {"prompt": the text the chat path would evaluate}."""
    body = await _json_body(request)
    return JSONResponse({"prompt": await asyncio.to_thread(prompt_text, server, body)})
