"""Tool calls as text: which format a model writes them in (chosen from its chat template, as
llama.cpp's common/chat.cpp does), how to read them out of a reply (whole or streamed), the
llguidance Lark grammar that forces a well-formed call, and the message shapes the templates
expect when earlier calls and their results are rendered back.

Engine-free: nothing here runs a model. The chat path renders `prepare_messages(...)`, constrains
decoding with `fmt.grammar(...)` (lazily, from one of `fmt.triggers`, under tool_choice "auto"),
and reads the reply with `fmt.parse(...)` or `fmt.stream(...)`.

Families: Hermes 2/3, Qwen 2.5 / QwQ / Qwen3 (`<tool_call>{json}</tool_call>`), Qwen3-Coder XML
(`<tool_call><function=NAME><parameter=P>...`), Llama 3.x JSON (`{"name", "parameters"}`, maybe
after `<|python_tag|>`), Mistral (`[TOOL_CALLS]` with a JSON list, or `NAME[ARGS]{...}`, or
`NAME[CALL_ID]id[ARGS]{...}`), gpt-oss harmony (`<|channel|>commentary to=functions.NAME ...`),
Gemma 4 (`<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`) and llama.cpp's generic JSON
fallback for templates that cannot show tools.

Model output is data, not an error: a call that does not parse is left in the content as the
model wrote it, and nothing here raises on any text. Bad *input* (malformed `tools`, an unknown
tool name) raises ToolSpecError.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Iterable, Mapping

from pyggml.errors import ModelError

_ALNUM = string.ascii_letters + string.digits


class ToolSpecError(ModelError):
    """`tools`, a tool name or a tool-call message that cannot be used; the message names the
    tool (or message) and the field."""


@dataclass
class ToolCall:
    """One call as OpenAI returns it: `arguments` is a JSON text (compact), `id` the model's own
    when its format carries one, else `call_` and 24 random letters and digits."""
    name: str
    arguments: str
    id: str


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def _compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---- tools -----------------------------------------------------------------------------------
def tool_functions(tools) -> dict[str, dict]:
    """{name: parameters JSON schema} of OpenAI `tools` ([{"type": "function", "function":
    {"name", "description"?, "parameters"?}}]); a bare {"name", "parameters"} is accepted too.
    ToolSpecError naming the tool and field for anything else."""
    if tools is None:
        return {}
    if not isinstance(tools, (list, tuple)):
        raise ToolSpecError(f"tools must be a list of function tools, got {type(tools).__name__}")
    out: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ToolSpecError(f"tools[{i}] must be an object, got {type(tool).__name__}")
        fn = tool.get("function", tool)
        if tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise ToolSpecError(f"tools[{i}]: only {{\"type\": \"function\", \"function\": "
                                f"{{...}}}} tools are supported, got type {tool.get('type')!r}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,128}", name):
            raise ToolSpecError(f"tools[{i}].function.name must be 1-128 letters, digits, '_', "
                                f"'.' or '-', got {name!r}")
        if name in out:
            raise ToolSpecError(f"tools[{i}].function.name {name!r} is given twice")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise ToolSpecError(f"tools[{i}].function.parameters (tool {name!r}) must be a JSON "
                                f"schema object, got {type(params).__name__}")
        out[name] = dict(params)
    return out


def _choose(functions: dict[str, dict], name: str | None) -> dict[str, dict]:
    if not functions:
        raise ToolSpecError("a tool-call grammar needs at least one tool")
    if name is None:
        return functions
    if name not in functions:
        raise ToolSpecError(f"tool_choice names the tool {name!r}, which is not in tools "
                            f"({', '.join(functions)})")
    return {name: functions[name]}


# ---- grammar helpers (llguidance's Lark dialect) ---------------------------------------------
def _lit(text: str) -> str:
    """A Lark string literal (json.dumps's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


class _Lark:
    """Collects rules; markers found in `token_ids` are written as that one token (`<[id]>`), so a
    tokenizer that has them as special tokens can produce them (their spelling would not)."""

    def __init__(self, token_ids: Mapping[str, int] | None):
        self.rules: list[str] = []
        self.token_ids = dict(token_ids or {})
        self._n = 0

    def text(self, s: str) -> str:
        """A sequence matching `s`, with any marker in token_ids as its token."""
        if not s:
            return '""'
        for marker, tid in sorted(self.token_ids.items(), key=lambda kv: -len(kv[0])):
            i = s.find(marker)
            if i >= 0:
                parts = [self.text(s[:i]) if i else "", f"<[{int(tid)}]>",
                         self.text(s[i + len(marker):]) if s[i + len(marker):] else ""]
                return " ".join(p for p in parts if p)
        return _lit(s)

    def rule(self, body: str, hint: str = "r", attrs: str = "") -> str:
        self._n += 1
        name = f"{re.sub(r'[^a-z0-9_]', '_', hint.lower())}_{self._n}"
        self.rules.append(f"{name}{attrs}: {body}")
        return name

    def json(self, schema, hint: str = "args") -> str:
        return self.rule("%json " + json.dumps(schema, ensure_ascii=False), hint)

    def source(self, start: str) -> str:
        return "\n".join([f"start: {start}"] + self.rules) + "\n"


def _args_schema(params: dict) -> dict:
    """The schema arguments must match: the tool's own; `type: object` when it names none (the
    arguments of a call are always an object)."""
    schema = dict(params)
    schema.setdefault("type", "object")
    return schema


# ---- the generic streaming reader ------------------------------------------------------------
# what ToolFormat._read says of the markup at an opener: wait for more text; calls (with the
# index after them); content (the text up to the index, as written); skip (markup that carries
# nothing, dropped); text (a replacement content text: the generic format's "response")
_NEED_MORE, _CALLS, _CONTENT, _SKIP, _TEXT = "need_more", "calls", "content", "skip", "text"


def _json_end(s: str, i: int) -> int | None:
    """Index after the JSON object or array starting at s[i] ('{' or '['), found by bracket
    depth outside strings; None if it does not end within s, -1 if the brackets cannot match."""
    stack, in_str, esc = [], False, False
    for j in range(i, len(s)):
        c = s[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
        elif c in "}]":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return j + 1
    return None


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _optional_literal(s: str, i: int, lit: str, final: bool) -> int | None:
    """After a call: skip whitespace and `lit` if it follows. None when the text so far could
    still become `lit` (wait for more); else the index after what was skipped (the whitespace is
    only consumed with `lit`)."""
    j = _skip_ws(s, i)
    rest = s[j:j + len(lit)]
    if rest == lit:
        return j + len(lit)
    if not final and (j == len(s) or lit.startswith(rest)):
        return None
    return i


def _partial_suffix(s: str, opens: Iterable[str]) -> int:
    """Length of the longest suffix of s that is a proper prefix of one of `opens`."""
    best = 0
    for o in opens:
        for k in range(min(len(o) - 1, len(s)), best, -1):
            if s.endswith(o[:k]):
                best = k
                break
    return best


def _arguments(value) -> str | None:
    """Compact JSON text of call arguments written as an object (or as a JSON text of one, as
    some models do); None when they are not an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return _compact(value) if isinstance(value, dict) else None


def _call_from_object(obj, args_keys=("arguments", "parameters"), id_key: str | None = None):
    """A ToolCall from {"name": str, <args key>: object}, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    for k in args_keys:
        if k in obj:
            args = _arguments(obj[k])
            break
    else:
        args = "{}"
    if args is None:
        return None
    cid = obj.get(id_key) if id_key else None
    return ToolCall(obj["name"], args, cid if isinstance(cid, str) and cid else "")


class ToolStream:
    """Reads a reply as it is generated. feed(text) and finish() return events:
    ("content", text), ("call", index, id, name), ("args", index, fragment). A call is reported
    once it is complete and well formed (its header, then its arguments), so a call that turns
    out malformed is content, exactly as parse() of the whole text says; text that may open a
    call is held back until it cannot (no tool markup reaches "content")."""

    def __init__(self, fmt: "ToolFormat", tools=None):
        self.fmt = fmt
        self.functions = tool_functions(tools)
        self._buf = ""
        self._n_calls = 0
        self._ws = ""              # trailing whitespace of the content, held: dropped before a call
        self._after_call = False   # whitespace right after a call is dropped too
        self._at_start = True      # nothing but whitespace seen yet (Llama's JSON opens only there)
        self.content = ""          # everything reported as content so far
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[tuple]:
        if not isinstance(text, str):
            raise ToolSpecError(f"ToolStream.feed takes text, got {type(text).__name__}")
        self._buf += text
        return self._step(final=False)

    def finish(self) -> list[tuple]:
        events = self._step(final=True)
        if self._ws and not self._after_call:
            events.append(("content", self._ws))
            self.content += self._ws
        self._ws = ""
        return _merge(events)

    # -- internals
    def _content(self, text: str, events: list) -> None:
        if not text:
            return
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        out = self._ws + body
        self._ws = text[len(body):]
        events.append(("content", out))
        self.content += out
        self._at_start = False

    def _calls(self, calls: list[ToolCall], events: list) -> None:
        self._ws = ""
        for c in calls:
            if not c.id:
                c.id = self.fmt.new_id()
            events.append(("call", self._n_calls, c.id, c.name))
            events.append(("args", self._n_calls, c.arguments))
            self._n_calls += 1
            self.calls.append(c)
        self._after_call = True
        self._at_start = True

    def _step(self, final: bool) -> list[tuple]:
        events: list[tuple] = []
        buf, pos = self._buf, 0
        while pos < len(buf):
            found = self.fmt._find_open(buf, pos, self._at_start and not self.content.strip(),
                                        self._after_call)
            if found is None:
                hold = 0 if final else self.fmt._hold(buf, pos)
                self._content(buf[pos:len(buf) - hold], events)
                pos = len(buf) - hold
                break
            i, opener = found
            self._content(buf[pos:i], events)
            pos = i
            status, end, calls = self.fmt._read(buf, i, opener, final, self.functions)
            if status == _NEED_MORE:
                break
            if status == _CALLS:
                self._calls(calls, events)
            elif status == _CONTENT:
                self._content(buf[i:end], events)
            elif status == _TEXT:
                self._content(calls, events)
            # _SKIP: markup that carries nothing (harmony's headers), dropped
            pos = end
        self._buf = buf[pos:]
        return _merge(events)


def _merge(events: list[tuple]) -> list[tuple]:
    out: list[tuple] = []
    for e in events:
        if e[0] == "content" and out and out[-1][0] == "content":
            out[-1] = ("content", out[-1][1] + e[1])
        else:
            out.append(e)
    return out


# ---- formats ---------------------------------------------------------------------------------
class ToolFormat:
    """One family's way of writing tool calls. `triggers`: the texts that open a call inside
    free text (a lazy grammar starts at one); `markers`: the texts that may be single special
    tokens in the model's vocabulary (pass their ids to grammar(token_ids=...))."""

    name = "base"
    triggers: tuple[str, ...] = ()
    start_triggers: tuple[str, ...] = ()     # triggers that count only at the reply's start
    markers: tuple[str, ...] = ()
    _opens: tuple[str, ...] = ()      # texts that open markup when reading (triggers and more)

    def __repr__(self):
        return f"<ToolFormat {self.name}>"

    def new_id(self) -> str:
        return new_call_id()

    def parse(self, text: str, tools=None) -> tuple[str, list[ToolCall]]:
        """(content without tool markup, calls) of a whole reply; never raises on any text."""
        s = self.stream(tools)
        s.feed(text if isinstance(text, str) else "")
        s.finish()
        return s.content, s.calls

    def stream(self, tools=None) -> ToolStream:
        return ToolStream(self, tools)

    def grammar(self, tools, required: bool = False, name: str | None = None,
                parallel: bool = False, token_ids: Mapping[str, int] | None = None) -> str:
        """An llguidance Lark grammar for one call (one or more with `parallel`) of one of
        `tools` (only `name` if given), arguments matching the tool's parameters schema; it
        starts with triggers[0]. `required` matters only where the grammar covers the whole reply
        (generic)."""
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        call = self._grammar_call(g, functions)
        return g.source(f"{call}+" if parallel else call)

    def system_prompt(self, tools) -> str | None:
        """Text the system message must carry for this format (generic only)."""
        return None

    # -- reading, used by ToolStream
    def _find_open(self, buf: str, pos: int, at_start: bool, after_call: bool):
        """(index, opener) of the first complete opener at or after pos, or None."""
        best = None
        for o in self._opens:
            i = buf.find(o, pos)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, o)
        return best

    def _hold(self, buf: str, pos: int) -> int:
        return _partial_suffix(buf[pos:], self._opens)

    def _read(self, buf, i, opener, final, functions):
        raise NotImplementedError

    def _grammar_call(self, g: _Lark, functions: dict[str, dict]) -> str:
        raise NotImplementedError


def _bad(buf: str, i: int, final: bool, end_marker: str | None):
    """A call that cannot be read: wait while it may still complete, else it is content up to
    its end marker (or the end of the text)."""
    if end_marker:
        j = buf.find(end_marker, i)
        if j >= 0:
            return _CONTENT, j + len(end_marker), None
    if not final:
        return _NEED_MORE, i, None
    return _CONTENT, len(buf), None


class HermesFormat(ToolFormat):
    """Hermes 2 Pro / 3, Qwen 2.5, QwQ, Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}
    \\n</tool_call>`, one block per call."""

    name = "hermes"
    triggers = ("<tool_call>",)
    markers = ("<tool_call>", "</tool_call>")
    _opens = ("<tool_call>",)
    _FENCE = "```"
    # Qwen2.5-Coder writes its calls without the tags, as bare or fenced JSON (the 1.5B model
    # does so for every call): read as calls at the reply's start or after a call, when the
    # object names one of the tools (any other JSON is content)
    start_triggers = ('{"name"', "```json", "```\n{")
    accept_untagged = True

    def _find_open(self, buf, pos, at_start, after_call):
        if self.accept_untagged and (at_start or after_call):
            j = _skip_ws(buf, pos)
            rest = buf[j:]
            if rest.startswith("{") or rest.startswith(self._FENCE) or (
                    rest and self._FENCE.startswith(rest)):
                return j, "{" if rest.startswith("{") else self._FENCE
        return super()._find_open(buf, pos, at_start, after_call)

    def _read(self, buf, i, opener, final, functions):
        if opener in ("{", self._FENCE):
            return self._read_bare(buf, i, opener, final, functions)
        j = _skip_ws(buf, i + len(opener))
        if j == len(buf):
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        if buf[j] != "{":
            return _bad(buf, i, final, "</tool_call>")
        end = _json_end(buf, j)
        if end is None:
            return _bad(buf, i, final, "</tool_call>") if final else (_NEED_MORE, i, None)
        call = None
        if end > 0:
            try:
                call = _call_from_object(json.loads(buf[j:end]))
            except ValueError:
                call = None
        if call is None:
            return _bad(buf, i, final, "</tool_call>")
        k = _optional_literal(buf, end, "</tool_call>", final)
        if k is None:
            return _NEED_MORE, i, None
        return _CALLS, k, [call]

    def _read_bare(self, buf, i, opener, final, functions):
        """A call written as a bare JSON object, or one in a ```json fence: a call only when
        it names one of the tools; else it is content."""
        j = i
        if opener == self._FENCE:
            if len(buf) - i < len("```json") and not final:
                return _NEED_MORE, i, None
            if not buf.startswith(self._FENCE, i):
                return _CONTENT, len(buf) if final else i, None
            j = i + len(self._FENCE)
            if buf.startswith("json", j):
                j += len("json")
            j = _skip_ws(buf, j)
            if j == len(buf):
                return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
            if buf[j] != "{":       # a fence of something else: content to its end
                k = buf.find(self._FENCE, j)
                return _CONTENT, (k + len(self._FENCE) if k >= 0 else len(buf)), None
        end = _json_end(buf, j)
        if end is None:
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        call = None
        if end > 0:
            try:
                call = _call_from_object(json.loads(buf[j:end]))
            except ValueError:
                # Qwen2.5-Coder-1.5B sampled sometimes doubles the outer braces (the
                # `{{...}}` of a format string): the call inside is read
                inner = buf[j + 1:end - 1].strip() if buf.startswith("{{", j) else ""
                try:
                    call = _call_from_object(json.loads(inner)) if inner else None
                except ValueError:
                    call = None
        if call is None or call.name not in functions:
            return _CONTENT, (end if end > 0 else len(buf)), None
        if opener == self._FENCE:
            k = _skip_ws(buf, end)
            if k == len(buf) and not final:
                return _NEED_MORE, i, None
            if buf.startswith(self._FENCE, k):
                end = k + len(self._FENCE)
            elif len(buf) - k < len(self._FENCE) and self._FENCE.startswith(buf[k:]) and not final:
                return _NEED_MORE, i, None
        return _CALLS, end, [call]

    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            args = g.json(_args_schema(params))
            head = '{"name": ' + json.dumps(fname) + ', "arguments": '
            alts.append(g.rule(f'{_lit(head)} {args} "}}"', "call_" + fname))
        body = g.rule(" | ".join(alts), "body")
        tagged = g.rule(f'{g.text("<tool_call>")} "\\n" {body} "\\n" {g.text("</tool_call>")} '
                        f'"\\n"?', "tagged")
        # the untagged forms a lazy start may have begun with (start_triggers)
        fenced = g.rule(f'"```json\\n" {body} "\\n```" | "```\\n" {body} "\\n```"', "fenced")
        return g.rule(f"{tagged} | {body} | {fenced}", "tool_call")


def _param_is_string(schema) -> bool:
    t = schema.get("type") if isinstance(schema, Mapping) else None
    if t is None:
        return "enum" not in schema and "const" not in schema if isinstance(schema, Mapping) \
            else True
    return t == "string" or (isinstance(t, list) and "string" in t)


class Qwen3CoderFormat(ToolFormat):
    """Qwen3-Coder (and Qwen3.5, Nemotron Nano 3, Seed-OSS): XML calls,
    `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n
    </tool_call>`; values are raw text, typed per the tool's parameters schema when read."""

    name = "qwen3_coder"
    triggers = ("<tool_call>",)
    markers = ("<tool_call>", "</tool_call>")
    _opens = ("<tool_call>",)
    _FUNC = re.compile(r"\s*<function=([^>\n]+)>")
    _PARAM = re.compile(r"\s*<parameter=([^>\n]+)>")

    def _read(self, buf, i, opener, final, functions):
        end_tag = buf.find("</tool_call>", i)
        if end_tag < 0 and not final:
            return _NEED_MORE, i, None
        body_end = end_tag if end_tag >= 0 else len(buf)
        end = end_tag + len("</tool_call>") if end_tag >= 0 else len(buf)
        call = self._read_body(buf[i + len(opener):body_end], functions)
        if call is None:
            return _CONTENT, end, None
        return _CALLS, end, [call]

    def _read_body(self, body: str, functions) -> ToolCall | None:
        m = self._FUNC.match(body)
        if not m:
            return None
        name = m.group(1).strip()
        schema = functions.get(name, {}).get("properties", {}) if functions else {}
        pos, args = m.end(), {}
        while True:
            p = self._PARAM.match(body, pos)
            if not p:
                break
            close = body.find("</parameter>", p.end())
            if close < 0:
                return None
            raw = body[p.end():close]
            # the template writes "\n" around a value: they are not part of it
            if raw.startswith("\n"):
                raw = raw[1:]
            if raw.endswith("\n"):
                raw = raw[:-1]
            pname = p.group(1).strip()
            args[pname] = self._typed(raw, schema.get(pname))
            pos = close + len("</parameter>")
        rest = body[pos:].strip()
        if rest not in ("</function>", ""):
            return None
        return ToolCall(name, _compact(args), "")

    @staticmethod
    def _typed(raw: str, schema):
        if schema is None or _param_is_string(schema):
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            props = params.get("properties") or {}
            required = set(params.get("required") or ())
            parts = []
            for pname, pschema in props.items():
                head = _lit(f"<parameter={pname}>\n")
                if _param_is_string(pschema if isinstance(pschema, Mapping) else {}):
                    # a raw text value ends at the first "\n</parameter>\n"
                    val = g.rule('/(?s:.*)/', f"v_{pname}",
                                 attrs='[suffix="\\n</parameter>\\n"]')
                    item = g.rule(f"{head} {val}", f"p_{pname}")
                else:
                    val = g.json(pschema, f"v_{pname}")
                    item = g.rule(f'{head} {val} "\\n</parameter>\\n"', f"p_{pname}")
                parts.append(item if pname in required else f"{item}?")
            seq = " ".join(parts)
            alts.append(g.rule(f'{_lit(f"<function={fname}>" + chr(10))} {seq} '
                               f'"</function>\\n"', "call_" + fname))
        body = g.rule(" | ".join(alts), "body")
        return g.rule(f'{g.text("<tool_call>")} "\\n" {body} {g.text("</tool_call>")} "\\n"?',
                      "tool_call")


class Llama3Format(ToolFormat):
    """Llama 3.1 / 3.2 / 3.3: the reply is the JSON `{"name": ..., "parameters": {...}}`
    (optionally after `<|python_tag|>`); several calls separated by ';' or newlines. A JSON
    object opens a call only at the start of the reply or after a call."""

    name = "llama3"
    triggers = ("<|python_tag|>",)
    start_triggers = ('{"name"',)
    markers = ("<|python_tag|>",)
    _opens = ("<|python_tag|>",)

    def _find_open(self, buf, pos, at_start, after_call):
        if at_start or after_call:
            j = pos
            while j < len(buf) and (buf[j].isspace() or (after_call and buf[j] == ";")):
                j += 1
            if j < len(buf) and buf[j] == "{":
                return pos, "{"
            if j == len(buf) and after_call and j > pos:
                return pos, "{"       # separators after a call: wait for what follows them
        return super()._find_open(buf, pos, at_start, after_call)

    def _read(self, buf, i, opener, final, functions):
        j = i + len(opener) if opener != "{" else i
        j = _skip_ws(buf, j)
        while opener == "{" and j < len(buf) and buf[j] in "; \t\r\n":
            j += 1
        if j == len(buf):
            if final:   # a lone tag or separators after a call: markup
                return (_SKIP if opener == "{" else _CONTENT), len(buf), None
            return _NEED_MORE, i, None
        if buf[j] != "{":
            # <|python_tag|> before code (a built-in tool): the tag is markup, the code content
            return _SKIP, j, None
        end = _json_end(buf, j)
        if end is None:
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        call = None
        if end > 0:
            try:
                obj = json.loads(buf[j:end])
                if isinstance(obj, dict) and obj.get("type") in (None, "function"):
                    call = _call_from_object(obj, ("parameters", "arguments"))
            except ValueError:
                call = None
        if call is None:
            return _CONTENT, (end if end > 0 else len(buf)), None
        k = _optional_literal(buf, end, "<|eom_id|>", final)
        if k is None:
            return _NEED_MORE, i, None
        return _CALLS, k, [call]

    def grammar(self, tools, required=False, name=None, parallel=False, token_ids=None):
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        call = self._grammar_call(g, functions)
        tag = g.text("<|python_tag|>")
        start = f"({tag})? {call} (\"; \" {call})*" if parallel else f"({tag})? {call}"
        return g.source(start)

    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            args = g.json(_args_schema(params))
            head = '{"name": ' + json.dumps(fname) + ', "parameters": '
            alts.append(g.rule(f'{_lit(head)} {args} "}}"', "call_" + fname))
        return g.rule(" | ".join(alts), "call")


def _mistral_head_prefix(s: str) -> bool:
    """Whether s may still grow into `NAME[ARGS]` or `NAME[CALL_ID]ID[ARGS]`."""
    rest = s[re.match(r"[A-Za-z0-9_.\-]*", s).end():]
    if "[ARGS]".startswith(rest) or "[CALL_ID]".startswith(rest):
        return True
    if rest.startswith("[CALL_ID]"):
        rest = rest[len("[CALL_ID]"):]
        return "[ARGS]".startswith(rest[re.match(r"[A-Za-z0-9]*", rest).end():])
    return False


class MistralFormat(ToolFormat):
    """Mistral: `[TOOL_CALLS]` then, by template generation, a JSON list
    `[{"name", "arguments", "id"}]` (Nemo, 7B v0.3), `NAME[ARGS]{...}` (Devstral, Ministral 3,
    Magistral) or `NAME[CALL_ID]id[ARGS]{...}` (Small 3.2). All three are read whatever the
    template; the grammar writes the template's. Ids are 9 letters and digits, as the
    templates require."""

    name = "mistral"
    triggers = ("[TOOL_CALLS]",)
    markers = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    _opens = ("[TOOL_CALLS]",)
    _NAME = re.compile(r"([A-Za-z0-9_.\-]+)(\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")

    def __init__(self, style: str = "args"):
        if style not in ("list", "args", "call_id"):
            raise ToolSpecError(f"Mistral tool-call style must be list, args or call_id, "
                                f"got {style!r}")
        self.style = style

    def __repr__(self):
        return f"<ToolFormat {self.name} ({self.style})>"

    def new_id(self) -> str:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))

    def _read(self, buf, i, opener, final, functions):
        j = _skip_ws(buf, i + len(opener))
        if j == len(buf):
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        if buf[j] == "[":
            end = _json_end(buf, j)
            if end is None:
                return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
            calls = None
            if end > 0:
                try:
                    items = json.loads(buf[j:end])
                    calls = [_call_from_object(o, id_key="id") for o in items] \
                        if isinstance(items, list) and items else None
                except ValueError:
                    calls = None
            if not calls or any(c is None for c in calls):
                return _CONTENT, (end if end > 0 else len(buf)), None
            return _CALLS, end, calls
        m = self._NAME.match(buf, j)
        if not m:
            if not final and _mistral_head_prefix(buf[j:]):
                return _NEED_MORE, i, None   # the name and its [ARGS] may still be coming
            return _CONTENT, j, None
        k = _skip_ws(buf, m.end())
        if k == len(buf):
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        if buf[k] != "{":
            return _CONTENT, k, None
        end = _json_end(buf, k)
        if end is None:
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        args = None
        if end > 0:
            try:
                args = _arguments(json.loads(buf[k:end]))
            except ValueError:
                args = None
        if args is None:
            return _CONTENT, (end if end > 0 else len(buf)), None
        return _CALLS, end, [ToolCall(m.group(1), args, m.group(3) or "")]

    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            args = g.json(_args_schema(params))
            if self.style == "list":
                head = '{"name": ' + json.dumps(fname) + ', "arguments": '
                alts.append(g.rule(f'{_lit(head)} {args} ", \\"id\\": \\"" /[a-zA-Z0-9]{{9}}/ '
                                   f'"\\"}}"', "call_" + fname))
            elif self.style == "call_id":
                alts.append(g.rule(f'{g.text("[TOOL_CALLS]" + fname + "[CALL_ID]")} '
                                   f'/[a-zA-Z0-9]{{9}}/ {g.text("[ARGS]")} {args}',
                                   "call_" + fname))
            else:
                alts.append(g.rule(f'{g.text("[TOOL_CALLS]" + fname + "[ARGS]")} {args}',
                                   "call_" + fname))
        return g.rule(" | ".join(alts), "call")

    def grammar(self, tools, required=False, name=None, parallel=False, token_ids=None):
        if self.style != "list":
            return super().grammar(tools, required, name, parallel, token_ids)
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        call = self._grammar_call(g, functions)
        more = f'(", " {call})*' if parallel else ""
        return g.source(f'{g.text("[TOOL_CALLS]")} "[" {call} {more} "]"')


