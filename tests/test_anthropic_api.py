"""POST /v1/messages and /v1/messages/count_tokens (pyggml/server/anthropic_api.py), a
translation onto the chat path: the translators on dicts (requests both ways, replies, a stream
of OpenAI chunks read back by the official `anthropic` client through a mock transport), then
the client against a real server (SmolLM2-135M-Instruct): the same text as the chat API, the
same tokens streamed, count_tokens, errors in Anthropic's shape; tool use once the chat path
returns tool calls."""
import asyncio
import json

import anthropic
import httpx
import httpx2
import openai
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from pyggml.server.anthropic_api import from_chat, stream_events, to_chat
from pyggml.server.app import BadRequest

TIMEOUT_S = 60
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


# ---- the request translation -----------------------------------------------------------------
def test_request_translates_system_blocks_tools_and_history():
    body = {
        "model": "claude-x", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief."},
                                                           {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "no data"}]},
                {"type": "text", "text": "Thanks."}]}],
        "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"}, "stop_sequences": ["END"], "temperature": 0,
        "top_k": 5, "stream": True, "metadata": {"user_id": "u"}}
    chat = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two cities.",
         "tool_calls": [
             {"id": "toolu_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
             {"id": "toolu_2", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
        {"role": "user", "content": "Thanks."}]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": WEATHER["input_schema"]}}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert chat["stop"] == ["END"] and chat["max_tokens"] == 100
    assert chat["temperature"] == 0 and chat["top_k"] == 5 and chat["stream"] is True
    assert "metadata" not in chat and "model" not in chat


@pytest.mark.parametrize("choice, want", [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"), ({"type": "any"}, "required"),
    ({"type": "tool", "name": "get_weather"},
     {"type": "function", "function": {"name": "get_weather"}})])
def test_tool_choice(choice, want):
    chat = to_chat({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                    "tools": [WEATHER], "tool_choice": choice})
    assert chat["tool_choice"] == want


def test_output_config_format_is_response_format_and_count_body_needs_no_max_tokens():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                    "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema}}
    assert to_chat({"messages": [{"role": "user", "content": "hi"}]}, count_only=True) == {
        "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": ""}}]}]}, "messages[0].content[0].type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
      "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "system": 5}, "system"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
      "stop_sequences": "END"}, "stop_sequences"),
])
def test_bad_requests_name_the_field(body, param):
    with pytest.raises(BadRequest) as e:
        to_chat(body)
    assert e.value.param == param and param.split("[")[0].split(".")[0] in str(e.value)


def test_every_field_of_the_anthropic_request_schema_is_decided():
    """Each field the official `anthropic` client types for messages.create / count_tokens is
    honoured, a type-checked label, or refused by name (never ignored by default)."""
    from anthropic.types import message_count_tokens_params, message_create_params

    from pyggml.server.anthropic_api import HONOURED, LABELS, REFUSED
    fields = (set(message_create_params.MessageCreateParamsBase.__annotations__)
              | set(message_count_tokens_params.MessageCountTokensParams.__annotations__))
    undecided = sorted(f for f in fields if f not in HONOURED and f not in LABELS
                       and f not in REFUSED)
    assert not undecided, f"anthropic_api.py does not say what it does with {undecided}"
    base = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for name in REFUSED:
        with pytest.raises(BadRequest) as e:
            to_chat(dict(base, **{name: {"x": 1}}))
        assert e.value.param == name and "not supported" in str(e.value)
    for name, kind in LABELS.items():
        to_chat(dict(base, **{name: "x" if kind is str else {"k": "v"}}))
        with pytest.raises(BadRequest) as e:
            to_chat(dict(base, **{name: 5}))
        assert e.value.param == name


# ---- the reply translation -------------------------------------------------------------------
def _completion(message, finish, prompt=30, completion=7, cached=4):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


