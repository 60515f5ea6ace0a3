"""Reasoning markers (pyggml/llm/reasoning.py), no model: the format chosen from real chat
templates, whether a rendered prompt opened the block, the streaming split into reasoning and
content over any split of the text, and the text that closes a block when a budget is spent."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml.llm.chat import ChatTemplate
from pyggml.llm.reasoning import (GEMMA4, HARMONY, MISTRAL_THINK, THINK, ReasoningFormatError,
                                  ReasoningSplitter, budget_close_text, opens_in_prompt,
                                  reasoning_for_template)
from pyggml.llm.toolcalls import HarmonyFormat

TEMPLATES = Path(__file__).parent / "data" / "templates"


def _source(name):
    return (TEMPLATES / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("template,fmt", [
    ("Qwen-Qwen3-0.6B.jinja", THINK), ("Qwen-QwQ-32B.jinja", THINK),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", THINK),
    ("HuggingFaceTB-SmolLM3-3B.jinja", THINK),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", MISTRAL_THINK),
    ("openai-gpt-oss-120b.jinja", HARMONY), ("google-gemma-4-31B-it.jinja", GEMMA4),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", None), ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
])
def test_format_from_template(template, fmt):
    assert reasoning_for_template(_source(template)) == fmt


def _prompt(template, **kwargs):
    return ChatTemplate(_source(template), template, "<s>", "</s>").render(
        [{"role": "user", "content": "Hi"}], True, None, **kwargs)


def test_opens_in_prompt_from_rendered_templates():
    # QwQ and the R1 distills open the block in the prompt (llama.cpp's copies close it again
    # unless enable_thinking, which llama-server passes as true by default)
    for t in ("Qwen-QwQ-32B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"):
        assert opens_in_prompt(THINK, _prompt(t, enable_thinking=True))
        assert not opens_in_prompt(THINK, _prompt(t, enable_thinking=False))
    # Qwen3 lets the model open it; with enable_thinking=false the prompt opens and closes it
    assert not opens_in_prompt(THINK, _prompt("Qwen-Qwen3-0.6B.jinja"))
    off = _prompt("Qwen-Qwen3-0.6B.jinja", enable_thinking=False)
    assert "</think>" in off and not opens_in_prompt(THINK, off)
    assert not opens_in_prompt(HARMONY, _prompt("openai-gpt-oss-120b.jinja"))
    # Gemma 4: thinking off closes an empty thought in the prompt; on, the model opens it
    for on in (False, True):
        p = _prompt("google-gemma-4-31B-it.jinja", enable_thinking=on)
        assert p.endswith("<|turn>model\n" if on else "<|channel>thought\n<channel|>")
        assert not opens_in_prompt(GEMMA4, p)
    assert not opens_in_prompt(None, "<think>\n")


def _split(fmt, text, started=False, cuts=()):
    s = ReasoningSplitter(fmt, started)
    events, last = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        events += s.feed(text[last:cut])
        last = cut
    events += s.finish()
    reasoning = "".join(t for k, t in events if k == "reasoning")
    content = "".join(t for k, t in events if k == "content")
    assert reasoning == s.reasoning and content == s.content
    return reasoning, content


# (format, started_in_prompt, text, reasoning, content)
CASES = [
    (THINK, False, "<think>\nThe user greets.\n</think>\n\nHello!", "The user greets.", "Hello!"),
    (THINK, True, "Plan: reply.\n</think>\n\nHello!", "Plan: reply.", "Hello!"),
    (THINK, False, "Hello, no thinking.", "", "Hello, no thinking."),
    (THINK, True, "cut off while thinking ", "cut off while thinking", ""),
    (THINK, False, "<think></think>Hi", "", "Hi"),
    (THINK, False, "a < b and <thin are not markers", "", "a < b and <thin are not markers"),
    (THINK, False, "<think>x</think>\n<tool_call>\n{}\n</tool_call>", "x",
     "<tool_call>\n{}\n</tool_call>"),
    (MISTRAL_THINK, False, "[THINK]Count the rs.[/THINK]There are 3.", "Count the rs.",
     "There are 3."),
    (GEMMA4, False, "<|channel>thought\nThe user greets.\n<channel|>Hello!", "The user greets.",
     "Hello!"),
    # llama.cpp's parser: an empty channel and a stray end marker in the content are dropped
    (GEMMA4, False, "<|channel><|channel>thought\nx<channel|>Hi<channel|>", "x", "Hi"),
    (GEMMA4, False, "Hi.<|channel>thought\n<channel|>", "", "Hi."),
    (GEMMA4, False, "a <|chan b <channel c", "", "a <|chan b <channel c"),
    (GEMMA4, False, "<|channel>thought\nstep<channel|><|tool_call>call:f{}<tool_call|>", "step",
     "<|tool_call>call:f{}<tool_call|>"),
    (HARMONY, False, "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant"
                     "<|channel|>final<|message|>Hello!<|return|>", "User says hi.",
     "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>"),
]


@pytest.mark.parametrize("fmt,started,text,reasoning,content", CASES)
def test_split_whole(fmt, started, text, reasoning, content):
    assert _split(fmt, text, started) == (reasoning, content)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("fmt,started,text,reasoning,content", CASES)
def test_split_streaming_over_any_split(fmt, started, text, reasoning, content, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    assert _split(fmt, text, started, cuts) == (reasoning, content)


def test_no_marker_reaches_either_side_one_character_at_a_time():
    text = "<think>\nstep 1\nstep 2\n</think>\n\nThe answer."
    s = ReasoningSplitter(THINK)
    events = []
    for ch in text:
        events += s.feed(ch)
    events += s.finish()
    assert all("<" not in t for _, t in events)
    assert s.reasoning == "step 1\nstep 2" and s.content == "The answer."


def test_harmony_content_is_read_by_the_harmony_tool_format():
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
            "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}"
            "<|call|>")
    reasoning, content = _split(HARMONY, text)
    assert reasoning == "Need weather."
    text_only, calls = HarmonyFormat().parse(content)
    assert text_only == "" and calls[0].name == "get_weather"
    final, calls = HarmonyFormat().parse(_split(HARMONY, CASES[-1][2])[1])
    assert (final, calls) == ("Hello!", [])


def test_budget_close_text_ends_the_block():
    for fmt in (THINK, MISTRAL_THINK, HARMONY, GEMMA4):
        close = budget_close_text(fmt)
        reasoning, content = _split(fmt, fmt.start + "thinking on and on" + close + "Answer.")
        assert (reasoning, content.split("<|message|>")[-1]) == ("thinking on and on", "Answer.")
    with pytest.raises(ReasoningFormatError):
        budget_close_text("think")
    with pytest.raises(ReasoningFormatError):
        ReasoningSplitter(None)