class HarmonyFormat(ToolFormat):
    """gpt-oss (OpenAI harmony): messages `<|start|>assistant<|channel|>C<|message|>...<|end|>`;
    a call is a message to `functions.NAME` (the recipient in the channel header or the role
    header), `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.
    Headers and ends are markup; the text of any other message (final, a commentary preamble,
    analysis when reasoning is not split off first) is content."""

    name = "harmony"
    triggers = ("<|channel|>commentary to=functions.",)
    markers = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
               "<|call|>", "<|return|>")
    _opens = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>",
              "<|constrain|>")
    _RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_.\-]+)")

    def _read(self, buf, i, opener, final, functions):
        if opener in ("<|end|>", "<|call|>", "<|return|>", "<|message|>", "<|constrain|>"):
            return _SKIP, i + len(opener), None
        m_at = buf.find("<|message|>", i)
        nxt = buf.find("<|start|>", i + len(opener))
        if m_at < 0 or 0 <= nxt < m_at:
            # a header that never got its body (cut off, or a new message opened): markup
            if nxt >= 0:
                return _SKIP, nxt, None
            return (_SKIP, len(buf), None) if final else (_NEED_MORE, i, None)
        body = m_at + len("<|message|>")
        m = self._RECIPIENT.search(buf, i, m_at)
        if not m:
            return _SKIP, body, None     # final, preamble or analysis: its text is content
        j = _skip_ws(buf, body)
        if j == len(buf):
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        if buf[j] != "{":
            return _bad(buf, i, final, "<|call|>")
        end = _json_end(buf, j)
        if end is None:
            return (_NEED_MORE, i, None) if not final else (_CONTENT, len(buf), None)
        args = None
        if end > 0:
            try:
                args = _arguments(json.loads(buf[j:end]))
            except ValueError:
                args = None
        if args is None:
            return _bad(buf, i, final, "<|call|>")
        k = _optional_literal(buf, end, "<|call|>", final)
        if k is None:
            return _NEED_MORE, i, None
        return _CALLS, k, [ToolCall(m.group(1), args, "")]

    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            args = g.json(_args_schema(params))
            head = g.text(f"<|channel|>commentary to=functions.{fname} <|constrain|>json"
                          f"<|message|>")
            alts.append(g.rule(f"{head} {args} {g.text('<|call|>')}", "call_" + fname))
        return g.rule(" | ".join(alts), "call")

    def grammar(self, tools, required=False, name=None, parallel=False, token_ids=None):
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        call = self._grammar_call(g, functions)
        # one call per message: the next one opens a new assistant message
        more = f'({g.text("<|start|>assistant")} {call})*' if parallel else ""
        return g.source(f"{call} {more}".strip())


