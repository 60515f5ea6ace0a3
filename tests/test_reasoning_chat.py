"""A thinking model's turn end to end (pyggml/llm/chatturn.py): the text between the thinking
markers goes to reasoning_content, never into content; a reasoning budget closes the block;
reasoning_format "none" keeps the raw text; streamed deltas equal the whole message.

SmolLM2-135M-Instruct with a chat template that opens a `<think>` block in the prompt, as
QwQ / DeepSeek-R1 / Qwen3 templates do (the model itself never thinks: the budget is what ends
its thinking, which is exactly what is under test)."""
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n"
    "{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
MSGS = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    t = tmp_path_factory.mktemp("tpl") / "thinking.jinja"
    t.write_text(THINKING_TEMPLATE)
    with LLM(ensure_smollm2(), n_ctx=1024, n_threads=2) as m:
        m.thinking_template = str(t)
        yield m


def _chat(llm, **kw):
    return llm.create_chat_completion(MSGS, chat_template=llm.thinking_template, max_tokens=40,
                                      temperature=0, **kw)


def test_the_budget_closes_the_thinking_block_and_content_follows(llm):
    r = _chat(llm, reasoning_budget=6)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"]
    assert "<think>" not in msg["content"] and "</think>" not in msg["content"]
    assert "</think>" not in msg["reasoning_content"]
    # six tokens of thinking (the text of at most six tokens), then the forced close
    assert len(llm.tokenize(msg["reasoning_content"], add_special=False)) <= 7


def test_without_a_budget_everything_is_reasoning_and_nothing_leaks(llm):
    r = _chat(llm)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] and not msg["content"]


def test_reasoning_format_none_keeps_the_raw_text(llm):
    raw = _chat(llm, reasoning_format="none", reasoning_budget=6)["choices"][0]["message"]
    split = _chat(llm, reasoning_budget=6)["choices"][0]["message"]
    assert "reasoning_content" not in raw
    # the same tokens: the raw text is the reasoning, the closing marker, then the content
    assert raw["content"].replace("</think>", "").split() == \
        (split["reasoning_content"] + " " + split["content"]).split()


def test_thinking_switched_off_through_chat_template_kwargs(llm):
    msg = _chat(llm, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert msg["content"] and not msg.get("reasoning_content")


def test_streamed_deltas_equal_the_whole_message(llm):
    whole = _chat(llm, reasoning_budget=6)["choices"][0]["message"]
    reasoning, content = "", ""
    for c in _chat(llm, reasoning_budget=6, stream=True):
        d = c["choices"][0]["delta"]
        reasoning += d.get("reasoning_content") or ""
        content += d.get("content") or ""
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
