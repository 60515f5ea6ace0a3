"""Chat templates (pyggml/llm/chat.py) against tests/data/chat_template_refs.json, made by
tools/make_chat_refs.py with llama-cpp-python 0.3.36: SmolLM2's own template through
Jinja2ChatFormatter, every built-in through llama.cpp's C++ formatter of that name and through
Jinja2ChatFormatter; plus errors that name the template, line or option."""
import json
from pathlib import Path

import pytest

from pyggml.errors import ChatTemplateError
from pyggml.llm.chat import (BUILTIN_TEMPLATES, ChatTemplate, chat_prompt, load_chat_template,
                             normalize_messages)

REFS = json.loads((Path(__file__).parent / "data" / "chat_template_refs.json").read_text())
SETS = REFS["message_sets"]


@pytest.mark.parametrize("gen", ["gen", "nogen"])
def test_model_template_equals_llama_cpp_python(gen):
    t = ChatTemplate(REFS["model_template"], "smollm2", REFS["bos_token"], REFS["eos_token"])
    for name, msgs in SETS.items():
        assert t.render(msgs, gen == "gen") == REFS["model"][gen][name], name


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_equals_llama_cpp_and_its_jinja_formatter(name):
    t = load_chat_template(name, None)
    for gen in ("gen", "nogen"):
        for s, msgs in SETS.items():
            got = t.render(msgs, gen == "gen")
            assert got == REFS["llama_cpp"][gen][name][s], (gen, s)
            assert got == REFS["jinja2_formatter"][gen][name][s], (gen, s)


def test_every_builtin_has_a_reference():
    assert set(REFS["llama_cpp"]["gen"]) == set(BUILTIN_TEMPLATES)
    for must in ("chatml", "gemma", "llama3", "llama2", "phi3", "mistral-v7"):
        assert must in BUILTIN_TEMPLATES


def test_missing_template_names_the_option():
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        load_chat_template(None, None)
    with pytest.raises(ChatTemplateError, match="neither a file nor a built-in name"):
        load_chat_template("no-such-template", "x")


def test_template_from_a_file_and_errors_name_file_and_line(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}\n{{ m.content }}|{% endfor %}")
    assert load_chat_template(f, None).render([{"role": "user", "content": "a"}]) == "a|"
    bad = tmp_path / "bad.jinja"
    bad.write_text("ok\n{% for m in messages %}\n{{ m.content \n")
    with pytest.raises(ChatTemplateError, match=rf"{bad}, line \d"):
        load_chat_template(bad, None)
    raising = tmp_path / "raise.jinja"
    raising.write_text("line one\n{% if messages[0].role != 'system' %}\n"
                       "{{ raise_exception('need a system message') }}\n{% endif %}")
    with pytest.raises(ChatTemplateError, match=r"raise.jinja, line 3: raised: need a system"):
        load_chat_template(raising, None).render([{"role": "user", "content": "x"}])


def test_environment_features():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{{ m | tojson }}{% endfor %}{{ strftime_now('%Y') | length }}"
                     "{% generation %}G{% endgeneration %}{{ tools | tojson }}", "t")
    out = t.render([{"role": "user", "content": "é<"}, {"role": "user", "content": "no"}],
                   tools=[{"a": 1}])
    assert out == '{"role": "user", "content": "é<"}4G[{"a": 1}]'
    with pytest.raises(ChatTemplateError, match="SecurityError|unsafe|access"):
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
                     "evil").render([])


def test_messages_are_checked_and_prefill_continues_the_reply():
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]\.role"):
        normalize_messages([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.content"):
        normalize_messages([{"role": "user", "content": 3}])
    assert normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}]) \
        == [{"role": "user", "content": "a\nb"}]
    t = load_chat_template("chatml", None)
    p = chat_prompt(t, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Wa"}])
    assert p == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nWa"