# ---- Gemma 4 ---------------------------------------------------------------------------------
_G4Q = '<|"|>'      # Gemma 4's string quote (one token)
_G4_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_G4_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


class _G4Incomplete(Exception):
    """The text ends inside the value."""


class _G4Invalid(Exception):
    """The text cannot be a Gemma 4 value."""


def _g4_ws(s: str, i: int) -> int:
    j = _skip_ws(s, i)
    if j == len(s):
        raise _G4Incomplete
    return j


def _g4_value(s: str, i: int) -> tuple[str, int]:
    """(JSON text, index after) of the Gemma 4 value at s[i]: `<|"|>text<|"|>` strings, bare
    `key:value` dicts, arrays, JSON numbers, true / false / null (llama.cpp's gemma4_to_json:
    string text and keys JSON-escaped, numbers as written)."""
    if i >= len(s):
        raise _G4Incomplete
    if s.startswith(_G4Q, i):
        j = s.find(_G4Q, i + len(_G4Q))
        if j < 0:
            raise _G4Incomplete
        return json.dumps(s[i + len(_G4Q):j], ensure_ascii=False), j + len(_G4Q)
    if _G4Q.startswith(s[i:]):
        raise _G4Incomplete
    c = s[i]
    if c in "{[":
        close, items = ("}" if c == "{" else "]"), []
        j = _g4_ws(s, i + 1)
        if s[j] == close:
            return ("{}" if c == "{" else "[]"), j + 1
        while True:
            if c == "{":
                k = j
                while k < len(s) and s[k] not in ":}":
                    k += 1
                if k == len(s):
                    raise _G4Incomplete
                if s[k] != ":" or k == j:
                    raise _G4Invalid
                key = s[j:k]
                text, j = _g4_value(s, _g4_ws(s, k + 1))
                items.append(json.dumps(key, ensure_ascii=False) + ":" + text)
            else:
                text, j = _g4_value(s, j)
                items.append(text)
            j = _g4_ws(s, j)
            if s[j] == close:
                body = ",".join(items)
                return (f"{{{body}}}" if c == "{" else f"[{body}]"), j + 1
            if s[j] != ",":
                raise _G4Invalid
            j = _g4_ws(s, j + 1)
    for word in ("true", "false", "null"):
        if s.startswith(word, i):
            return word, i + len(word)
        if word.startswith(s[i:]):
            raise _G4Incomplete
    m = _G4_NUMBER.match(s, i)
    if m:
        if m.end() == len(s):
            raise _G4Incomplete     # more digits may follow
        return m.group(0), m.end()
    if s[i:] in ("-",):
        raise _G4Incomplete
    raise _G4Invalid


