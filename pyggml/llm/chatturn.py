"""One assistant turn of a chat request, as OpenAI's chat completions shape it: the prompt (tools
and tool results rendered through the model's template), the constraint (a JSON schema or
grammar, or a tool call forced or lazily constrained), and the reply split into reasoning,
content and tool calls — streamed as OpenAI's deltas, or whole as one message.

Shared by `LLM.create_chat_completion` (pyggml/llm/completion.py), the server's chat path
(pyggml/server/app.py) and, through it, /v1/messages and /v1/responses. The families' formats
are pyggml/llm/toolcalls.py and pyggml/llm/reasoning.py; the constraint engine
pyggml/llm/grammar.py; the generation loop pyggml/llm/generate.py.

tool_choice: "none" (tools are shown, nothing is parsed or constrained), "auto" (the model may
call: from the family's opening text on, the call is constrained to a well-formed call whose
arguments match the tool's schema), "required" or {"type": "function", "function": {"name":
...}} (the reply is a call, constrained from its first token). Families without a trigger (the
generic JSON format) constrain the whole reply in every mode but "none".
"""

from __future__ import annotations

import numpy as np

from pyggml.errors import GrammarError, ModelError
from pyggml.llm import reasoning as rsn
from pyggml.llm import toolcalls as tc
from pyggml.llm.chat import chat_prompt
from pyggml.llm.generate import FINISH_CONTEXT, FINISH_LENGTH
from pyggml.llm.grammar import GrammarSpec, constraint_for, request_spec

#: template variables a request may not set through chat_template_kwargs (the renderer's own)
RESERVED_TEMPLATE_VARS = ("messages", "tools", "add_generation_prompt", "bos_token",
                          "eos_token", "raise_exception", "strftime_now")
REASONING_FORMATS = ("auto", "none", "deepseek")


