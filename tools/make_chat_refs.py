"""Make tests/data/chat_template_refs.json: chat prompts rendered by llama.cpp and
llama-cpp-python, which pyggml's chat templates (pyggml/llm/chat.py) must reproduce exactly.

Run with the Python of a separate venv that has llama-cpp-python (never a pyggml dependency),
from the repository root:

    /work/ref/llamacpp-venv/bin/python tools/make_chat_refs.py \
        --model ~/.cache/pyggml/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/data/chat_template_refs.json

For every message list below, with and without the generation prompt:
- "model": SmolLM2-135M-Instruct's own tokenizer.chat_template through
  llama_chat_format.Jinja2ChatFormatter (bos/eos tokens from the model);
- "llama_cpp": each built-in template name through llama.cpp's C++ formatter
  (llama_chat_apply_template with the name);
- "jinja2_formatter": pyggml's Jinja text of each built-in through Jinja2ChatFormatter (the
  Jinja environment is llama-cpp-python's, not pyggml's).
"""

import argparse
import ctypes
import json
import sys
from pathlib import Path

MESSAGE_SETS = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [{"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": "Name three colours."}],
    "multi_turn": [{"role": "system", "content": "  Answer in one line.\n"},
                   {"role": "user", "content": "Hello! Ünïcødé ✓ 你好"},
                   {"role": "assistant", "content": " Hi, how can I help? "},
                   {"role": "user", "content": "Tell me a joke.\n\n"}],
    "no_system_multi": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4"},
                        {"role": "user", "content": "And 3+3?"}],
    "prefill": [{"role": "user", "content": "Write a haiku about the sea."},
                {"role": "assistant", "content": "Waves"}],
}


def cpp_render(llama_cpp, name: str, messages, add_ass: bool) -> str:
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_ass, None, 0)
    if n < 0:
        raise RuntimeError(f"llama.cpp does not know the template {name!r}")
    buf = ctypes.create_string_buffer(n + 1)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_ass, buf, n + 1)
    return buf.raw[:n].decode("utf-8")


def _pyggml_builtin_templates() -> dict:
    """pyggml/llm/chat.py's built-ins, loaded by path: it needs only jinja2 and pyggml/errors.py,
    while importing the pyggml package would need its native library and dependencies."""
    import importlib.util
    import types
    root = Path(__file__).resolve().parents[1] / "pyggml"
    for name, rel in (("pyggml.errors", "errors.py"), ("pyggml.llm.chat", "llm/chat.py")):
        for pkg in ("pyggml", "pyggml.llm"):
            sys.modules.setdefault(pkg, types.ModuleType(pkg))
        spec = importlib.util.spec_from_file_location(name, root / rel)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["pyggml.llm.chat"].BUILTIN_TEMPLATES


def main() -> None:
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    BUILTIN_TEMPLATES = _pyggml_builtin_templates()

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    m = Llama(args.model, vocab_only=True, verbose=False)
    tmpl = m.metadata["tokenizer.chat_template"]
    bos = m.detokenize([m.token_bos()], special=True).decode()
    eos = m.detokenize([m.token_eos()], special=True).decode()
    out = {"llama_cpp_python": llama_cpp.__version__, "model_file": Path(args.model).name,
           "model_template": tmpl, "bos_token": bos, "eos_token": eos,
           "message_sets": MESSAGE_SETS, "model": {}, "llama_cpp": {}, "jinja2_formatter": {}}
    for gen in (True, False):
        key = "gen" if gen else "nogen"
        fmt = Jinja2ChatFormatter(tmpl, eos, bos, add_generation_prompt=gen)
        out["model"][key] = {s: fmt(messages=msgs).prompt for s, msgs in MESSAGE_SETS.items()}
        out["llama_cpp"][key] = {name: {s: cpp_render(llama_cpp, name, msgs, gen)
                                        for s, msgs in MESSAGE_SETS.items()}
                                 for name in BUILTIN_TEMPLATES}
        out["jinja2_formatter"][key] = {
            name: {s: Jinja2ChatFormatter(src, eos, bos, add_generation_prompt=gen)(
                messages=msgs).prompt for s, msgs in MESSAGE_SETS.items()}
            for name, src in BUILTIN_TEMPLATES.items()}
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