class Gemma4Format(ToolFormat):
    """Gemma 4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, one block per call and
    nothing between parallel calls; values are Gemma 4's own notation (strings in `<|"|>`,
    bare keys; see _g4_value), read into JSON arguments as llama.cpp's peg-gemma4 parser does.
    The model ends its turn with `<|tool_response>` after its calls (an end-of-generation
    token). Results go back as role "tool" messages, which the current template renders
    itself; `embedded_responses` (templates without that support, before 2026's update): they
    are folded into the calling assistant message's `tool_responses`, as llama.cpp's
    convert_tool_responses_gemma4 does."""

    name = "gemma4"
    triggers = ("<|tool_call>",)
    markers = ("<|tool_call>", "<tool_call|>", _G4Q, "<|channel>", "<channel|>")
    _opens = ("<|tool_call>",)
    _END = "<tool_call|>"

    def __init__(self, embedded_responses: bool = False):
        self.embedded_responses = embedded_responses

    def _read(self, buf, i, opener, final, functions):
        j = i + len(opener)
        head = "call:"
        if not buf.startswith(head, j):
            if not final and head.startswith(buf[j:j + len(head)]) and len(buf) - j < len(head):
                return _NEED_MORE, i, None
            return _bad(buf, i, final, self._END)
        j += len(head)
        k = buf.find("{", j)
        if k < 0:
            rest = buf[j:]
            if not final and (not rest or _G4_NAME.fullmatch(rest)):
                return _NEED_MORE, i, None
            return _bad(buf, i, final, self._END)
        name = buf[j:k]
        if not _G4_NAME.fullmatch(name):
            return _bad(buf, i, final, self._END)
        try:
            args, end = _g4_value(buf, k)
        except _G4Incomplete:
            return (_CONTENT, len(buf), None) if final else (_NEED_MORE, i, None)
        except _G4Invalid:
            return _bad(buf, i, final, self._END)
        if buf.startswith(self._END, end):
            return _CALLS, end + len(self._END), [ToolCall(name, _compact(json.loads(args)),
                                                           "")]
        if not final and self._END.startswith(buf[end:]):
            return _NEED_MORE, i, None
        return _bad(buf, i, final, self._END)

    # -- grammar: the arguments follow the tool's schema, keys in the sorted order the
    # template writes them (dictsort); what a schema does not pin down is any Gemma 4 value
    def _grammar_call(self, g, functions):
        alts = []
        for fname, params in functions.items():
            args = self._g_object(g, _args_schema(params), "args_" + fname)
            alts.append(g.rule(f'{g.text("<|tool_call>")} {_lit("call:" + fname)} {args} '
                               f'{g.text(self._END)}', "call_" + fname))
        return g.rule(" | ".join(alts), "tool_call")

    def grammar(self, tools, required=False, name=None, parallel=False, token_ids=None):
        """As ToolFormat.grammar; `required` (the reply is the call) lets a thought block come
        first, as llama.cpp's grammar does."""
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        call = self._grammar_call(g, functions)
        calls = f"{call}+" if parallel else call
        if not required:
            return g.source(calls)
        thought = g.rule(f'{g.text("<|channel>")} "thought" {self._g_text(g, "<channel|>")}',
                         "thought")
        return g.source(f"{thought}? {calls}")

    @staticmethod
    def _g_text(g, end: str) -> str:
        """Any text up to and including `end` (a single token when it is one)."""
        if end in g.token_ids:
            return g.rule(f"/(?s:.*)/ <[{int(g.token_ids[end])}]>", "text")
        return g.rule("/(?s:.*)/", "text", attrs=f"[suffix={_lit(end)}]")

    def _g_string(self, g) -> str:
        return g.rule(f"{g.text(_G4Q)} {self._g_text(g, _G4Q)}", "str")

    def _g_any(self, g) -> str:
        """Any Gemma 4 value (rules made once per grammar)."""
        if not getattr(g, "g4_any", False):
            g.g4_any = True
            string = self._g_string(g)
            key = r'/[A-Za-z_][A-Za-z0-9_.\-]*/'
            g.rules.append(f'g4_value: {string} | g4_dict | g4_list | '
                           f'/{_G4_NUMBER.pattern}/ | "true" | "false" | "null"')
            g.rules.append(f'g4_dict: "{{" (g4_kv ("," g4_kv)*)? "}}"')
            g.rules.append(f'g4_kv: {key} ":" g4_value')
            g.rules.append('g4_list: "[" (g4_value ("," g4_value)*)? "]"')
        return "g4_value"

    def _g_value(self, g, schema, hint: str) -> str:
        if not isinstance(schema, Mapping):
            return self._g_any(g)
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
            q = g.text(_G4Q)
            return g.rule(" | ".join(f"{q} {_lit(e)} {q}" for e in enum), hint)
        t = schema.get("type")
        if t == "string" and "enum" not in schema:
            return self._g_string(g)
        if t == "integer":
            return g.rule('/-?(0|[1-9][0-9]*)/', hint)
        if t == "number":
            return g.rule(f"/{_G4_NUMBER.pattern}/", hint)
        if t == "boolean":
            return g.rule('"true" | "false"', hint)
        if t == "null":
            return g.rule('"null"', hint)
        if t == "object" and isinstance(schema.get("properties"), Mapping):
            return self._g_object(g, schema, hint)
        if t == "array":
            item = self._g_value(g, schema.get("items"), hint + "_item")
            return g.rule(f'"[" ({item} ("," {item})*)? "]"', hint)
        return self._g_any(g)

    def _g_object(self, g, schema, hint: str) -> str:
        """`{key:value,...}`: the schema's properties in sorted order, the required ones
        always, each other one optional, commas only between the ones written."""
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            if schema.get("additionalProperties") is False:
                return g.rule('"{}"', hint)
            self._g_any(g)
            return "g4_dict"
        required = set(schema.get("required") or ())
        names = sorted(props)
        items = [g.rule(f"{_lit(n + ':')} {self._g_value(g, props[n], f'{hint}_{n}')}",
                        f"{hint}_{n}_kv") for n in names]
        # after_k: the items from k on once one was written (each after a comma);
        # first_k: the items from k on before any was written
        after, first = ['""'], ['""']
        for k in range(len(names) - 1, -1, -1):
            a, f = after[0], first[0]
            if names[k] in required:
                after.insert(0, g.rule(f'"," {items[k]} {a}', f"{hint}_a"))
                first.insert(0, g.rule(f"{items[k]} {a}", f"{hint}_f"))
            else:
                after.insert(0, g.rule(f'("," {items[k]})? {a}', f"{hint}_a"))
                first.insert(0, g.rule(f"{items[k]} {a} | {f}", f"{hint}_f"))
        return g.rule(f'"{{" {first[0]} "}}"', hint)