CALLS = [{"id": "call_a", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
         {"id": "call_b", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]


def test_reply_blocks_stop_reasons_and_usage():
    m = from_chat(_completion({"content": "Let me check.", "reasoning_content": "Hmm.",
                               "tool_calls": CALLS}, "tool_calls"), "claude-x")
    assert m["type"] == "message" and m["role"] == "assistant" and m["model"] == "claude-x"
    assert m["id"].startswith("msg_")
    assert m["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_b", "name": "get_weather", "input": {"city": "Oslo"}}]
    assert m["stop_reason"] == "tool_use" and m["stop_sequence"] is None
    assert m["usage"] == {"input_tokens": 26, "output_tokens": 7,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4}
    assert from_chat(_completion({"content": "Hi"}, "stop"), "m")["stop_reason"] == "end_turn"
    only_call = from_chat(_completion({"content": None, "tool_calls": CALLS[:1]},
                                      "tool_calls"), "m")
    assert [b["type"] for b in only_call["content"]] == ["tool_use"]
    cut = from_chat(_completion({"content": ""}, "length"), "m")
    assert cut["stop_reason"] == "max_tokens" and cut["content"] == [{"type": "text",
                                                                      "text": ""}]
    anthropic.types.Message.model_validate(m)


def _chunks(deltas, finish, usage):
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            for d in deltas]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                "usage": usage})
    return out


# a stream as OpenAI sends one: reasoning, text, then two tool calls (index, id and name
# first, then argument fragments)
STREAM_DELTAS = [
    {"reasoning_content": "Two "}, {"reasoning_content": "cities."},
    {"content": "Let me "}, {"content": "check."},
    {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city"'}}]},
    {"tool_calls": [{"index": 1, "function": {"arguments": ': "Oslo"}'}}]}]
USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
         "prompt_tokens_details": {"cached_tokens": 4}}


def _sse_text(chunks, n_prompt=30) -> str:
    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return "".join([x async for x in stream_events(gen(), "claude-x", n_prompt)])
    return asyncio.run(collect())


