"""Constrained decoding: a grammar masks the tokens it forbids before each sampling.

The engine is llguidance (a well-kept Earley/derivative-regex engine that llama.cpp can use
too): it takes the vocabulary as token bytes and computes, per step, a bitmask of the tokens
that keep the output inside the grammar (~10 µs for a JSON schema; the mask is applied with one
numpy pass over the logits). Inputs, as llama.cpp / llama-cpp-python / OpenAI take them:

- a JSON schema (OpenAI's `response_format: {"type": "json_schema", "json_schema": {"schema":
  ...}}`, llama.cpp's `{"type": "json_object", "schema": ...}`, `json_schema`, `-j`): checked
  against its meta-schema first, so an error names the path in the schema;
- a GBNF grammar (llama.cpp's `grammar`, `--grammar`, `--grammar-file`): converted to
  llguidance's Lark dialect; a syntax error names line:col;
- a regex, or a Lark grammar of llguidance's dialect (what the tool-call formats produce).

`Constraint` is the per-step token filter of the generation loop (pyggml/llm/generate.py,
`TokenFilter`): it is called with the tokens generated so far and a logits row, brings its
matcher to exactly those tokens (forward, or back after a speculative round rejected drafts)
and returns the row with forbidden tokens at -inf. A drafted token the grammar forbids thus has
probability 0 and is rejected by the speculative rule. `lazy` triggers (tool calls with
tool_choice "auto"): the output is free until a trigger text appears; from there on the
grammar, which starts with the trigger, constrains the rest.

Compiled grammars are cached per vocabulary by their text (a prototype matcher, deep-copied
per request); building the vocabulary's token table costs ~1 s for a 262k vocabulary, once per
model. Untrusted grammars are bounded by llguidance's parser limits (lexer fuel, Earley items
per step, lexer states, grammar size).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pyggml.errors import GrammarError

#: compiled grammars kept per vocabulary (prototype matchers: a few hundred KiB each at most)
CACHE_MAX = 64
#: grammar text bytes accepted at most (a request's schema or GBNF)
GRAMMAR_MAX_BYTES = 256 * 1024
KINDS = ("json_schema", "gbnf", "regex", "lark")
#: JSON whitespace as llama.cpp's schema grammars allow it (`space`: nothing, a space, or one or
#: two newlines and up to 20 spaces or tabs of indentation): bounded, so a small model cannot
#: fill its budget with blank lines between two tokens of an object
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}


def _llguidance():
    import llguidance       # imported on first use: the runtime does not need it otherwise
    return llguidance


def _limits():
    lg = _llguidance()
    # llguidance's defaults, with the lexer's state count (memory, ~1-2 KiB a state) and the
    # grammar size lowered for requests from anyone; the per-step limits bound the time
    return lg.LLParserLimits(max_lexer_states=50_000, max_grammar_size=100_000)


@dataclass(frozen=True)
class GrammarSpec:
    """What to constrain to: kind (one of KINDS) and its text (a JSON schema as JSON text)."""
    kind: str
    text: str

    @staticmethod
    def json_schema(schema) -> "GrammarSpec":
        """A JSON schema (dict, bool or JSON text); {} or True: any JSON object value."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}", "schema") from None
        if schema is True or schema == {}:
            schema = {"type": "object"}
        check_json_schema(schema)
        return GrammarSpec("json_schema", json.dumps(schema, sort_keys=True))

    @staticmethod
    def gbnf(text: str) -> "GrammarSpec":
        """GBNF text, its syntax checked now (an error names line:col)."""
        _gbnf_to_lark(_checked_text(text, "grammar"))
        return GrammarSpec("gbnf", text)

    @staticmethod
    def regex(text: str) -> "GrammarSpec":
        return GrammarSpec("regex", _checked_text(text, "regex"))

    @staticmethod
    def lark(text: str) -> "GrammarSpec":
        return GrammarSpec("lark", _checked_text(text, "grammar"))