GENERIC_INSTRUCTIONS = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with "
    "`response` reply to the user's request.")


class GenericFormat(ToolFormat):
    """llama.cpp's generic handler, for templates that cannot show tools: the whole reply is one
    JSON object, {"tool_call": {"name", "arguments"}}, {"tool_calls": [...]} or
    {"response": "..."}; the tools and this format are described in the system message."""

    name = "generic"
    triggers = ()

    def _find_open(self, buf, pos, at_start, after_call):
        # the reply is JSON only if it starts so: then everything is held until the end
        if at_start and not after_call:
            j = _skip_ws(buf, pos)
            if j < len(buf) and buf[j] == "{":
                return pos, "{"
            if j == len(buf):
                return pos, ""
        return None

    def _hold(self, buf, pos):
        return 0

    def _read(self, buf, i, opener, final, functions):
        if not final:
            return _NEED_MORE, i, None
        text = buf[i:]
        if not text.strip():
            return _CONTENT, len(buf), None
        try:
            obj = json.loads(text)
        except ValueError:
            return _CONTENT, len(buf), None
        if isinstance(obj, dict) and len(obj) == 1:
            if isinstance(obj.get("response"), str):
                return _TEXT, len(buf), obj["response"]
            items = [obj["tool_call"]] if "tool_call" in obj else obj.get("tool_calls")
            if isinstance(items, list) and items:
                calls = [_call_from_object(o, id_key="id") for o in items]
                if all(c is not None for c in calls):
                    return _CALLS, len(buf), calls
        return _CONTENT, len(buf), None

    def stream(self, tools=None) -> ToolStream:
        return _GenericStream(self, tools)

    def grammar(self, tools, required=False, name=None, parallel=False, token_ids=None):
        functions = _choose(tool_functions(tools), name)
        g = _Lark(token_ids)
        return g.source(g.json(self.reply_schema(functions, required, parallel), "reply"))

    @staticmethod
    def reply_schema(functions: dict[str, dict], required: bool, parallel: bool) -> dict:
        calls = [{"type": "object",
                  "properties": {"name": {"const": n}, "arguments": _args_schema(p)},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for n, p in functions.items()]
        call = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if parallel:
            shape = {"type": "object", "properties": {"tool_calls": {
                "type": "array", "items": call, "minItems": 1}},
                "required": ["tool_calls"], "additionalProperties": False}
        else:
            shape = {"type": "object", "properties": {"tool_call": call},
                     "required": ["tool_call"], "additionalProperties": False}
        if required:
            return shape
        reply = {"type": "object", "properties": {"response": {"type": "string"}},
                 "required": ["response"], "additionalProperties": False}
        return {"anyOf": [shape, reply]}

    def system_prompt(self, tools) -> str:
        functions = tool_functions(tools)
        listing = json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=2)
        example = json.dumps({"tool_call": {"name": next(iter(functions), "tool_name"),
                                            "arguments": {}}}, ensure_ascii=False)
        return ("You can call any of the following tools to satisfy the user's requests:\n"
                f"{listing}\n\n{GENERIC_INSTRUCTIONS} To call a tool, reply with only "
                f'{example} (with the tool\'s arguments), or {{"tool_calls": [...]}} for several '
                'calls at once; otherwise reply with only {"response": "..."}.')


