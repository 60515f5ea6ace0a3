"""Gemma 4 replies in a chat turn (pyggml/llm/chatturn.py) under Gemma 4's own chat template
(tests/data/templates/google-gemma-4-31B-it.jinja), no model: the thought channel is
reasoning_content, `<|tool_call>call:NAME{...}<tool_call|>` calls are OpenAI tool_calls with
JSON arguments — however the text streams, no marker in any delta — and the history's calls
and results render the same through the current template (role "tool" messages) and an older
one (tool_responses folded into the assistant message, as llama.cpp does)."""
import json
from pathlib import Path

import pytest

from pyggml.llm.chat import ChatTemplate
from pyggml.llm.chatturn import ChatTurn
from pyggml.llm.toolcalls import Gemma4Format, format_for_template

TEMPLATE = (Path(__file__).parent / "data" / "templates" / "google-gemma-4-31B-it.jinja")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
MSGS = [{"role": "user", "content": "Weather in Paris and Rome?"}]
THOUGHT = "Two cities: two calls."
REPLY = (f"<|channel>thought\n{THOUGHT}\n<channel|>I will check.<|tool_call>call:get_weather"
         '{city:<|"|>Paris, "FR"<|"|>}<tool_call|><|tool_call>call:get_weather'
         '{city:<|"|>Rome<|"|>,days:2}<tool_call|>')


class _Tokenizer:
    bos_id = None

    def text_to_id(self, text):
        return None


class _NoModel:
    """What ChatTurn asks of a model when no generation runs."""
    tokenizer = _Tokenizer()

    def tokenize(self, text):
        return [0]


def _template(src=None):
    return ChatTemplate(src or TEMPLATE.read_text(encoding="utf-8"), "gemma4", "<bos>", "<eos>")


@pytest.mark.parametrize("chunk", [1, 4, 11, 1000])
def test_turn_splits_thought_content_and_calls_however_the_text_streams(chunk):
    t = ChatTurn(_NoModel(), _template(), MSGS, tools=TOOLS, parallel_tool_calls=True)
    assert isinstance(t.fmt, Gemma4Format) and t.rfmt.name == "gemma4"
    assert t.grammar is not None and t.grammar[1] == ("<|tool_call>",)     # lazy
    deltas = []
    for i in range(0, len(REPLY), chunk):
        deltas += t.feed(REPLY[i:i + chunk])
    deltas += t.finish()
    msg = t.message()
    assert msg["reasoning_content"] == THOUGHT and msg["content"] == "I will check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg["tool_calls"]] == [("get_weather", {"city": 'Paris, "FR"'}),
                                             ("get_weather", {"city": "Rome", "days": 2})]
    texts = [v for d in deltas for v in d.values() if isinstance(v, str)]
    texts += [c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", ())]
    assert all("<|" not in v and "|>" not in v for v in texts)


def test_required_tool_choice_is_forced_from_the_first_token():
    t = ChatTurn(_NoModel(), _template(), MSGS, tools=TOOLS, tool_choice="required")
    spec, triggers, _ = t.grammar
    assert triggers is None and "thought" in spec.text and "call:get_weather" in spec.text


def _history(call_text=None):
    msgs = MSGS + [
        {"role": "assistant", "content": call_text, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 21}'}]
    return msgs


def test_older_templates_get_tool_responses_and_render_the_same():
    src = TEMPLATE.read_text(encoding="utf-8")
    old = src.replace("OpenAI Chat Completions:", "Chat:")
    assert format_for_template(old).embedded_responses
    assert not format_for_template(src).embedded_responses
    new_prompt = ChatTurn(_NoModel(), _template(src), _history(), tools=TOOLS).prompt
    old_prompt = ChatTurn(_NoModel(), _template(old), _history(), tools=TOOLS).prompt
    assert ('<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>'
            in new_prompt)
    assert '<|tool_response>response:get_weather{temp:21}<tool_response|>' in old_prompt
    assert old_prompt.replace("{temp:21}", '{value:<|"|>{"temp": 21}<|"|>}') == new_prompt


def test_call_text_after_tool_results_gets_a_model_turn():
    """A call message with text closes its turn after the results, and the template opens no
    model turn then; llama.cpp appends one, so do we (without text the model goes on in the
    same turn)."""
    prompt = ChatTurn(_NoModel(), _template(), _history("Checking."), tools=TOOLS).prompt
    assert prompt.endswith("<tool_response|>Checking.<turn|>\n<|turn>model\n")
    prompt = ChatTurn(_NoModel(), _template(), _history(), tools=TOOLS).prompt
    assert prompt.endswith("<tool_response|>")


# ---- end to end: a real model's decoding forced into Gemma 4's call syntax -------------------
TIME = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]},
                                     "utc": {"type": "boolean"}}, "required": ["zone", "utc"]}}}]


@pytest.fixture(scope="module")
def smol():
    """SmolLM2-135M-Instruct under Gemma 4's template (the chat path decides everything from
    the template; the model does not speak Gemma 4, so the call comes from the grammar)."""
    from pyggml.llm.runtime import LLM
    from pyggml.models_pypi import ensure_smollm2
    with LLM(ensure_smollm2(), n_ctx=1024, n_threads=2) as m:
        yield m


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_time"}}])
def test_forced_call_decodes_whole_and_streamed(smol, choice):
    kw = dict(chat_template=str(TEMPLATE), tools=TIME, tool_choice=choice, max_tokens=60,
              temperature=0)
    r = smol.create_chat_completion([{"role": "user", "content": "Time?"}], **kw)["choices"][0]
    assert r["finish_reason"] == "tool_calls" and r["message"]["content"] is None
    (call,) = r["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_time" and args["zone"] in ("UTC", "CET") and \
        isinstance(args["utc"], bool)
    chunks = [c["choices"][0] for c in smol.create_chat_completion(
        [{"role": "user", "content": "Time?"}], stream=True, **kw)]
    streamed = "".join(tc["function"].get("arguments", "") for c in chunks
                       for tc in c["delta"].get("tool_calls", ()))
    assert json.loads(streamed) == args and chunks[-1]["finish_reason"] == "tool_calls"
