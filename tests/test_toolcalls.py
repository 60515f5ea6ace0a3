"""Tool calls as text (pyggml/llm/toolcalls.py), no model: per family, the format chosen from a
real chat template (tests/data/templates, made by tools/make_template_fixtures.py), the prepared
messages rendering through pyggml's ChatTemplate, outputs written as each family writes them
parsed (malformed ones as content, never an exception), streaming over any split equal to
parsing the whole, and every grammar compiling in llguidance, accepting the family's call and
rejecting arguments that break the schema."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml.llm.chat import ChatTemplate, normalize_messages
from pyggml.llm.toolcalls import (FORMATS, Gemma4Format, GenericFormat, HarmonyFormat,
                                  HermesFormat, Llama3Format, MistralFormat, Qwen3CoderFormat, ToolCall,
                                  ToolSpecError, format_for_template, prepare_messages,
                                  template_supports_system_role)

TEMPLATES = Path(__file__).parent / "data" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]

# template file -> (format name, the call to get_weather(city="Paris") as the template renders it)
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (
        "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '</tool_call>'),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": (
        "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '</tool_call>'),
    "Qwen-Qwen3-0.6B.jinja": (
        "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '</tool_call>'),
    "Qwen-QwQ-32B.jinja": (
        "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '</tool_call>'),
    "Qwen3-Coder.jinja": (
        "qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                       "</parameter>\n</function>\n</tool_call>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (
        "llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (
        "llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (
        "llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (
        "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                   '"id": "abcDEF123"}]'),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": (
        "mistral", '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}'),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": (
        "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    "unsloth-mistral-Devstral-Small-2507.jinja": (
        "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    "openai-gpt-oss-120b.jinja": (
        "harmony", '<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                   '<|message|>{"city": "Paris"}<|call|>'),
    "microsoft-Phi-3.5-mini-instruct.jinja": (
        "generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}, '
                   '"id": "abcDEF123"}}'),
    "google-gemma-4-31B-it.jinja": (
        "gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    "google-gemma-2-2b-it.jinja": (
        "generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}, '
                   '"id": "abcDEF123"}}'),
}


def _source(name):
    return (TEMPLATES / name).read_text(encoding="utf-8")


def _conversation(call_id="abcDEF123"):
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
    ]


# ---- format choice and rendering -------------------------------------------------------------
@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_template_renders_the_call_and_its_result(template):
    src = _source(template)
    fmt_name, call_text = FAMILIES[template]
    fmt = format_for_template(src)
    assert fmt.name == fmt_name
    tpl = ChatTemplate(src, template, "<s>", "</s>")
    msgs = prepare_messages(_conversation(), fmt, TOOLS,
                            system_role=template_supports_system_role(tpl))
    prompt = tpl.render(normalize_messages(msgs), True, TOOLS)
    assert call_text in prompt           # the call as the model would have written it
    assert "sunny, 21 C" in prompt       # the result went back through the template
    assert "Weather in Paris?" in prompt
    if fmt_name == "generic":
        assert "get_weather" in prompt.split("Weather in Paris?")[0]   # tools described
    # and what the template wrote reads back as the call
    content, calls = fmt.parse(call_text, TOOLS)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather",
                                                                   {"city": "Paris"})]


def test_openai_ids_become_mistral_ids_consistently():
    fmt = format_for_template(_source("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
    msgs = prepare_messages(_conversation("call_0123456789abcdefghijklmn"), fmt, TOOLS)
    cid = msgs[2]["tool_calls"][0]["id"]
    assert len(cid) == 9 and cid.isalnum() and msgs[3]["tool_call_id"] == cid
    prompt = ChatTemplate(_source("mistralai-Mistral-Nemo-Instruct-2407.jinja"), "nemo",
                          "<s>", "</s>").render(normalize_messages(msgs), True, TOOLS)
    assert f'"id": "{cid}"' in prompt and f'"call_id": "{cid}"' in prompt


def test_harmony_gets_one_call_per_message_each_followed_by_its_result():
    fmt = HarmonyFormat()
    msgs = [{"role": "user", "content": "Paris and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function",
                 "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "noon"}]
    prompt = ChatTemplate(_source("openai-gpt-oss-120b.jinja"), "gpt-oss").render(
        normalize_messages(prepare_messages(msgs, fmt, TOOLS)), True, TOOLS)
    assert prompt.index("to=functions.get_weather") < prompt.index('"sunny"') \
        < prompt.index("to=functions.get_time") < prompt.index('"noon"')
    assert "<|start|>functions.get_time to=assistant" in prompt


def test_format_choice_for_unknown_or_missing_templates():
    assert isinstance(format_for_template(None), GenericFormat)
    assert isinstance(format_for_template("{{ messages }}"), GenericFormat)
    assert isinstance(format_for_template(_source("Qwen3-Coder.jinja")), Qwen3CoderFormat)


def test_generic_system_prompt_describes_tools_and_format():
    text = GenericFormat().system_prompt(TOOLS)
    assert "get_weather" in text and "get_time" in text
    assert '"tool_call"' in text and '"response"' in text


def test_bad_tools_are_typed_errors():
    for bad in ("x", [1], [{"type": "retrieval"}], [{"function": {"name": "a b"}}],
                [{"function": {"name": "f", "parameters": 3}}]):
        with pytest.raises(ToolSpecError):
            HermesFormat().grammar(bad)
    with pytest.raises(ToolSpecError, match="nope"):
        HermesFormat().grammar(TOOLS, name="nope")
    with pytest.raises(ToolSpecError):
        prepare_messages([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{not json"}}]}], HermesFormat())


# ---- parsing ---------------------------------------------------------------------------------
def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


PARIS = ("get_weather", {"city": "Paris"})
ROME = ("get_weather", {"city": "Rome", "days": 2})

# format -> [(text, content, calls)]
OUTPUTS = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "", [PARIS]),
        ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", '
         '"days": 2}}\n</tool_call>', "Let me look.", [PARIS, ROME]),
        # Qwen sometimes stops before the closing tag; arguments given as a JSON string
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
         "", [PARIS]),
        ("<tool_call>\nnot json\n</tool_call> sorry", "<tool_call>\nnot json\n</tool_call> sorry",
         []),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', []),
        ("The tag <tool_ is not a call", "The tag <tool_ is not a call", []),
    ],
    "qwen3_coder": [
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call>", "", [PARIS]),
        ("I will check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
         "<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
         "</tool_call>", "I will check both.", [PARIS, ROME]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", 
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", []),
        ("<tool_call>\n<oops>\n</tool_call>", "<tool_call>\n<oops>\n</tool_call>", []),
    ],
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
         "", [PARIS]),
        ('{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_weather", "parameters": {"city": "Rome", "days": 2}}', "",
         [PARIS, ROME]),
        ('{"answer": 42}', '{"answer": 42}', []),
        ('The JSON {"name": "x", "parameters": {}} is an example.',
         'The JSON {"name": "x", "parameters": {}} is an example.', []),
        ('{"name": "get_weather", "parameters": {"city"', '{"name": "get_weather", '
         '"parameters": {"city"', []),
    ],
    "mistral": [
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [PARIS]),
        ('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather'
         '[CALL_ID]abcDEF123[ARGS]{"city": "Rome", "days": 2}', "Checking.", [PARIS, ROME]),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": '
         '"abcDEF123"}, {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}]', "",
         [PARIS, ROME]),
        ("[TOOL_CALLS] oops", "[TOOL_CALLS] oops", []),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": ', '[TOOL_CALLS]get_weather[ARGS]{"city": ', []),
    ],
    "harmony": [
        ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
         '{"city": "Paris"}<|call|>', "", [PARIS]),
        ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant'
         '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
         '{"city": "Paris"}', "Need the weather.", [PARIS]),
        ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
         '{"city": "Paris"}<|call|>', "", [PARIS]),
        ("<|channel|>final<|message|>It is sunny.<|return|>", "It is sunny.", []),
        ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{oops}'
         '<|call|>', '<|channel|>commentary to=functions.get_weather <|constrain|>json'
         '<|message|>{oops}<|call|>', []),
    ],
    "gemma4": [
        ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "", [PARIS]),
        ('Checking both.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
         '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:2}<tool_call|>',
         "Checking both.", [PARIS, ROME]),
        # strings may hold anything but the quote token; keys bare, spaces allowed as llama.cpp
        ('<|tool_call>call:f{q:<|"|>a}b, "c"\n<|"|>, n: {x: [1, -2.5, true, null, <|"|>s<|"|>]'
         '}, e:{}}<tool_call|>', "",
         [("f", {"q": 'a}b, "c"\n', "n": {"x": [1, -2.5, True, None, "s"]}, "e": {}})]),
        ('<|tool_call>call:get_weather{city:Paris}<tool_call|> sorry',
         '<|tool_call>call:get_weather{city:Paris}<tool_call|> sorry', []),
        ('<|tool_call>call:get_weather{city:<|"|>Par', '<|tool_call>call:get_weather{city:<|"|>Par',
         []),
        ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}', '<|tool_call>call:get_weather'
         '{city:<|"|>Paris<|"|>}', []),
        ("The <|tool_ tag alone", "The <|tool_ tag alone", []),
    ],
    "generic": [
        ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [PARIS]),
        ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": '
         '"get_weather", "arguments": {"city": "Rome", "days": 2}}]}', "", [PARIS, ROME]),
        ('{"response": "Hello there."}', "Hello there.", []),
        ("Hello there.", "Hello there.", []),
        ('{"tool_call": {"name": "get_weather"', '{"tool_call": {"name": "get_weather"', []),
        ('{"something": "else"}', '{"something": "else"}', []),
    ],
}
PARSE_CASES = [(f, t, c, k) for f, cases in OUTPUTS.items() for t, c, k in cases]


@pytest.mark.parametrize("fmt_name,text,content,calls", PARSE_CASES)
def test_parse(fmt_name, text, content, calls):
    got_content, got_calls = FORMATS[fmt_name].parse(text, TOOLS)
    assert got_content == content
    assert _calls(got_calls) == calls
    for c in got_calls:
        assert isinstance(c, ToolCall) and c.id
        assert c.arguments == json.dumps(json.loads(c.arguments), separators=(",", ":"),
                                         ensure_ascii=False)   # compact


def test_ids_are_the_models_when_it_writes_them():
    _, calls = FORMATS["mistral"].parse(
        '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}')
    assert calls[0].id == "abcDEF123"
    _, calls = FORMATS["mistral"].parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    _, calls = FORMATS["hermes"].parse(OUTPUTS["hermes"][0][0])
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29


def test_qwen3_coder_values_are_typed_by_the_schema():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"},
                                         "o": {"type": "object"}, "b": {"type": "boolean"},
                                         "bad": {"type": "number"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=n>\n12\n</parameter>\n<parameter=s>\n12\n"
            "</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n<parameter=b>\ntrue\n"
            "</parameter>\n<parameter=bad>\nlots\n</parameter>\n</function>\n</tool_call>")
    _, calls = Qwen3CoderFormat().parse(text, tools)
    assert json.loads(calls[0].arguments) == {"n": 12, "s": "12", "o": {"k": [1]}, "b": True,
                                              "bad": "lots"}
    # multi-line text keeps its inner newlines
    _, calls = Qwen3CoderFormat().parse(
        "<tool_call>\n<function=f>\n<parameter=s>\nline 1\n\nline 2\n</parameter>\n</function>\n"
        "</tool_call>", tools)
    assert json.loads(calls[0].arguments) == {"s": "line 1\n\nline 2"}


@pytest.mark.parametrize("fmt_name", sorted(FORMATS))
def test_parse_never_raises(fmt_name):
    fmt = FORMATS[fmt_name]
    for text in ("", " ", "{", "}", "[", "<", "<tool_call>", "[TOOL_CALLS]", "<|channel|>",
                 "<|start|>", '{"name": 1}', "<tool_call>{}</tool_call>", "\x00\uffff",
                 '[TOOL_CALLS][{"name": "f"}, 3]', "<|channel|>x to=functions.f<|message|>[]",
                 "<|tool_call>", "<|tool_call>call:f{", "<|tool_call>call:f{a:[<|\"|>",
                 "<|tool_call>call:f{a:1,}<tool_call|>", "<|tool_call>call:{}<tool_call|>",
                 "<|tool_call>call:f{a:-}<tool_call|>", "<|tool_call>call:f{:1}<tool_call|>"):
        content, calls = fmt.parse(text, TOOLS)
        assert isinstance(content, str) and isinstance(calls, list)


# ---- streaming -------------------------------------------------------------------------------
def _stream(fmt, text, cuts):
    s = fmt.stream(TOOLS)
    events, last = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        events += s.feed(text[last:cut])
        last = cut
    events += s.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    calls: dict[int, list] = {}
    for e in events:
        if e[0] == "call":
            assert e[1] == len(calls)        # indexes in order, header before arguments
            calls[e[1]] = [e[3], ""]
        elif e[0] == "args":
            calls[e[1]][1] += e[2]
    return content, [(n, json.loads(a)) for n, a in calls.values()], events


STREAM_TEXTS = [(f, t) for f, cases in OUTPUTS.items() for t, _, _ in cases]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("fmt_name,text", STREAM_TEXTS)
def test_streaming_equals_parsing_over_any_split(fmt_name, text, data):
    fmt = FORMATS[fmt_name]
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    content, calls, events = _stream(fmt, text, cuts)
    want_content, want_calls = fmt.parse(text, TOOLS)
    assert content == want_content
    assert calls == _calls(want_calls)


@pytest.mark.parametrize("fmt_name", ["hermes", "qwen3_coder", "mistral", "harmony", "gemma4"])
def test_no_markup_reaches_content_while_streaming(fmt_name):
    fmt = FORMATS[fmt_name]
    text = OUTPUTS[fmt_name][1][0]          # content, then calls
    _, _, events = _stream(fmt, text, range(len(text)))     # one character at a time
    streamed = "".join(e[1] for e in events if e[0] == "content")
    for marker in ("<tool", "[TOOL", "<|", "<function", "<param"):
        assert marker not in streamed


# ---- grammars --------------------------------------------------------------------------------
llguidance = pytest.importorskip("llguidance")


class _ByteTokenizer:
    """256 byte tokens, then an end token and the special tokens the families use, so grammars
    can be driven a byte (or a special token) at a time."""
    SPECIALS = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|start|>",
                "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>",
                "<|return|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"]

    def __init__(self):
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"] + \
            [b"\xff" + s.encode() for s in self.SPECIALS]
        self.special_token_ids = list(range(256, 257 + len(self.SPECIALS)))
        self.ids = {s: 257 + i for i, s in enumerate(self.SPECIALS)}

    def __call__(self, s):
        return list(s if isinstance(s, bytes) else s.encode())


@pytest.fixture(scope="module")
def bytetok():
    t = _ByteTokenizer()
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(t)), t


def _tokens(text, ids):
    """Byte tokens of text, with the markers in `ids` as their one token."""
    out, i = [], 0
    while i < len(text):
        for m, tid in ids.items():
            if text.startswith(m, i):
                out.append(tid)
                i += len(m)
                break
        else:
            out.extend(text[i].encode())
            i += 1
    return out


def _accepts(tok, grammar, text, ids=None):
    m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    for t in _tokens(text, ids or {}):
        if not m.consume_token(t):
            return False
    return m.is_accepting()


# format -> (grammar kwargs, a call it must accept, a call whose arguments break the schema)
GRAMMAR_CASES = [
    (HermesFormat(), {}, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                         '\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'),
    (HermesFormat(), {"parallel": True},
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n'
     '</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 9}}\n'
     '</tool_call>'),
    (Qwen3CoderFormat(), {}, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\n"
                             "Francisco <CA>\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                             "</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n"
     "</tool_call>"),
    (Llama3Format(), {}, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     '{"name": "get_weather", "parameters": {"city": 7}}'),
    (Llama3Format(), {}, '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}',
     '<|python_tag|>{"name": "get_time", "parameters": {"zone": "PST"}}'),
    (MistralFormat("args"), {"parallel": True},
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "extra": 1}'),
    (MistralFormat("call_id"), {}, '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]'
                                   '{"city": "Paris"}',
     '[TOOL_CALLS]get_weather[CALL_ID]abc[ARGS]{"city": "Paris"}'),
    (MistralFormat("list"), {}, '[TOOL_CALLS][{"name": "get_weather", "arguments": '
                                '{"city": "Paris"}, "id": "abcDEF123"}]',
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {}, "id": "abcDEF123"}]'),
    (HarmonyFormat(), {}, '<|channel|>commentary to=functions.get_weather <|constrain|>json'
                          '<|message|>{"city": "Paris"}<|call|>',
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
     '{"city": ["Paris"]}<|call|>'),
    (GenericFormat(), {}, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
     '{"tool_call": {"name": "get_weather", "arguments": {"days": 2}}}'),
    (GenericFormat(), {}, '{"response": "Hello!"}',
     '{"tool_call": {"name": "get_nothing", "arguments": {}}}'),
    (GenericFormat(), {"required": True, "parallel": True},
     '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}',
     '{"response": "Hello!"}'),
    (Gemma4Format(), {}, '<|tool_call>call:get_weather{city:<|"|>Paris, "TX" {}<|"|>,days:3}'
                         '<tool_call|>',
     '<|tool_call>call:get_weather{days:3}<tool_call|>'),
    (Gemma4Format(), {"parallel": True},
     '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
     '<|tool_call>call:get_time{zone:<|"|>UTC<|"|>}<tool_call|>',
     '<|tool_call>call:get_time{zone:<|"|>PST<|"|>}<tool_call|>'),
    # required: a thought may come first (thinking on); days is an integer
    (Gemma4Format(), {"required": True}, '<|channel>thought\nCall it.<channel|>'
     '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>',
     '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:2.5}<tool_call|>'),
    (Gemma4Format(), {"name": "get_time"},
     '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>',
     '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    (HermesFormat(), {"name": "get_time"},
     '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
]


@pytest.mark.parametrize("fmt,kwargs,good,bad", GRAMMAR_CASES,
                         ids=[f"{c[0].name}-{i}" for i, c in enumerate(GRAMMAR_CASES)])
@pytest.mark.parametrize("special", [False, True], ids=["text", "special-tokens"])
def test_grammar_accepts_the_call_and_rejects_bad_arguments(bytetok, fmt, kwargs, good, bad,
                                                            special):
    tok, raw = bytetok
    ids = {m: raw.ids[m] for m in fmt.markers if m in raw.ids} if special else None
    g = fmt.grammar(TOOLS, token_ids=ids, **kwargs)
    assert llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(g), tok) == ""
    assert _accepts(tok, g, good, ids)
    assert not _accepts(tok, g, bad, ids)
    if (fmt.triggers or fmt.start_triggers) and not (isinstance(fmt, Gemma4Format) and
                                                     kwargs.get("required")):
        # a lazy start can begin the grammar
        assert any(good.startswith(t) for t in fmt.triggers + fmt.start_triggers)
    # what the grammar makes reads back as calls
    if good.startswith("<|channel>"):           # a thought: the reasoning splitter's part
        good = good.split("<channel|>", 1)[1]
    content, calls = fmt.parse(good, TOOLS)
    assert (content, bool(calls)) in (("", True), ("Hello!", False))


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '  ```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n',
    '{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
])
def test_hermes_reads_untagged_calls_at_the_start(text):
    """Qwen2.5-Coder's bare or fenced JSON calls are calls; a JSON object that names no tool,
    or one after other text, stays content."""
    hermes = FORMATS["hermes"]
    content, calls = hermes.parse(text, TOOLS)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"})]
    for other in ('{"name": "Bob", "arguments": {}}', "Sure: " + text.strip()):
        content, calls = hermes.parse(other, TOOLS)
        assert calls == [] and content == other
