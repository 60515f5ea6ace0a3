"""POST /v1/responses (pyggml/server/responses_api.py, stateless) and llama-server's GET /props
and POST /apply-template (pyggml/server/props.py): the translators on dicts (requests, replies,
a stream of OpenAI chat chunks read back by the official `openai` client's Responses stream
accumulator through a mock transport), then the `openai` client against a real server
(SmolLM2-135M-Instruct); function calls and the `openai-agents` agent loop once the chat path
returns tool calls."""
import asyncio
import json
from pathlib import Path

import httpx
import httpx2
import openai
import pytest

from pyggml.llm.chat import ChatTemplate
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import QWEN_CODER_0_5B, cached_path, ensure_smollm2
from pyggml.server import make_server, start_in_thread
from pyggml.server.app import BadRequest
from pyggml.server.props import template_caps
from pyggml.server.responses_api import from_chat, stream_events, to_chat

TIMEOUT_S = 60
TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": WEATHER["parameters"]}}


# ---- the request translation -----------------------------------------------------------------
def test_input_text_and_instructions():
    chat = to_chat({"model": "gpt-x", "input": "Hi", "instructions": "Be brief.",
                    "max_output_tokens": 20, "temperature": 0.2, "top_p": 0.9, "seed": 3,
                    "stream": True, "store": True, "metadata": {"k": "v"}})
    assert chat == {"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hi"}],
                    "max_tokens": 20, "temperature": 0.2, "top_p": 0.9, "seed": 3,
                    "stream": True}


def test_input_items_function_calls_and_outputs():
    body = {"input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Paris"},
            {"type": "input_text", "text": "and Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [
            {"type": "summary_text", "text": "Two cities."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]},
        {"role": "user", "content": "Thanks."}],
        "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False}
    chat = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris\nand Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two cities.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        {"role": "assistant", "content": "Sunny and rain."},
        {"role": "user", "content": "Thanks."}]
    assert chat["tools"] == [CHAT_WEATHER]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False


def test_text_format_and_reasoning():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chat = to_chat({"input": "x", "text": {"format": {"type": "json_schema", "name": "A",
                                                      "schema": schema, "strict": True}},
                    "reasoning": {"effort": "none"}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "A", "schema": schema, "strict": True}}
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert to_chat({"input": "x", "text": {"format": {"type": "json_object"}}})[
        "response_format"] == {"type": "json_object"}
    assert "response_format" not in to_chat({"input": "x", "text": {"format": {"type": "text"}}})


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
])
def test_bad_requests_name_the_field(body, param):
    with pytest.raises(BadRequest) as e:
        to_chat(body)
    assert e.value.param == param


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


def test_reply_items_status_and_usage():
    body = {"input": "x", "tools": [WEATHER], "metadata": {"k": "v"}}
    r = from_chat(_completion({"content": "Checking.", "reasoning_content": "Hmm.",
                               "tool_calls": CALLS}, "tool_calls"), body, to_chat(body), "gpt-x")
    assert r["object"] == "response" and r["status"] == "completed" and r["model"] == "gpt-x"
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call",
                                                "function_call"]
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "Hmm."}]
    assert r["output"][1]["content"][0]["text"] == "Checking."
    assert [(i["call_id"], i["name"], json.loads(i["arguments"])) for i in r["output"][2:]] == \
        [("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_weather",
                                                        {"city": "Oslo"})]
    assert r["usage"] == {"input_tokens": 30,
                          "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                          "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 37}
    assert r["metadata"] == {"k": "v"} and r["tools"] == [WEATHER]
    parsed = openai.types.responses.Response.model_validate(r)
    assert parsed.output_text == "Checking."
    cut = from_chat(_completion({"content": "Hel"}, "length"), {"input": "x"}, {}, "m")
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _chunks(deltas, finish, usage):
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            for d in deltas]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                "usage": usage})
    return out


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


def _sse_text(chunks, body=None) -> str:
    body = body or {"input": "x"}

    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return "".join([x async for x in stream_events(gen(), body, to_chat(body), "gpt-x")])
    return asyncio.run(collect())


def _mock_client(text: str) -> openai.OpenAI:
    def handler(request):
        return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})
    return openai.OpenAI(api_key="x", base_url="http://test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_stream_events_rebuild_in_the_official_client():
    body = {"input": "x", "tools": [WEATHER]}
    sse = _sse_text(_chunks(STREAM_DELTAS, "tool_calls", USAGE), body)
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in sse.splitlines() if line.startswith("event: ")]
    assert names == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.delta", "response.output_text.done",
                 "response.reasoning_text.delta", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in names
    with _mock_client(sse).responses.stream(model="gpt-x", input="x", tools=[WEATHER]) as s:
        seen = [e.type for e in s]
        final = s.get_final_response()
    assert "response.completed" in seen
    want = from_chat(_completion({"content": "Let me check.", "reasoning_content":
                                  "Two cities.", "tool_calls": CALLS}, "tool_calls"), body,
                     to_chat(body), "gpt-x")
    strip = lambda items: [{k: v for k, v in i.items() if k != "id"} for i in items]  # noqa
    assert strip(final.model_dump(exclude_none=True)["output"]) == \
        strip(openai.types.responses.Response.model_validate(want).model_dump(
            exclude_none=True)["output"])
    assert final.output_text == "Let me check."
    assert final.usage.input_tokens == 30 and final.usage.output_tokens == 7