def _checked_text(text, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{what} must be a non-empty string, got {text!r:.60}", what)
    if len(text.encode()) > GRAMMAR_MAX_BYTES:
        raise GrammarError(f"{what} has {len(text.encode())} bytes, more than the "
                           f"{GRAMMAR_MAX_BYTES} accepted", what)
    return text


def check_json_schema(schema) -> None:
    """GrammarError naming the path in the schema where it breaks its meta-schema."""
    import jsonschema
    if len(json.dumps(schema)) > GRAMMAR_MAX_BYTES:
        raise GrammarError(f"the JSON schema is larger than {GRAMMAR_MAX_BYTES} bytes", "schema")
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}", "schema")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "schema" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]"
                                   for p in e.path)
        raise GrammarError(f"invalid JSON schema at {where}: {e.message}", where) from None


def _gbnf_to_lark(text: str) -> str:
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark
    try:
        return gbnf_to_lark(text)
    except GbnfToLarkError as e:
        pos = e.pos.pos
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        msg = str(e).split(" at line")[0]
        raise GrammarError(f"GBNF grammar error at {line}:{col}: {msg}", f"{line}:{col}") \
            from None
    except Exception as e:         # noqa: BLE001 - its resolver raises plain Exceptions
        raise GrammarError(f"GBNF grammar error: {e}", "grammar") from None


class Vocabulary:
    """A model's vocabulary as llguidance sees it (token bytes; control tokens marked with a
    0xFF prefix so grammar text never produces them by accident, while a Lark grammar can
    name them as <|...|>), with the compiled-grammar cache. Built once per tokenizer."""

    def __init__(self, tokenizer, n_vocab: int):
        lg = _llguidance()
        from pyggml.llm.tokenizer import TokenAttr
        tokens = []
        for i in range(tokenizer.n_vocab):
            piece = tokenizer.token_to_piece(i, special=True)
            if tokenizer.token_attr(i) & TokenAttr.CONTROL:
                piece = b"\xff" + piece
            tokens.append(piece)
        tokens += [b""] * (n_vocab - len(tokens))     # padded logits rows: never allowed
        eog = sorted(tokenizer.eog_ids)

        class _Wrapped:             # what llguidance.TokenizerWrapper reads
            eos_token_id = eog[0] if eog else 0
            bos_token_id = tokenizer.bos_id

            def __init__(self):
                self.tokens = tokens
                self.special_token_ids = []

            def __call__(self, s):
                return tokenizer.encode(s, add_special=False, parse_special=False)

        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.ll = lg.LLTokenizer(lg.TokenizerWrapper(_Wrapped()), n_vocab=n_vocab,
                                 eos_token=eog or None)
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, spec: GrammarSpec):
        """A fresh matcher of `spec` (compiled once, then copied); GrammarError if invalid."""
        with self._lock:
            proto = self._cache.get(spec)
            if proto is not None:
                self._cache.move_to_end(spec)
                return proto.deep_copy()
        proto = self._compile(spec)
        with self._lock:
            self._cache[spec] = proto
            while len(self._cache) > CACHE_MAX:
                self._cache.popitem(last=False)
        return proto.deep_copy()

    def _compile(self, spec: GrammarSpec):
        lg = _llguidance()
        M = lg.LLMatcher
        if spec.kind == "json_schema":
            try:
                grammar = M.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
            except ValueError as e:
                raise GrammarError(f"invalid JSON schema: {e}", "schema") from None
        elif spec.kind == "gbnf":
            grammar = M.grammar_from_lark(_gbnf_to_lark(spec.text))
        elif spec.kind == "regex":
            grammar = M.grammar_from_regex(spec.text)
        elif spec.kind == "lark":
            grammar = M.grammar_from_lark(spec.text)
        else:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got "
                               f"{spec.kind!r}", "kind")
        m = M(self.ll, grammar, log_level=0, limits=_limits())
        if m.is_error():
            what = {"json_schema": "JSON schema", "gbnf": "GBNF grammar", "regex": "regex",
                    "lark": "grammar"}[spec.kind]
            raise GrammarError(f"unsupported or invalid {what}: "
                               f"{m.get_error().strip()[:400]}", spec.kind)
        return m


