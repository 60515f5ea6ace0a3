"""Reasoning ("thinking") text: the markers each family wraps it in, chosen from the chat
template, and a streaming splitter that sends what is between them to `reasoning_content` and
the rest to `content`, never a marker to either.

Families: `<think>...</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, GLM, MiniMax,
Kimi, Nemotron and the others of llama.cpp's models/templates that print it), Seed-OSS
`<seed:think>...</seed:think>`, Mistral reasoning models (Magistral, Ministral 3 Reasoning)
`[THINK]...[/THINK]`, Gemma 4 `<|channel>thought\n...<channel|>` (llama.cpp's peg-gemma4: a
stray `<channel|>` or an empty `<|channel>` in the content is dropped), and gpt-oss harmony,
whose `analysis` channel is the reasoning (`<|channel|>analysis<|message|>...<|end|>`).

For harmony the content that comes out is still harmony messages (headers of the final and
commentary channels, tool calls): read it with pyggml.llm.toolcalls.HarmonyFormat (with or
without tools), which keeps only their text. Engine-free; model output never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.errors import ModelError


class ReasoningFormatError(ModelError):
    """A ReasoningSplitter or budget helper given something that is not a ReasoningFormat."""


@dataclass(frozen=True)
class ReasoningFormat:
    """`start` / `end`: the markers around one reasoning block; `close`: the text to force when
    a reasoning budget is spent (the end marker and what the template writes after it), so the
    model goes on with its answer. `stray`: markup that may appear in the content outside a
    block and is dropped there (never shown as content)."""
    name: str
    start: str
    end: str
    close: str
    stray: tuple[str, ...] = ()


THINK = ReasoningFormat("think", "<think>", "</think>", "\n</think>\n\n")
SEED_THINK = ReasoningFormat("seed_think", "<seed:think>", "</seed:think>", "\n</seed:think>\n\n")
MISTRAL_THINK = ReasoningFormat("mistral", "[THINK]", "[/THINK]", "[/THINK]")
# gpt-oss: after the analysis message the reply must open its final message
HARMONY = ReasoningFormat("harmony", "<|channel|>analysis<|message|>", "<|end|>",
                          "<|end|><|start|>assistant<|channel|>final<|message|>")

# Gemma 4: "<|channel>" and "<channel|>" are single tokens, "thought" is text; the model may
# end its content with an unmatched "<channel|>" or open an empty channel (llama.cpp's parser
# consumes both)
GEMMA4 = ReasoningFormat("gemma4", "<|channel>thought", "<channel|>", "\n<channel|>",
                         stray=("<channel|>", "<|channel>"))

REASONING_FORMATS = {f.name: f for f in (THINK, SEED_THINK, MISTRAL_THINK, HARMONY, GEMMA4)}


def reasoning_for_template(template_source: str | None) -> ReasoningFormat | None:
    """The reasoning markers a chat template prints, or None for a model that does not think
    in marked blocks."""
    src = template_source or ""
    if "<|channel|>" in src:
        return HARMONY
    if "<|channel>thought" in src:
        return GEMMA4
    if "[THINK]" in src:
        return MISTRAL_THINK
    if "<seed:think>" in src:
        return SEED_THINK
    if "<think>" in src:
        return THINK
    return None


def opens_in_prompt(fmt: ReasoningFormat | None, prompt_text: str) -> bool:
    """Whether the rendered prompt already opened a reasoning block, so the reply starts inside
    it (QwQ and DeepSeek-R1 templates end the prompt with "<think>\\n"); a prompt that closed it
    again (Qwen3 with enable_thinking=false writes "<think>\\n\\n</think>\\n\\n") did not."""
    if fmt is None or not isinstance(prompt_text, str):
        return False
    return prompt_text.rstrip().endswith(fmt.start.strip())


def budget_close_text(fmt: ReasoningFormat) -> str:
    """The text to force into the reply when the reasoning budget is spent inside a block."""
    if not isinstance(fmt, ReasoningFormat):
        raise ReasoningFormatError(f"expected a ReasoningFormat, got {type(fmt).__name__}")
    return fmt.close


def _partial_suffix(s: str, marker: str) -> int:
    """Length of the longest suffix of s that is a proper prefix of marker."""
    for k in range(min(len(marker) - 1, len(s)), 0, -1):
        if s.endswith(marker[:k]):
            return k
    return 0


class ReasoningSplitter:
    """Splits a reply as it streams: feed(text) and finish() return [("reasoning" | "content",
    text)]. Text that may be the beginning of a marker is held back until it cannot be; the
    whitespace a block opens and closes with (and that after it) is dropped, as llama.cpp does.
    `started_in_prompt`: the reply starts inside a block (see opens_in_prompt). A reply cut off
    inside a block (max_tokens, a budget) gives its text as reasoning."""

    def __init__(self, fmt: ReasoningFormat, started_in_prompt: bool = False):
        if not isinstance(fmt, ReasoningFormat):
            raise ReasoningFormatError(f"ReasoningSplitter needs a ReasoningFormat, got "
                                       f"{type(fmt).__name__}")
        self.fmt = fmt
        self.in_reasoning = bool(started_in_prompt)
        self._buf = ""
        self._ws = ""            # trailing whitespace of the reasoning, held: dropped at its end
        self._strip_lead = bool(started_in_prompt)   # just after a marker
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not isinstance(text, str):
            raise ReasoningFormatError(f"ReasoningSplitter.feed takes text, got "
                                       f"{type(text).__name__}")
        self._buf += text
        return self._step(final=False)

    def finish(self) -> list[tuple[str, str]]:
        events = self._step(final=True)
        self._ws = ""       # whitespace at the end of an unclosed block: dropped too
        return events

    def _emit(self, kind: str, text: str, events: list) -> None:
        if self._strip_lead:
            text = text.lstrip()
            if not text:
                return
            self._strip_lead = False
        if kind == "reasoning":
            body = text.rstrip()
            if not body:
                self._ws += text
                return
            text, self._ws = self._ws + body, text[len(body):]
        if events and events[-1][0] == kind:
            events[-1] = (kind, events[-1][1] + text)
        else:
            events.append((kind, text))
        if kind == "reasoning":
            self.reasoning += text
        else:
            self.content += text

    def _step(self, final: bool) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        while self._buf:
            marker = self.fmt.end if self.in_reasoning else self.fmt.start
            kind = "reasoning" if self.in_reasoning else "content"
            i = self._buf.find(marker)
            if not self.in_reasoning and self.fmt.stray and self._stray(i, final, events):
                continue
            if i < 0:
                hold = 0 if final else max(
                    _partial_suffix(self._buf, m)
                    for m in (marker,) + (() if self.in_reasoning else self.fmt.stray))
                self._emit(kind, self._buf[:len(self._buf) - hold], events)
                self._buf = self._buf[len(self._buf) - hold:]
                break
            self._emit(kind, self._buf[:i], events)
            self._buf = self._buf[i + len(marker):]
            self.in_reasoning = not self.in_reasoning
            self._ws = ""
            self._strip_lead = True
        return events

    def _stray(self, i_start: int, final: bool, events: list) -> bool:
        """In the content: drop the first stray marker before the start marker (at `i_start`,
        -1: none). True when the buffer changed (or must wait: then it is left as is)."""
        best = None
        for m in self.fmt.stray:
            j = self._buf.find(m)
            if j >= 0 and (i_start < 0 or j < i_start) and (best is None or j < best[0]):
                best = (j, m)
        if best is None:
            return False
        j, m = best
        rest = self._buf[j:]
        if not final and len(rest) < len(self.fmt.start) and self.fmt.start.startswith(rest):
            return False            # may still become the start marker: the caller holds it
        self._emit("content", self._buf[:j], events)
        self._buf = self._buf[j + len(m):]
        return True