def test_stream_of_an_incomplete_reply_and_an_error_after_the_start():
    sse = _sse_text(_chunks([{"content": "Hel"}], "length", USAGE))
    last = json.loads(sse.strip().splitlines()[-1][6:])
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["content"][0]["text"] == "Hel"
    chunks = _chunks([{"content": "Hel"}], "stop", USAGE)[:2]
    chunks.append({"error": {"message": "decode failed", "type": "server_error", "code": 500}})
    last = json.loads(_sse_text(chunks).strip().splitlines()[-1][6:])
    assert last["type"] == "response.failed"
    assert last["response"]["error"]["message"] == "decode failed"


# ---- /props: what a template can show --------------------------------------------------------
def _caps(name):
    return template_caps(ChatTemplate((TEMPLATES / name).read_text(), name, "<s>", "</s>"))


def test_template_caps():
    qwen3 = _caps("Qwen-Qwen3-0.6B.jinja")
    assert qwen3["supports_tools"] and qwen3["supports_tool_calls"]
    assert qwen3["supports_thinking"] and qwen3["supports_system_role"]
    qwen25 = _caps("Qwen-Qwen2.5-7B-Instruct.jinja")
    assert qwen25["supports_tools"] and qwen25["supports_parallel_tool_calls"]
    assert not qwen25["supports_thinking"]
    llama = _caps("meta-llama-Llama-3.1-8B-Instruct.jinja")
    assert llama["supports_tools"] and llama["supports_tool_calls"]
    assert not llama["supports_parallel_tool_calls"]       # it raises on two calls at once
    gemma = _caps("google-gemma-2-2b-it.jinja")
    assert not gemma["supports_tools"] and not gemma["supports_system_role"]
    phi = _caps("microsoft-Phi-3.5-mini-instruct.jinja")
    assert not phi["supports_tools"] and not phi["supports_tool_calls"]


# ---- against a real server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    llm = LLM(ensure_smollm2(), n_ctx=2048, n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "smollm2", queue_size=8))
    base = f"http://127.0.0.1:{rs.port}"
    yield rs, base, openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=TIMEOUT_S,
                                  max_retries=0)
    rs.stop()
    llm.close()


SYSTEM = "You are a helpful assistant."
QUESTION = "Name the largest planet of the solar system."
GREEDY = {"temperature": 0}


def test_text_equals_the_chat_api_streamed_and_not(server):
    rs, base, oc = server
    ref = oc.chat.completions.create(model="m", max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    r = oc.responses.create(model="smollm2", input=QUESTION, instructions=SYSTEM,
                            max_output_tokens=16, temperature=0)
    assert r.output_text == ref.choices[0].message.content and r.model == "smollm2"
    assert r.status == ("incomplete" if ref.choices[0].finish_reason == "length"
                        else "completed")
    assert r.usage.input_tokens == ref.usage.prompt_tokens
    assert r.usage.output_tokens == ref.usage.completion_tokens
    # the same as items, streamed
    events = list(oc.responses.create(
        model="smollm2", stream=True, max_output_tokens=16, temperature=0,
        input=[{"role": "system", "content": SYSTEM},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}]}]))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text
    assert events[-1].type == f"response.{r.status}"
    assert events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == r.usage.output_tokens
    # the stream helper of the client, on a reply that ends by itself
    with oc.responses.stream(model="smollm2", input="Say hello.", max_output_tokens=200,
                             temperature=0) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == deltas and deltas


def test_a_conversation_of_items(server):
    rs, base, oc = server
    r = oc.responses.create(model="m", max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": "Count: one, two,"},
        {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "three, four,", "annotations": []}]},
        {"role": "user", "content": "Go on, to ten."}])
    assert r.output_text and r.output[0].type == "message"


def test_errors(server):
    rs, base, oc = server
    with pytest.raises(openai.BadRequestError, match="previous_response_id") as e:
        oc.responses.create(model="m", input="x", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        oc.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert e.value.body["param"] == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError, match="context"):
        oc.responses.create(model="m", input="word " * 3000)
    r = oc.responses.create(model="m", input="Say hello.", max_output_tokens=60000,
                            temperature=0)
    assert r.status in ("completed", "incomplete")       # an upper bound, not an error