class Constraint:
    """The token filter of one generation (see the module docstring). lazy: trigger texts
    (None: the grammar holds from the first token). Not shared between generations."""

    def __init__(self, vocab: Vocabulary, spec: GrammarSpec, lazy=None, lazy_at_start=()):
        self.vocab, self.spec = vocab, spec
        self.matcher = vocab.matcher(spec)
        self.triggers = tuple(t.encode() for t in lazy or ())
        # triggers that count only at the start of the output (after whitespace)
        self.start_triggers = tuple(t.encode() for t in lazy_at_start or ())
        self._start_open = bool(self.start_triggers)    # the start is still being read
        lazy = bool(self.triggers or self.start_triggers)
        self._proto = self.matcher.deep_copy() if lazy else None
        self._mask = np.full((1, (vocab.n_vocab + 31) // 32), -1, np.int32)
        self._consumed: list[int] = []     # the tokens the matcher holds
        # lazy: the generated tokens scanned and their bytes; once a trigger is found, the
        # tokens of the text from it to the end of the token that completed it (`_head`) and
        # the generated index after that token
        self._hist: list[int] = []
        self._hist_bytes: list[bytes] = []
        self._head: list[int] | None = None if lazy else []
        self._after = 0

    @property
    def active(self) -> bool:
        """The grammar constrains the output (always, or since a trigger appeared)."""
        return self._head is not None

    def __call__(self, generated: list[int], logits: np.ndarray) -> np.ndarray:
        if self._proto is not None:
            self._scan(generated)
            if self._head is None:
                return logits
        self._sync(generated if self._after == 0 and not self._head else
                   self._head + list(generated[self._after:]))
        if self.matcher.is_error():
            raise GrammarError(f"constrained output: {self.matcher.get_error()[:300]}")
        row = self._mask[0]
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        allowed = np.unpackbits(self._mask.view(np.uint8), bitorder="little")
        return np.where(allowed[:logits.shape[-1]].view(bool), logits, np.float32(-np.inf))

    def _sync(self, want: list[int]) -> None:
        """Bring the matcher to hold exactly `want`: back over tokens a speculative round
        dropped, forward over new ones."""
        have = self._consumed
        if have == want[:len(have)]:        # the usual step: one more token (a C compare)
            n = len(have)
        else:
            n = 0
            for a, b in zip(have, want):
                if a != b:
                    break
                n += 1
        if n < len(have):
            self.matcher.rollback(len(have) - n)
            del have[n:]
        if len(want) > n:
            # a token the grammar forbids (an unchecked draft) stops the consumption there:
            # the rows after it are never used, the speculative rule rejects that draft first
            k = self.matcher.try_consume_tokens(list(want[n:]))
            have += want[n:n + k]

    def _scan(self, generated: list[int]) -> None:
        """Lazy start: find the first trigger in the generated bytes, kept incrementally (a
        speculative round may have dropped tokens since the last call)."""
        n = 0
        for a, b in zip(self._hist, generated):
            if a != b:
                break
            n += 1
        if self._head is not None and n < self._after:     # rolled back before the trigger
            self._head, self._consumed = None, []
            self.matcher = self._proto.deep_copy()
        if n == 0:
            self._start_open = bool(self.start_triggers)
        del self._hist[n:], self._hist_bytes[n:]
        piece = self.vocab.tokenizer.token_to_piece
        for t in generated[n:]:
            self._hist.append(t)
            self._hist_bytes.append(piece(t, special=True))
            if self._head is None:
                self._find_trigger()

    def _find_trigger(self) -> None:
        if self._start_open:
            text = b"".join(self._hist_bytes)
            lead = text.lstrip()
            for t in self.start_triggers:
                if lead.startswith(t):
                    self._start_at(len(text) - len(lead))
                    return
            # the start is decided once it is longer than every start trigger
            self._start_open = len(lead) < max(len(t) for t in self.start_triggers) or any(
                t.startswith(lead) for t in self.start_triggers)
        if not self.triggers:
            return
        # only the last token's bytes and a trigger's length before them can hold a new one
        span = len(self._hist_bytes[-1]) + max(len(t) for t in self.triggers)
        tail = b"".join(self._hist_bytes[-span:])[-span:]
        at = [i for i in (tail.find(t) for t in self.triggers) if i >= 0]
        if at:
            text = b"".join(self._hist_bytes)
            self._start_at(len(text) - len(tail) + min(at))

    def _start_at(self, offset: int) -> None:
        """The grammar starts at byte `offset` of the output: it holds the text from there to
        the end of the last token (the matcher checks bytes, so any tokenization of them is
        accepted), then every token after."""
        text = b"".join(self._hist_bytes)
        self._head = self.vocab.tokenizer.encode(text[offset:], add_special=False,
                                                 parse_special=True)
        self._after = len(self._hist)


def response_format_spec(fmt) -> GrammarSpec | None:
    """The constraint of OpenAI's / llama.cpp's `response_format` (None: plain text)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise GrammarError("response_format must be an object with a \"type\"",
                           "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_schema(fmt.get("schema", {"type": "object"}))
    if kind == "json_schema":
        js = fmt.get("json_schema")
        if isinstance(js, dict) and "schema" in js:
            return GrammarSpec.json_schema(js["schema"])
        if isinstance(fmt.get("schema"), (dict, bool)):
            return GrammarSpec.json_schema(fmt["schema"])
        raise GrammarError("response_format json_schema needs json_schema.schema",
                           "response_format.json_schema")
    raise GrammarError(f"response_format.type must be text, json_object or json_schema, got "
                       f"{kind!r}", "response_format.type")


_VOCABS: dict[int, tuple[object, Vocabulary]] = {}
_VOCABS_LOCK = threading.Lock()


def vocabulary_for(tokenizer, n_vocab: int) -> Vocabulary:
    """The Vocabulary of a tokenizer (built on first use, then kept while the tokenizer is)."""
    with _VOCABS_LOCK:
        held = _VOCABS.get(id(tokenizer))
        if held is not None and held[0] is tokenizer and held[1].n_vocab == n_vocab:
            return held[1]
        v = Vocabulary(tokenizer, n_vocab)
        # a handful of models per process: drop entries of tokenizers no longer alive
        for k in [k for k, (t, _) in _VOCABS.items() if t is None]:
            del _VOCABS[k]
        _VOCABS[id(tokenizer)] = (tokenizer, v)
        return v


def request_spec(grammar=None, json_schema=None, response_format=None) -> GrammarSpec | None:
    """The one constraint of a request's fields (llama.cpp's `grammar` as GBNF or a
    GrammarSpec, `json_schema`, OpenAI's `response_format`); GrammarError when more than one
    is given or one is invalid."""
    given = [n for n, v in (("grammar", grammar), ("json_schema", json_schema),
                            ("response_format", response_format_spec(response_format)))
             if v is not None]
    if len(given) > 1:
        raise GrammarError(f"give one of grammar, json_schema and response_format, got "
                           f"{' and '.join(given)}", given[1])
    if grammar is not None:
        return grammar if isinstance(grammar, GrammarSpec) else GrammarSpec.gbnf(grammar)
    if json_schema is not None:
        return GrammarSpec.json_schema(json_schema)
    return response_format_spec(response_format)


def constraint_for(llm, spec: GrammarSpec | None, lazy=None,
                   lazy_at_start=()) -> Constraint | None:
    """The token filter of `spec` on an LLM's vocabulary (None: unconstrained)."""
    if spec is None:
        return None
    return Constraint(vocabulary_for(llm.tokenizer, llm.hparams.n_vocab), spec, lazy,
                      lazy_at_start)
