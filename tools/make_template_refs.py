"""Make tests/data/template_refs_2026.json: the chat templates of the architectures of issue 32
(gpt-oss's harmony, SmolLM3, Ministral 3 / Mistral Small 3.2, Gemma 4, Gemma 3n; their files in
tests/data/templates/) rendered by llama-cpp-python's Jinja2ChatFormatter, which pyggml's
ChatTemplate (pyggml/llm/chat.py) must reproduce exactly (tests/test_chat_template_2026.py).

Run with the Python of the separate llama-cpp-python venv (never a pyggml dependency), from the
repository root:

    /work/ref/llamacpp-venv/bin/python tools/make_template_refs.py

Per template, for every message set below (plain turns, a system message, tools offered, an
assistant tool call and its result, earlier reasoning), with and without the generation prompt,
and with the template's own switches (CASES: enable_thinking, reasoning_effort): the rendered
prompt, or "ERROR: <message>" where the template raises. The messages are the form pyggml hands
to templates (tool-call arguments as objects, toolcalls.prepare_messages). strftime_now is
pinned to DATE on both sides, so the references do not depend on the day they were made.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "data" / "templates"
OUT = ROOT / "tests" / "data" / "template_refs_2026.json"
DATE = datetime.datetime(2026, 1, 15, 9, 30)

_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]
_CALL = {"id": "call0abc1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

MESSAGE_SETS = {
    "user": ({"messages": [{"role": "user", "content": "What is the capital of France?"}]}),
    "system_multi": {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hello! Ünïcødé ✓ 你好"},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "Tell me a joke.\n\n"}]},
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": _TOOLS},
    "tool_call_result": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather",
         "content": "{\"temperature\": 21}"}], "tools": _TOOLS},
    "reasoning": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four.",
         "thinking": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"}]},
}

# file -> (bos, eos, [extra template variables per case])
CASES = {
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>",
                                  [{}, {"reasoning_effort": "high"}]),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "<|im_end|>", [{}, {"enable_thinking": False}]),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("<s>", "</s>", [{}]),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>", [{}]),
    "google-gemma-4-31B-it.jinja": ("<bos>", "<eos>", [{}, {"enable_thinking": True}]),
    "google-gemma-3n-E4B-it.jinja": ("<bos>", "<eos>", [{}]),
    # issue 33's hybrids: Qwen 3.5 (qwen35, qwen35moe) and LFM2 / LFM2.5 (lfm2, lfm2moe)
    "Qwen3.5-4B.jinja": ("", "<|im_end|>", [{}, {"enable_thinking": False}]),
    "LFM2-8B-A1B.jinja": ("<|startoftext|>", "<|im_end|>", [{}]),
    "LFM2.5-Instruct.jinja": ("<|startoftext|>", "<|im_end|>", [{}, {"keep_past_thinking": True}]),
}


def main() -> int:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    Jinja2ChatFormatter.strftime_now = staticmethod(lambda f: DATE.strftime(f))
    out = {"llama_cpp_python": llama_cpp.__version__, "date": DATE.isoformat(),
           "message_sets": MESSAGE_SETS, "templates": {}}
    for name, (bos, eos, extras) in CASES.items():
        src = (TEMPLATES / name).read_text(encoding="utf-8")
        per = out["templates"][name] = {"bos": bos, "eos": eos, "cases": []}
        for extra in extras:
            renders = {}
            for gen in (True, False):
                fmt = Jinja2ChatFormatter(src, eos, bos, add_generation_prompt=gen)
                for s, kw in MESSAGE_SETS.items():
                    try:
                        r = fmt(messages=kw["messages"], tools=kw.get("tools"), **extra).prompt
                    except Exception as e:                  # noqa: BLE001 - kept as the reference
                        r = f"ERROR: {e}"
                    renders[f"{'gen' if gen else 'nogen'}.{s}"] = r
            per["cases"].append({"extra": extra, "renders": renders})
            n_err = sum(v.startswith("ERROR: ") for v in renders.values())
            print(f"{name} {extra}: {len(renders)} renders, {n_err} errors")
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