def test_props_and_apply_template(server):
    rs, base, oc = server
    p = httpx.get(f"{base}/props", timeout=TIMEOUT_S).json()
    llm = rs.server.llm
    assert p["chat_template"] == llm.model.get("tokenizer.chat_template")
    assert p["total_slots"] == 2 and p["n_ctx"] == 2048
    assert p["default_generation_settings"]["n_ctx"] == 2048   # one unified cache
    assert p["model_alias"] == "smollm2" and p["model_path"].endswith(".gguf")
    caps = p["chat_template_caps"]
    assert caps["supports_system_role"] and caps["supports_string_content"]
    assert not caps["supports_thinking"]
    assert isinstance(caps["supports_tools"], bool)
    from pyggml.llm import toolcalls
    assert p["tool_call_format"] == toolcalls.format_for_template(p["chat_template"]).name
    assert p["reasoning_format"] is None
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    prompt = httpx.post(f"{base}/apply-template", json={"messages": msgs},
                        timeout=TIMEOUT_S).json()["prompt"]
    assert SYSTEM in prompt and QUESTION in prompt
    ref = oc.chat.completions.create(model="m", messages=msgs, max_tokens=1)
    n = len(httpx.post(f"{base}/tokenize", json={"content": prompt, "add_special": True},
                       timeout=TIMEOUT_S).json()["tokens"])
    assert abs(n - ref.usage.prompt_tokens) <= 1          # BOS as the model wants it
    r = httpx.post(f"{base}/apply-template", json={"messages": []}, timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


# ---- function calls and the agents SDK, through the chat path's tool calls -------------------
def _needs_tool_calls(oc):
    r = oc.chat.completions.create(
        model="m", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[CHAT_WEATHER], tool_choice="required")
    if not r.choices[0].message.tool_calls:
        pytest.skip("the chat path does not return tool_calls yet (issue 31, item 2)")


def test_function_call_round_trip(server):
    rs, base, oc = server
    _needs_tool_calls(oc)
    inp = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oc.responses.create(model="m", input=inp, tools=[WEATHER], tool_choice="required",
                            max_output_tokens=64, temperature=0)
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments), dict)
    with oc.responses.stream(model="m", input=inp, tools=[WEATHER], tool_choice="required",
                             max_output_tokens=64, temperature=0) as s:
        final = s.get_final_response()
    assert [(i.name, i.arguments) for i in final.output if i.type == "function_call"] == \
        [(c.name, c.arguments) for c in calls]
    inp += [c.model_dump(exclude_none=True) for c in calls]
    inp += [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C."}
            for c in calls]
    after = oc.responses.create(model="m", input=inp, tools=[WEATHER], tool_choice="none",
                                max_output_tokens=32, temperature=0)
    assert after.output_text and not [i for i in after.output if i.type == "function_call"]


def test_openai_agents_loop_with_two_tools():
    """The agents SDK's loop (Responses model) with two function tools, to its end, on the
    tool-trained Qwen2.5-Coder-0.5B (Hermes format): a forced call parsed from the reply, the
    SDK runs the tool, and the run ends with the tool's output as its result
    (`stop_on_first_tool`: a 0.5B model answers a tool result with the same call again, so
    an open-ended loop would only measure the model)."""
    agents = pytest.importorskip("agents")
    path = cached_path(QWEN_CODER_0_5B)
    if path is None:
        pytest.skip("Qwen2.5-Coder-0.5B-Instruct is not fetched (make models)")
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(("get_weather", city))
        return f"Sunny, 21 C in {city}."

    @agents.function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        seen.append(("get_time", city))
        return f"It is 14:05 in {city}."

    llm = LLM(path, n_ctx=4096, n_threads=2, n_seq_max=1)
    rs = start_in_thread(make_server(llm, 1, "qwen"))
    try:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{rs.port}/v1", api_key="none",
                                    timeout=120, max_retries=0)
        agent = agents.Agent(
            name="assistant", instructions="Answer with the tools.",
            tools=[get_weather, get_time],
            model=agents.OpenAIResponsesModel(model="qwen", openai_client=client),
            # required for the first turn; the SDK resets it to auto after a tool ran
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                max_tokens=128),
            tool_use_behavior="stop_on_first_tool")
        result = asyncio.run(agents.Runner.run(
            agent, "What is the weather and the local time in Paris?", max_turns=6))
    finally:
        rs.stop()
        llm.close()
    assert seen and all(name in ("get_weather", "get_time") and city == "Paris"
                        for name, city in seen)
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem"]
    name, city = seen[0]
    assert result.final_output == (f"Sunny, 21 C in {city}." if name == "get_weather" else
                                   f"It is 14:05 in {city}.")