class ChatRequestError(ModelError):
    """A chat request field is invalid: `param` names it (the server answers 400 with it)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _tool_choice(choice, names: list[str]) -> tuple[str, str | None]:
    """(mode, name): mode in none / auto / required / named."""
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ChatRequestError(f"tool_choice must be none, auto, required or "
                                   f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                                   f"got {choice!r}", "tool_choice")
        if choice != "none" and not names:
            raise ChatRequestError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ChatRequestError("tool_choice must name a function: {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise ChatRequestError(f"tool_choice names the function {name!r}, which is not among "
                               f"the tools ({', '.join(names) or 'none given'})",
                               "tool_choice.function.name")
    return "named", name


class ChatTurn:
    """One chat request's turn (see the module docstring). The fields are OpenAI's / llama.cpp's
    request fields; ChatRequestError or GrammarError (both ModelError) for bad ones."""

    def __init__(self, llm, template, messages, *, tools=None, tool_choice=None,
                 parallel_tool_calls=None, grammar=None, json_schema=None,
                 response_format=None, chat_template_kwargs=None, reasoning_format=None,
                 reasoning_budget=None):
        self.llm = llm
        if tools is not None and not isinstance(tools, list):
            raise ChatRequestError("tools must be a list of {\"type\": \"function\", "
                                   "\"function\": {...}}", "tools")
        try:
            functions = tc.tool_functions(tools) if tools else {}
        except ModelError as e:
            raise ChatRequestError(str(e), "tools") from None
        self.tools = tools or None
        self.mode, self.tool_name = _tool_choice(tool_choice, list(functions))
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ChatRequestError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
        self.parallel = bool(parallel_tool_calls) if parallel_tool_calls is not None else False
        if reasoning_format is None:
            reasoning_format = "auto"
        if reasoning_format not in REASONING_FORMATS:
            raise ChatRequestError(f"reasoning_format must be one of "
                                   f"{', '.join(REASONING_FORMATS)}, got {reasoning_format!r}",
                                   "reasoning_format")
        kwargs = chat_template_kwargs or {}
        if not isinstance(kwargs, dict):
            raise ChatRequestError("chat_template_kwargs must be an object",
                                   "chat_template_kwargs")
        bad = [k for k in kwargs if k in RESERVED_TEMPLATE_VARS or not isinstance(k, str)]
        if bad:
            raise ChatRequestError(f"chat_template_kwargs may not set {bad[0]!r} (set by the "
                                   f"request itself)", "chat_template_kwargs")
        if reasoning_budget is not None and (isinstance(reasoning_budget, bool) or
                                             not isinstance(reasoning_budget, int)
                                             or reasoning_budget < -1):
            raise ChatRequestError("reasoning_budget must be an integer >= -1 (-1: no limit)",
                                   "reasoning_budget")
        src = template.source
        # the family's format reads the history's calls even when this turn may not call
        fmt = tc.format_for_template(src)
        self.fmt = fmt if self.tools and self.mode != "none" else None
        # the template's thinking markers (a budget closes them whatever the output format)
        self.markers = rsn.reasoning_for_template(src)
        self.rfmt = None if reasoning_format == "none" else self.markers
        msgs = tc.prepare_messages(messages, fmt, self.tools) if (
            self.tools or _has_tool_history(messages)) else messages
        self.prompt = chat_prompt(template, msgs, self.tools, kwargs)
        if isinstance(fmt, tc.Gemma4Format) and self.prompt.endswith("<turn|>\n"):
            # a history ending in a reply after tool results: Gemma 4's template opens no
            # model turn there (llama.cpp's init_gemma4 adds it)
            self.prompt += "<|turn>model\n"
        self.ids = prompt_ids(llm, self.prompt)
        self.thinking_in_prompt = self.markers is not None and \
            rsn.opens_in_prompt(self.markers, self.prompt)
        self.reasoning_budget = -1 if reasoning_budget is None else reasoning_budget
        self.grammar = self._grammar(request_spec(grammar, json_schema, response_format), fmt)
        # the reply as it streams: reasoning split first, then tool markup
        self._splitter = rsn.ReasoningSplitter(self.rfmt, self.thinking_in_prompt) \
            if self.rfmt is not None else None
        self._tools = self.fmt.stream(self.tools) if self.fmt is not None else None
        # gpt-oss without tools to call: its reply is still harmony messages; their headers
        # and ends are markup, only the text of the final (and a commentary preamble) is
        # content, and a call it makes anyway is dropped (not asked for)
        self._harmony = (fmt.stream(None) if self._tools is None and self.rfmt is not None
                         and isinstance(fmt, tc.HarmonyFormat) else None)
        self.content, self.reasoning = [], []
        self.calls: list[dict] = []

    def _grammar(self, user: GrammarSpec | None, fmt):
        """(spec, lazy triggers, triggers at the reply's start) of this turn (no triggers:
        constrained from the first token), or None: unconstrained."""
        if self.fmt is None:
            return (user, None, ()) if user is not None else None
        if user is not None:
            raise GrammarError("a grammar or response_format together with tools is not "
                               "supported: give one, or tool_choice \"none\"", "response_format")
        forced = self.mode in ("required", "named")
        token_ids = {m: i for m in fmt.markers
                     if (i := self.llm.tokenizer.text_to_id(m)) is not None}
        lark = fmt.grammar(self.tools, required=forced, name=self.tool_name,
                           parallel=self.parallel, token_ids=token_ids)
        if forced or not (fmt.triggers or fmt.start_triggers):
            return GrammarSpec.lark(lark), None, ()
        return GrammarSpec.lark(lark), fmt.triggers, fmt.start_triggers

    # ---- decoding --------------------------------------------------------------------------
    def token_filter(self):
        """The generation's per-step filter (None: unconstrained): compiles the grammar (slow
        the first time for a model: run it off an event loop)."""
        filters = []
        if self.markers is not None and self.reasoning_budget >= 0:
            filters.append(ReasoningBudget(self.llm.tokenizer, self.markers,
                                           self.reasoning_budget, self.thinking_in_prompt))
        if self.grammar is not None:
            filters.append(constraint_for(self.llm, *self.grammar))
        if not filters:
            return None
        if len(filters) == 1:
            return filters[0]

        def chained(generated, logits):
            for f in filters:
                logits = f(generated, logits)
            return logits
        return chained

    # ---- the reply ---------------------------------------------------------------------------
    def feed(self, text: str) -> list[dict]:
        """OpenAI chat deltas for new reply text (the safe text a generation hands out)."""
        return self._deltas(self._split(text, final=False))

    def finish(self) -> list[dict]:
        """The deltas of the text still held (end of the reply)."""
        return self._deltas(self._split("", final=True))

    def _split(self, text: str, final: bool) -> list[tuple]:
        """Reply text → events: reasoning split off first, then tool markup read."""
        if self._splitter is None:
            parts = [("content", text)]
        else:
            parts = self._splitter.finish() if final else self._splitter.feed(text)
        events = []
        reader = self._tools if self._tools is not None else self._harmony
        for kind, piece in parts:
            if kind == "reasoning":
                events.append(("reasoning", piece))
            elif reader is None:
                events.append(("content", piece))
            else:
                events += reader.feed(piece)
        if final and reader is not None:
            events += reader.finish()
        if reader is self._harmony and reader is not None:
            events = [e for e in events if e[0] in ("content", "reasoning")]
        return events

    def _deltas(self, events: list[tuple]) -> list[dict]:
        out = []
        for ev in events:
            if ev[0] == "content" and ev[1]:
                self.content.append(ev[1])
                out.append({"content": ev[1]})
            elif ev[0] == "reasoning" and ev[1]:
                self.reasoning.append(ev[1])
                out.append({"reasoning_content": ev[1]})
            elif ev[0] == "call":
                _, index, cid, name = ev
                self.calls.append({"id": cid, "type": "function",
                                   "function": {"name": name, "arguments": ""}})
                out.append({"tool_calls": [{"index": index, "id": cid, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
            elif ev[0] == "args" and ev[2]:
                _, index, frag = ev
                self.calls[index]["function"]["arguments"] += frag
                out.append({"tool_calls": [{"index": index, "function": {"arguments": frag}}]})
        return out

    def message(self) -> dict:
        """The whole assistant message (after finish())."""
        msg = {"role": "assistant",
               "content": "".join(self.content) if self.content or not self.calls else None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = self.calls
        return msg

    def finish_reason(self, gen) -> str | None:
        """OpenAI's: tool_calls when the reply called a tool; a full context is 'length'."""
        if self.calls:
            return "tool_calls"
        return FINISH_LENGTH if gen.finish_reason == FINISH_CONTEXT else gen.finish_reason