def _mock_client(text: str, status=200) -> anthropic.Anthropic:
    def handler(request):
        return httpx2.Response(status, text=text, headers={"content-type": "text/event-stream"})
    return anthropic.Anthropic(api_key="x", base_url="http://test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_stream_events_rebuild_in_the_official_client():
    sse = _sse_text(_chunks(STREAM_DELTAS, "tool_calls", USAGE))
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in sse.splitlines() if line.startswith("event: ")]
    assert names == [e["type"] for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["usage"]["input_tokens"] == 30
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    kinds = {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"}
    assert kinds == {"thinking_delta", "text_delta", "input_json_delta"}
    with _mock_client(sse).messages.stream(model="claude-x", max_tokens=50,
                                           messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    want = from_chat(_completion({"content": "Let me check.", "reasoning_content":
                                  "Two cities.", "tool_calls": CALLS}, "tool_calls"), "claude-x")
    got = final.model_dump(exclude_none=True)
    assert [b for b in got["content"]] == [{k: v for k, v in b.items()} for b in
                                           want["content"]]
    assert got["stop_reason"] == "tool_use"
    assert got["usage"]["input_tokens"] == 26 and got["usage"]["output_tokens"] == 7
    assert got["usage"]["cache_read_input_tokens"] == 4


def test_stream_of_an_empty_reply_and_an_error_after_the_start():
    sse = _sse_text(_chunks([], "stop", USAGE))
    with _mock_client(sse).messages.stream(model="m", max_tokens=5,
                                           messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.stop_reason == "end_turn"
    chunks = _chunks([{"content": "Hel"}], "stop", USAGE)[:2]
    chunks.append({"error": {"message": "decode failed", "type": "server_error", "code": 500}})
    sse = _sse_text(chunks)
    assert "event: error" in sse and "content_block_stop" in sse
    with pytest.raises(anthropic.APIStatusError, match="decode failed"):
        with _mock_client(sse).messages.stream(model="m", max_tokens=5,
                                               messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()


# ---- against a real server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    llm = LLM(ensure_smollm2(), n_ctx=2048, n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "smollm2", queue_size=8))
    base = f"http://127.0.0.1:{rs.port}"
    yield (rs, base, anthropic.Anthropic(base_url=base, api_key="none", timeout=TIMEOUT_S,
                                         max_retries=0),
           openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=TIMEOUT_S,
                         max_retries=0))
    rs.stop()
    llm.close()


SYSTEM = "You are a helpful assistant."
QUESTION = "Name the largest planet of the solar system."
GREEDY = {"temperature": 0}


def test_text_equals_the_chat_api_streamed_and_not(server):
    rs, base, ac, oc = server
    ref = oc.chat.completions.create(model="m", max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    m = ac.messages.create(model="smollm2", max_tokens=16, system=SYSTEM, extra_body=GREEDY,
                           messages=[{"role": "user", "content": QUESTION}])
    assert m.content[0].type == "text" and m.content[0].text == ref.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        ref.choices[0].finish_reason]
    assert m.usage.output_tokens == ref.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert m.model == "smollm2"
    with ac.messages.stream(model="smollm2", max_tokens=16, system=SYSTEM, extra_body=GREEDY,
                            messages=[{"role": "user", "content": QUESTION}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text and final.content[0].text == text
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        ref.usage.prompt_tokens
    n = ac.messages.count_tokens(model="smollm2", system=SYSTEM,
                                 messages=[{"role": "user", "content": QUESTION}])
    assert n.input_tokens == ref.usage.prompt_tokens


def test_a_conversation_with_blocks_and_stop_sequences(server):
    rs, base, ac, oc = server
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Count: one, two,"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "three, four,"}]},
            {"role": "user", "content": "Go on counting, to ten."}]
    full = ac.messages.create(model="m", max_tokens=24, messages=msgs, extra_body=GREEDY)
    text = full.content[0].text
    assert text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = ac.messages.create(model="m", max_tokens=24, messages=msgs, extra_body=GREEDY,
                             stop_sequences=[stop])
    assert cut.content[0].text == text[:text.index(stop)] and cut.stop_reason == "end_turn"


def test_max_tokens_beyond_the_context_is_an_upper_bound(server):
    rs, base, ac, oc = server
    m = ac.messages.create(model="m", max_tokens=64000, extra_body={**GREEDY, "seed": 1},
                           messages=[{"role": "user", "content": "Say hello."}])
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens >= 1


def test_errors_in_anthropic_shape(server):
    rs, base, ac, oc = server
    r = httpx.post(f"{base}/v1/messages", json={"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}, timeout=TIMEOUT_S)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in err["error"]["message"]
    r = httpx.post(f"{base}/v1/messages", content=b"{not json", timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["type"] == "error"
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\]"):
        ac.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="context"):
        ac.messages.create(model="m", max_tokens=5, messages=[
            {"role": "user", "content": "word " * 3000}])
    r = httpx.post(f"{base}/v1/messages/count_tokens", json={"messages": "x"},
                   timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_the_api_key_as_x_api_key(server):
    rs, base, ac, oc = server
    rs.server.api_key = "sekrit"
    try:
        with pytest.raises(anthropic.AuthenticationError):
            ac.messages.create(model="m", max_tokens=2, messages=[
                {"role": "user", "content": "hi"}])
        keyed = anthropic.Anthropic(base_url=base, api_key="sekrit", timeout=TIMEOUT_S,
                                    max_retries=0)
        assert keyed.messages.create(model="m", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}]).usage.output_tokens >= 1
    finally:
        rs.server.api_key = None


# ---- tool use, through the chat path's tool calls --------------------------------------------
def _needs_tool_calls(oc):
    r = oc.chat.completions.create(
        model="m", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": WEATHER["name"],
                                                 "parameters": WEATHER["input_schema"]}}],
        tool_choice="required")
    if not r.choices[0].message.tool_calls:
        pytest.skip("the chat path does not return tool_calls yet (issue 31, item 2)")


def test_tool_use_round_trip(server):
    rs, base, ac, oc = server
    _needs_tool_calls(oc)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = ac.messages.create(model="m", max_tokens=64, messages=msgs, tools=[WEATHER],
                           tool_choice={"type": "tool", "name": "get_weather"},
                           extra_body=GREEDY)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str)
    with ac.messages.stream(model="m", max_tokens=64, messages=msgs, tools=[WEATHER],
                            tool_choice={"type": "tool", "name": "get_weather"},
                            extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in final.content if b.type == "tool_use"] == \
        [b.model_dump(exclude={"id"}) for b in uses]
    assert final.stop_reason == "tool_use"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                               for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                           "content": "Sunny, 21 C."}]}]
    after = ac.messages.create(model="m", max_tokens=32, messages=msgs, tools=[WEATHER],
                               tool_choice={"type": "none"}, extra_body=GREEDY)
    assert after.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in after.content] == ["text"]
