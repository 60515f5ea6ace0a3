"""Chat templates: a model's `tokenizer.chat_template` (Jinja) or a built-in one by name, rendered
the way llama-cpp-python's Jinja2ChatFormatter and transformers do: jinja2's immutable sandboxed
environment with trim_blocks, lstrip_blocks, loop controls, a `tojson` filter that keeps
non-ASCII text (json.dumps(ensure_ascii=False)), and the variables `messages`,
`add_generation_prompt`, `bos_token`, `eos_token`, `tools`, `raise_exception`, `strftime_now`.

The built-in templates have llama.cpp's names (src/llama-chat.cpp, `--chat-template NAME`) and
are Jinja re-statements of its C++ formatters; tests/data/chat_template_refs.json (made by
tools/make_chat_refs.py) holds llama.cpp's and llama-cpp-python's renderings they must equal.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from pyggml.errors import ChatTemplateError

# ---- built-in templates (llama.cpp's names) --------------------------------------------------
# Written on one logical line each (Python concatenation), so that trim_blocks / lstrip_blocks
# never touch their output; "\n" inside a Jinja string literal is a real newline.

def _gen(text: str) -> str:
    """The reply's opening, rendered when add_generation_prompt is set."""
    return "{% if add_generation_prompt %}{{ '" + text + "' }}{% endif %}"


def _each(body: str, gen: str | None = None) -> str:
    """A template that renders `body` for every message `m`, then `gen` for the reply."""
    return "{% for m in messages %}" + body + "{% endfor %}" + (_gen(gen) if gen else "")


def _llama2(sys: bool, bos: bool, strip: bool) -> str:
    content = "m.content|trim" if strip else "m.content"
    system = ("'<<SYS>>\n' + c + '\n<</SYS>>\n\n'" if sys else "c + '\n'")
    return ("{% set ns = namespace(inside=true) %}{{ '[INST] ' }}{% for m in messages %}"
            "{% set c = " + content + " %}"
            "{% if not ns.inside %}{% set ns.inside = true %}{{ '"
            + ("<s>[INST] " if bos else "[INST] ") + "' }}{% endif %}"
            "{% if m.role == 'system' %}{{ " + system + " }}"
            "{% elif m.role == 'user' %}{{ c + ' [/INST]' }}"
            "{% else %}{{ c + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}")


def _mistral(lead: str, trail: str, trim_reply: bool) -> str:
    reply = "(m.content|trim)" if trim_reply else "m.content"
    return ("{% set ns = namespace(inside=false) %}{% for m in messages %}"
            "{% if not ns.inside %}{{ '" + lead + "[INST]" + trail + "' }}"
            "{% set ns.inside = true %}{% endif %}"
            "{% if m.role == 'system' %}{{ m.content + '\n\n' }}"
            "{% elif m.role == 'user' %}{{ m.content + '" + lead + "[/INST]' }}"
            "{% else %}{{ '" + trail + "' + " + reply + " + '</s>' }}"
            "{% set ns.inside = false %}{% endif %}{% endfor %}")


def _mistral_v7(s: str) -> str:
    return _each("{% if m.role == 'system' %}{{ '[SYSTEM_PROMPT]" + s
                 + "' + m.content + '[/SYSTEM_PROMPT]' }}"
                 "{% elif m.role == 'user' %}{{ '[INST]" + s + "' + m.content + '[/INST]' }}"
                 "{% else %}{{ '" + s + "' + m.content + '</s>' }}{% endif %}")


def _merged_system(user_open: str, user_close: str, other: str, gen: str | None,
                   trim: bool) -> str:
    """Models without a system role: the system text goes before the next user message."""
    c = "(m.content|trim)" if trim else "m.content"
    return ("{% set ns = namespace(sys='') %}{% for m in messages %}"
            "{% if m.role == 'system' %}{% set ns.sys = ns.sys + " + c + " %}"
            "{% else %}" + user_open +
            "{% if ns.sys and m.role == 'user' %}{{ ns.sys + '\n\n' }}{% set ns.sys = '' %}"
            "{% endif %}{% if m.role == 'user' %}{{ " + c + " + '" + user_close + "' }}"
            "{% else %}{{ " + c + " + '" + other + "' }}{% endif %}{% endif %}{% endfor %}"
            + (_gen(gen) if gen else ""))


BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _each("{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}",
                    "<|im_start|>assistant\n"),
    "llama2": _llama2(sys=False, bos=False, strip=False),
    "llama2-sys": _llama2(sys=True, bos=False, strip=False),
    "llama2-sys-bos": _llama2(sys=True, bos=True, strip=False),
    "llama2-sys-strip": _llama2(sys=True, bos=False, strip=True),
    "mistral-v1": _mistral(" ", " ", False),
    "mistral-v3": _mistral("", " ", True),
    "mistral-v3-tekken": _mistral("", "", False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _each("{{ '<|' + m.role + '|>\n' + m.content + '<|end|>\n' }}", "<|assistant|>\n"),
    "phi4": _each("{{ '<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>' }}",
                  "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _each("{{ '<|' + m.role + '|>\n' + m.content + '\n' }}", "<|assistant|>\n"),
    "zephyr": _each("{{ '<|' + m.role + '|>\n' + m.content + '<|endoftext|>\n' }}",
                    "<|assistant|>\n"),
    "monarch": _each("{{ ('' if loop.first else '<s>') + m.role + '\n' + m.content + '</s>\n' }}",
                     "<s>assistant\n"),
    # gemma: "assistant" is "model"; the system text opens the next user turn
    "gemma": ("{% set ns = namespace(sys='') %}{% for m in messages %}"
              "{% if m.role == 'system' %}{% set ns.sys = ns.sys + (m.content|trim) %}"
              "{% else %}{% set role = 'model' if m.role == 'assistant' else m.role %}"
              "{{ '<start_of_turn>' + role + '\n' }}"
              "{% if ns.sys and role != 'model' %}{{ ns.sys + '\n\n' }}{% set ns.sys = '' %}"
              "{% endif %}{{ (m.content|trim) + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
              + _gen("<start_of_turn>model\n")),
    "orion": _merged_system("{% if m.role == 'user' %}{{ 'Human: ' }}{% endif %}",
                            "\n\nAssistant: </s>", "</s>", None, False),
    "openchat": _each("{% if m.role == 'system' %}{{ m.content + '<|end_of_turn|>' }}"
                      "{% else %}{{ 'GPT4 Correct ' + (m.role[:1]|upper) + m.role[1:] + ': '"
                      " + m.content + '<|end_of_turn|>' }}{% endif %}",
                      "GPT4 Correct Assistant:"),
    "vicuna": _each("{% if m.role == 'system' %}{{ m.content + '\n\n' }}"
                    "{% elif m.role == 'user' %}{{ 'USER: ' + m.content + '\n' }}"
                    "{% elif m.role == 'assistant' %}{{ 'ASSISTANT: ' + m.content + '</s>\n' }}"
                    "{% endif %}", "ASSISTANT:"),
    "vicuna-orca": _each("{% if m.role == 'system' %}{{ 'SYSTEM: ' + m.content + '\n' }}"
                         "{% elif m.role == 'user' %}{{ 'USER: ' + m.content + '\n' }}"
                         "{% elif m.role == 'assistant' %}"
                         "{{ 'ASSISTANT: ' + m.content + '</s>\n' }}{% endif %}", "ASSISTANT:"),
    "deepseek": _each("{% if m.role == 'system' %}{{ m.content }}"
                      "{% elif m.role == 'user' %}{{ '### Instruction:\n' + m.content + '\n' }}"
                      "{% elif m.role == 'assistant' %}"
                      "{{ '### Response:\n' + m.content + '\n<|EOT|>\n' }}{% endif %}",
                      "### Response:\n"),
    "deepseek2": _each("{% if m.role == 'system' %}{{ m.content + '\n\n' }}"
                       "{% elif m.role == 'user' %}{{ 'User: ' + m.content + '\n\n' }}"
                       "{% elif m.role == 'assistant' %}"
                       "{{ 'Assistant: ' + m.content + '<｜end▁of▁sentence｜>' }}{% endif %}",
                       "Assistant:"),
    "deepseek3": _each("{% if m.role == 'system' %}{{ m.content + '\n\n' }}"
                       "{% elif m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
                       "{% elif m.role == 'assistant' %}"
                       "{{ '<｜Assistant｜>' + m.content + '<｜end▁of▁sentence｜>' }}{% endif %}",
                       "<｜Assistant｜>"),
    "command-r": _each("{% set tag = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>',"
                       " 'assistant': '<|CHATBOT_TOKEN|>'}.get(m.role) %}{% if tag %}"
                       "{{ '<|START_OF_TURN_TOKEN|>' + tag + (m.content|trim)"
                       " + '<|END_OF_TURN_TOKEN|>' }}{% endif %}",
                       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _each("{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n'"
                    " + (m.content|trim) + '<|eot_id|>' }}",
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": "{{ '[gMASK]sop' }}" + _each("{{ '<|' + m.role + '|>\n ' + m.content }}",
                                             "<|assistant|>"),
    "chatglm4": "{{ '[gMASK]<sop>' }}" + _each("{{ '<|' + m.role + '|>\n' + m.content }}",
                                               "<|assistant|>\n"),
    "glmedge": _each("{{ '<|' + m.role + '|>\n' + m.content }}", "<|assistant|>"),
    "minicpm": _each("{% if m.role == 'user' %}{{ '<用户>' + (m.content|trim) + '<AI>' }}"
                     "{% else %}{{ m.content|trim }}{% endif %}"),
    "exaone3": _each("{% if m.role == 'system' %}{{ '[|system|]' + (m.content|trim)"
                     " + '[|endofturn|]\n' }}{% elif m.role == 'user' %}"
                     "{{ '[|user|]' + (m.content|trim) + '\n' }}{% elif m.role == 'assistant' %}"
                     "{{ '[|assistant|]' + (m.content|trim) + '[|endofturn|]\n' }}{% endif %}",
                     "[|assistant|]"),
    "granite": _each("{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' }}"
                     "{% if m.role == 'assistant_tool_call' %}{{ '<|tool_call|>' }}{% endif %}"
                     "{{ m.content + '<|end_of_text|>\n' }}",
                     "<|start_of_role|>assistant<|end_of_role|>"),
    "megrez": _each("{{ '<|role_start|>' + m.role + '<|role_end|>' + m.content + '<|turn_end|>' }}",
                    "<|role_start|>assistant<|role_end|>"),
    "llama4": _each("{{ '<|header_start|>' + m.role + '<|header_end|>\n\n' + (m.content|trim)"
                    " + '<|eot|>' }}", "<|header_start|>assistant<|header_end|>\n\n"),
    "smolvlm": "{{ '<|im_start|>' }}" + _each(
        "{% if m.role == 'system' %}{{ m.content + '\n\n' }}"
        "{% elif m.role == 'user' %}{{ 'User: ' + m.content + '<end_of_utterance>\n' }}"
        "{% else %}{{ 'Assistant: ' + m.content + '<end_of_utterance>\n' }}{% endif %}",
        "Assistant:"),
    # gpt-oss (llama.cpp's OpenAI MoE formatter): harmony messages without channels
    "gpt-oss": _each("{{ '<|start|>' + m.role + '<|message|>' + m.content + ('<|return|>' "
                     "if m.role == 'assistant' else '<|end|>') }}", "<|start|>assistant"),
}


# ---- rendering -------------------------------------------------------------------------------
class _RaisedByTemplate(Exception):
    """raise_exception() called by a template."""


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise_exception(message: str):
    raise _RaisedByTemplate(message)


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception came from (jinja2 rewrites tracebacks so that template
    frames carry the template's file name "<template>" and its line numbers)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# ---- bounds: a template (a GGUF's, a file's) runs under a time and size budget ----------------
#: seconds one render may take (real templates take milliseconds), characters it may output or
#: build in one string, items one range() may give, and the template source's size
RENDER_TIMEOUT_S = 2.0
MAX_RENDER_CHARS = 16 << 20
MAX_RANGE_ITEMS = 100_000
MAX_TEMPLATE_CHARS = 1 << 20
_LINES_PER_CLOCK = 256          # template lines run between two looks at the clock


class _OverBudget(Exception):
    """A render past its time or size budget."""


class _Budget:
    """The budget of the render running in this thread (threading.local: renders in other
    threads have their own)."""
    _local = __import__("threading").local()

    @classmethod
    def current(cls):
        return getattr(cls._local, "b", None)

    def __init__(self, timeout_s: float, max_chars: int):
        import time
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s, self.max_chars = timeout_s, max_chars
        self.lines = 0
        self.range_items = 0

    def tick(self) -> None:
        import time
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"took more than {self.timeout_s:g} s (an endless loop?)")

    def size(self, n: int, what: str = "a string") -> None:
        if n > self.max_chars:
            raise _OverBudget(f"{what} of {n} characters/items (at most {self.max_chars})")

    def tracer(self, frame, event, arg):
        """sys.settrace: template code only (jinja2 compiles templates to Python code whose
        file is "<template>"); every line counted, the clock read every _LINES_PER_CLOCK."""
        if frame.f_code.co_filename != "<template>":
            return None
        return self._line

    def _line(self, frame, event, arg):
        self.lines += 1
        if self.lines % _LINES_PER_CLOCK == 0:
            self.tick()
        return self._line


_NO_DEADLINE = _Budget(float("inf"), MAX_RENDER_CHARS)     # compile-time constant folding
_BIG_DIGITS = __import__("re").compile(r"\d{8,}")


def _budget_check_args(args, kwargs) -> None:
    b = _Budget.current() or _NO_DEADLINE
    b.tick()
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and v > b.max_chars:
            b.size(v, "an argument")


def _check_format_string(s) -> None:
    """A printf/format string whose width or precision asks for more than the budget."""
    if isinstance(s, str):
        for m in _BIG_DIGITS.finditer(s):
            if int(m.group()) > MAX_RENDER_CHARS:
                raise _OverBudget(f"a format width of {m.group()}")


def _budget_check_result(v):
    b = _Budget.current() or _NO_DEADLINE
    if isinstance(v, (str, list, tuple, dict)):
        b.size(len(v), f"a {type(v).__name__}")
    return v


def _bounded_range(*args):
    b = _Budget.current()
    r = range(*args)
    if b is not None:
        b.range_items += len(r)
        if b.range_items > MAX_RANGE_ITEMS:
            raise _OverBudget(f"range() over more than {MAX_RANGE_ITEMS} items in all")
    return r


def _bounded_filter(f):
    import functools

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        # the filtered value is not a size; a pass_context filter gets the context first
        _budget_check_args(args[2:] if getattr(wrapper, "_ctx", False) else args[1:], kwargs)
        if f.__name__ == "do_format" and args:
            _check_format_string(args[0])
        return _budget_check_result(f(*args, **kwargs))
    return wrapper


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox plus the render budget: string/list growth by *, ** and + checked before
        it happens, every call and filter checked (time, integer sizes, result size)."""
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator, left, right):
            b = _Budget.current()
            if b is not None:
                b.tick()
                if operator == "%":
                    _check_format_string(left)
                if operator == "*":
                    for x, n in ((left, right), (right, left)):
                        if isinstance(x, (str, list, tuple)) and isinstance(n, int):
                            b.size(len(x) * max(n, 0), f"a {type(x).__name__}")
                elif operator == "**":
                    if isinstance(right, (int, float)) and abs(right) > 4096:
                        raise _OverBudget(f"an exponent of {right}")
                elif operator == "+" and hasattr(left, "__len__") and hasattr(right, "__len__"):
                    b.size(len(left) + len(right), f"a {type(left).__name__}")
            return super().call_binop(context, operator, left, right)

        def getattr(self, obj, attribute):
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                _check_format_string(obj)
            return super().getattr(obj, attribute)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
            _budget_check_args(args, kwargs)
            return _budget_check_result(super().call(__context, __obj, *args, **kwargs))

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """transformers' `{% generation %}` tag (marks assistant text for training): passed
        through, as llama-cpp-python does."""
        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = BoundedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                             extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        w = _bounded_filter(f)
        # pass_context/pass_environment filters get that first: not a size
        w._ctx = hasattr(f, "jinja_pass_arg")
        env.filters[name] = w
    env.globals["range"] = _bounded_range
    env.globals.pop("lipsum", None)
    return env


class ChatTemplate:
    """A compiled chat template. `name`: where it came from (a built-in's name, a file path or
    "the model's tokenizer.chat_template"), used in error messages."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = ""):
        import jinja2
        self.source, self.name = source, name
        self.bos_token, self.eos_token = bos_token, eos_token
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"chat template {name}: {len(source)} characters (at most "
                                    f"{MAX_TEMPLATE_CHARS} are taken)")
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template {name}, line {e.lineno}: {e.message}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools=None,
               **extra) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]), rendered
        within RENDER_TIMEOUT_S and MAX_RENDER_CHARS (ChatTemplateError past them: a template
        with an endless loop or a gigabyte string is refused, not run)."""
        import sys

        import jinja2
        budget = _Budget(RENDER_TIMEOUT_S, MAX_RENDER_CHARS)
        prev_budget, prev_trace = _Budget.current(), sys.gettrace()
        _Budget._local.b = budget
        sys.settrace(budget.tracer)
        try:
            out, n = [], 0
            for piece in self._template.generate(
                    messages=messages, add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token, eos_token=self.eos_token, tools=tools,
                    raise_exception=_raise_exception, strftime_now=_strftime_now, **extra):
                n += len(piece)
                budget.size(n, "an output")
                out.append(piece)
            return "".join(out)
        except (jinja2.TemplateError, _RaisedByTemplate, TypeError, ValueError, KeyError,
                AttributeError, IndexError, ZeroDivisionError, _OverBudget, RecursionError,
                MemoryError, OverflowError) as e:
            line = _template_line(e)
            where = f", line {line}" if line is not None else ""
            what = ("raised: " if isinstance(e, _RaisedByTemplate) else "refused: " if
                    isinstance(e, _OverBudget) else f"{type(e).__name__}: ")
            raise ChatTemplateError(f"chat template {self.name}{where}: {what}{e}") from None
        finally:
            sys.settrace(prev_trace)
            _Budget._local.b = prev_budget


def load_chat_template(spec: str | os.PathLike | None, model_template: str | None,
                       bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """The template to use: `spec` (a built-in name or a Jinja file), else the model's own.
    A model without a template and no `spec` is a ChatTemplateError naming --chat-template."""
    if spec is None:
        if not model_template:
            raise ChatTemplateError(
                "this model has no chat template (no tokenizer.chat_template in its GGUF): pass "
                "one with --chat-template FILE or a built-in name (chat_template= in Python): "
                + ", ".join(BUILTIN_TEMPLATES))
        return ChatTemplate(model_template, "of the model (tokenizer.chat_template)",
                            bos_token, eos_token)
    spec = os.fspath(spec)
    if spec in BUILTIN_TEMPLATES:
        return ChatTemplate(BUILTIN_TEMPLATES[spec], f"'{spec}' (built-in)", bos_token, eos_token)
    path = Path(spec)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"chat template {path}: cannot read it ({e})") from None
        return ChatTemplate(text, str(path), bos_token, eos_token)
    raise ChatTemplateError(f"chat template '{spec}' is neither a file nor a built-in name "
                            f"({', '.join(BUILTIN_TEMPLATES)})")


# ---- messages --------------------------------------------------------------------------------
def normalize_messages(messages) -> list[dict]:
    """OpenAI chat messages as the templates expect them: a non-empty list of {"role": str,
    "content": str}; content given as a list of parts keeps its text parts, joined; other keys
    (name, tool_calls, ...) pass through. ChatTemplateError naming the message and field."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ChatTemplateError(f"messages[{i}].content[{j}] must be "
                                            "{\"type\": \"text\", \"text\": str}")
                parts.append(part["text"])
            content = "\n".join(parts)
        elif not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string or a list of text "
                                    f"parts, got {type(content).__name__}")
        out.append({**m, "role": role, "content": content})
    return out


def chat_prompt(template: ChatTemplate, messages, tools=None, extra: dict | None = None) -> str:
    """The prompt that asks for the next assistant message. A last message from the assistant
    is a prefill (as llama-server): the others are rendered with the generation prompt and its
    text is appended, so the reply continues it. extra: more template variables (a request's
    chat_template_kwargs, e.g. enable_thinking)."""
    msgs = normalize_messages(messages)
    kw = dict(extra or {})
    if msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
        head = template.render(msgs[:-1], True, tools, **kw) if len(msgs) > 1 else \
            template.render([], True, tools, **kw)
        out = head + msgs[-1]["content"]
    else:
        out = template.render(msgs, True, tools, **kw)
    if not out:
        raise ChatTemplateError(f"chat template {template.name} rendered an empty prompt for "
                                f"these messages")
    return out
