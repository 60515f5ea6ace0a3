"""Constrained output from the command line (llama.cpp's --grammar, --grammar-file, -j /
--json-schema, --json-schema-file) on `run`, `chat` and `serve`, and what a bad one prints.
SmolLM2-135M-Instruct (make setup); every wait is bounded."""
import json
import re
import subprocess

import httpx
import pytest

from pyggml.llm.grammar import GrammarSpec
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from support.serve_process import ENV, PYGGML

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "legs": {"type": "integer", "minimum": 0,
                                                    "maximum": 8}},
          "required": ["name", "legs"], "additionalProperties": False}
LIST = 'root ::= ("- " [a-z]+ "\\n")+'


@pytest.fixture(scope="module")
def smol():
    return str(ensure_smollm2())


def _run(args, **kw):
    return subprocess.run(PYGGML + args, capture_output=True, text=True, timeout=180, env=ENV,
                          **kw)


def test_run_with_a_gbnf_grammar_and_a_grammar_file(smol, tmp_path):
    r = _run(["run", "-m", smol, "-p", "Fruits:", "-n", "24", "--temp", "0", "-t", "2",
              "--no-display-prompt", "--grammar", LIST])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip("\n").split("\n")
    assert lines and all(re.fullmatch(r"- [a-z]+", ln) for ln in lines[:-1]), r.stdout
    f = tmp_path / "list.gbnf"
    f.write_text(LIST + "\n")
    r2 = _run(["run", "-m", smol, "-p", "Fruits:", "-n", "24", "--temp", "0", "-t", "2",
               "--no-display-prompt", "--grammar-file", str(f)])
    assert r2.returncode == 0 and r2.stdout == r.stdout


def test_chat_with_a_json_schema(smol, tmp_path):
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(SCHEMA))
    r = _run(["chat", "-m", smol, "--temp", "0", "-n", "64", "-c", "1024", "-t", "2",
              "--json-schema-file", str(f)], input="Describe a cat as JSON.\n")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout.strip())
    assert set(obj) == {"name", "legs"} and 0 <= obj["legs"] <= 8


@pytest.mark.parametrize("args,message", [
    (["-j", '{"type": "objekt"}'], r"invalid JSON schema at schema\['type'\]"),
    (["-j", "{not json"], "not valid JSON"),
    (["--grammar", 'root ::= ("a"'], r"GBNF grammar error at 1:\d+"),
    (["--grammar", 'root ::= "a"', "-j", "{}"], "give one grammar or schema"),
    (["--grammar-file", "/nonexistent/g.gbnf"], "cannot read it"),
])
def test_a_bad_grammar_is_one_line_before_the_model_loads(smol, args, message):
    for cmd in (["run", "-n", "4"], ["serve", "--port", "1"], ["chat"]):
        r = _run(cmd + ["-m", smol] + args, input="")
        assert r.returncode != 0
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), r.stderr
        assert "Traceback" not in r.stderr and "serving" not in r.stderr


def test_serve_default_grammar_applies_to_requests_without_their_own(smol):
    with LLM(smol, n_ctx=1024, n_threads=2) as llm:
        server = make_server(llm, 1, "m")
        server.default_grammar = GrammarSpec.json_schema(SCHEMA)
        rs = start_in_thread(server)
        try:
            url = f"http://127.0.0.1:{rs.port}/v1/chat/completions"
            msgs = [{"role": "user", "content": "Describe a dog."}]
            r = httpx.post(url, timeout=120, json={"messages": msgs, "max_tokens": 64,
                                                   "temperature": 0})
            obj = json.loads(r.json()["choices"][0]["message"]["content"])
            assert set(obj) == {"name", "legs"}
            # a request's own constraint wins
            r = httpx.post(url, timeout=120, json={
                "messages": msgs, "max_tokens": 16, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "n", "schema": {"type": "array", "items": {"type": "integer"},
                                            "maxItems": 3}}}})
            assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), list)
        finally:
            rs.stop()