class _GenericStream(ToolStream):
    """The generic reply is JSON as a whole: held until finish() unless it does not start with
    '{' (then it is plain content, streamed)."""

    def finish(self):
        events = self._step(final=True)
        if self._ws:
            events.append(("content", self._ws))
            self.content += self._ws
            self._ws = ""
        return _merge(events)

    def _content(self, text, events):
        # whitespace is part of a plain reply as written
        if text:
            events.append(("content", text))
            self.content += text
            self._at_start = self._at_start and not text.strip()


# ---- choosing a format -----------------------------------------------------------------------
def format_for_template(template_source: str | None) -> ToolFormat:
    """The tool-call format of a chat template, by the texts it contains (llama.cpp's order:
    the specific families first; a template that shows none of them gets the generic one)."""
    src = template_source or ""
    if "<|channel|>" in src:
        return HarmonyFormat()
    if "<|tool_call>call:" in src:
        # llama.cpp tells the templates that render role "tool" messages by this comment
        return Gemma4Format(embedded_responses="OpenAI Chat Completions:" not in src)
    if "[TOOL_CALLS]" in src:
        if "[CALL_ID]" in src:
            return MistralFormat("call_id")
        return MistralFormat("args" if "[ARGS]" in src else "list")
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return Qwen3CoderFormat()
    if "<tool_call>" in src:
        return HermesFormat()
    if "<|start_header_id|>" in src and ("ipython" in src or "<|python_tag|>" in src):
        return Llama3Format()
    return GenericFormat()