def _has_tool_history(messages) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
        for m in messages)


def prompt_ids(llm, prompt: str) -> list[int]:
    """Token ids of a chat prompt: special tokens parsed and BOS added as the model wants,
    once (a template that writes bos_token itself does not get a second one)."""
    ids = llm.tokenize(prompt)
    bos = llm.tokenizer.bos_id
    if len(ids) >= 2 and bos is not None and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


class ReasoningBudget:
    """A token filter that closes the thinking block once `budget` tokens were spent in it:
    from then on it forces the tokens of the format's closing text (llama.cpp's
    --reasoning-budget; 0: the block is closed at once). The generated bytes are kept
    incrementally (a speculative round may drop the last tokens: they are taken back)."""

    def __init__(self, tokenizer, fmt, budget: int, open_at_start: bool):
        self.tokenizer, self.budget = tokenizer, budget
        self.open_b, self.close_b = fmt.start.encode(), fmt.end.encode()
        self.close_ids = tokenizer.encode(rsn.budget_close_text(fmt), add_special=False,
                                          parse_special=True)
        self.open_at_start = open_at_start
        self._seen: list[int] = []
        self._ends: list[int] = []        # byte length of the text after each token
        self._text = b""

    def _sync(self, generated) -> None:
        n = len(self._seen)
        if generated[:n] != self._seen:
            n = 0
            while n < min(len(generated), len(self._seen)) and generated[n] == self._seen[n]:
                n += 1
            del self._seen[n:], self._ends[n:]
            self._text = self._text[:self._ends[-1] if self._ends else 0]
        piece = self.tokenizer.token_to_piece
        for t in generated[n:]:
            self._seen.append(t)
            self._text += piece(t, special=True)
            self._ends.append(len(self._text))

    def __call__(self, generated, logits):
        self._sync(generated)
        if self.open_at_start:
            start_tok, after = 0, 0
        else:
            i = self._text.find(self.open_b)
            if i < 0:
                return logits
            after = i + len(self.open_b)
            start_tok = next((j + 1 for j, e in enumerate(self._ends) if e >= after),
                             len(self._ends))
        if self.close_b in self._text[after:]:
            return logits
        spent = len(generated) - start_tok
        k = spent - self.budget                 # forced tokens already emitted
        if k < 0 or k >= len(self.close_ids):
            return logits
        out = np.full_like(logits, -np.inf)
        out[self.close_ids[k]] = 0.0
        return out