FORMATS = {f.name: f for f in (HermesFormat(), Qwen3CoderFormat(), Llama3Format(),
                                MistralFormat(), HarmonyFormat(), Gemma4Format(),
                                GenericFormat())}


# ---- messages for rendering ------------------------------------------------------------------
def _mistral_id(cid: str) -> str:
    """A 9-letters-and-digits id for a Mistral template, stable for a given id (so a call and its
    result keep matching) and unchanged when already one."""
    if isinstance(cid, str) and re.fullmatch(r"[A-Za-z0-9]{9}", cid):
        return cid
    import hashlib
    digest = hashlib.sha256(str(cid).encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])


def _parsed_calls(i: int, m: dict) -> list[dict]:
    """The assistant message's tool_calls with arguments as objects (llama.cpp parses them before
    rendering: templates write them with tojson or iterate their items)."""
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        raise ToolSpecError(f"messages[{i}].tool_calls must be a list")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ToolSpecError(f"messages[{i}].tool_calls[{j}] must be {{\"type\": \"function\","
                                f" \"function\": {{\"name\", \"arguments\"}}}}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ToolSpecError(f"messages[{i}].tool_calls[{j}].function.arguments is not "
                                    f"JSON: {args[:80]!r}") from None
        out.append({"id": c.get("id") or "", "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def template_supports_system_role(template) -> bool:
    """Whether a chat template (anything with render(messages, add_generation_prompt, tools))
    prints a system message (Gemma 2's raises instead): llama.cpp probes its templates so."""
    probe = "<<system probe 7f3a>>"
    msgs = [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}]
    for tools in ([], None):     # tool-use templates iterate `tools` unconditionally
        try:
            return probe in template.render(msgs, False, tools)
        except Exception:  # noqa: BLE001 - a template that fails here has no system role
            continue
    return False


def prepare_messages(messages, fmt: ToolFormat, tools=None,
                     system_role: bool = True) -> list[dict]:
    """OpenAI chat messages as `fmt`'s templates expect them: tool-call arguments as objects;
    `role: "tool"` results keep tool_call_id / name (the name filled in from the call when
    missing); an empty tool_calls list is dropped (Llama's template tests only for the key).
    Mistral: ids made 9 letters and digits. Harmony: one call per assistant message, each
    followed by its result. Generic: calls and results become JSON text in assistant and user
    messages, and the tools description goes into the system message. `system_role=False` (see
    template_supports_system_role): the system text opens the first user message instead.
    An assistant message's reasoning_content becomes harmony's `thinking`."""
    if not isinstance(messages, (list, tuple)):
        raise ToolSpecError("messages must be a list")
    out: list[dict] = []
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ToolSpecError(f"messages[{i}] must be an object, got {type(m).__name__}")
        m = dict(m)
        if m.get("role") == "assistant" and "tool_calls" in m:
            if not m["tool_calls"]:
                del m["tool_calls"]
            else:
                m["tool_calls"] = _parsed_calls(i, m)
                for c in m["tool_calls"]:
                    names[c["id"]] = c["function"]["name"]
                if m.get("content") is None:
                    m["content"] = ""
        elif m.get("role") == "tool":
            if not m.get("name") and m.get("tool_call_id") in names:
                m["name"] = names[m["tool_call_id"]]
            if m.get("content") is None:
                m["content"] = ""
        out.append(m)
    if isinstance(fmt, MistralFormat):
        for m in out:
            for c in m.get("tool_calls", ()):
                c["id"] = _mistral_id(c["id"] or c["function"]["name"])
            if m.get("role") == "tool" and "tool_call_id" in m:
                m["tool_call_id"] = _mistral_id(m["tool_call_id"])
    elif isinstance(fmt, HarmonyFormat):
        for m in out:
            if m.get("role") == "assistant" and isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m.pop("reasoning_content")
        out = _one_call_per_message(out)
    elif isinstance(fmt, GenericFormat):
        out = _generic_messages(out, fmt, tools)
    elif isinstance(fmt, Gemma4Format) and fmt.embedded_responses:
        out = _gemma4_tool_responses(out)
    if not system_role:
        out = _system_into_user(out)
    return out


def _system_into_user(msgs: list[dict]) -> list[dict]:
    system = "\n\n".join(m.get("content") or "" for m in msgs if m.get("role") == "system")
    out = [m for m in msgs if m.get("role") != "system"]
    if system:
        for k, m in enumerate(out):
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                out[k] = {**m, "content": system + "\n\n" + m["content"]}
                break
        else:
            out.insert(0, {"role": "user", "content": system})
    return out


def _one_call_per_message(msgs: list[dict]) -> list[dict]:
    out: list[dict] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        calls = m.get("tool_calls") or []
        if m.get("role") != "assistant" or len(calls) < 2:
            out.append(m)
            i += 1
            continue
        results = []
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") == "tool":
            results.append(msgs[j])
            j += 1
        for k, c in enumerate(calls):
            out.append({**m, "tool_calls": [c], "content": m.get("content", "") if k == 0 else ""})
            out.extend(r for r in results if r.get("tool_call_id") == c["id"])
        out.extend(r for r in results if r.get("tool_call_id") not in {c["id"] for c in calls})
        i = j
    return out


def _gemma4_tool_responses(msgs: list[dict]) -> list[dict]:
    """An assistant message with calls, the role "tool" results after it and a plain assistant
    reply after those become one assistant message with `tool_responses` ([{"name",
    "response"}], a result that is JSON text parsed) — the older Gemma 4 templates' form."""
    out: list[dict] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls = m["tool_calls"]
        merged = {"role": "assistant", "tool_calls": calls}
        if isinstance(m.get("reasoning_content"), str):
            merged["reasoning_content"] = m["reasoning_content"]
        responses = []
        i += 1
        while i < len(msgs) and msgs[i].get("role") == "tool":
            r = msgs[i]
            body = r.get("content")
            if isinstance(body, str):
                try:
                    body = json.loads(body)
                except ValueError:
                    pass
            k = len(responses)
            name = calls[k]["function"]["name"] if k < len(calls) else ""
            responses.append({"name": name or r.get("tool_call_id", ""), "response": body})
            i += 1
        if responses:
            merged["tool_responses"] = responses
        if i < len(msgs) and msgs[i].get("role") == "assistant" and \
                not msgs[i].get("tool_calls") and msgs[i].get("content"):
            merged["content"] = msgs[i]["content"]
            i += 1
        out.append(merged)
    return out


def _generic_messages(msgs: list[dict], fmt: GenericFormat, tools) -> list[dict]:
    out: list[dict] = []
    for m in msgs:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"],
                      **({"id": c["id"]} if c["id"] else {})} for c in m["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif role == "assistant" and isinstance(m.get("content"), str) and tools:
            out.append({**m, "content": json.dumps({"response": m["content"]},
                                                   ensure_ascii=False)})
        elif role == "tool":
            result = {"tool_response": {"tool": m.get("name", ""),
                                        **({"tool_call_id": m["tool_call_id"]}
                                           if m.get("tool_call_id") else {}),
                                        "content": m.get("content", "")}}
            text = json.dumps(result, ensure_ascii=False)
            # consecutive results go in one user turn: templates want roles to alternate
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_results": True})
        else:
            out.append(m)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        prompt = fmt.system_prompt(tools)
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
