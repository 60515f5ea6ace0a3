"""Every field of OpenAI's chat/completions and completions request schemas, as the official
`openai` client types them, is honoured, a label, or refused by name — per the table in
docs/server.md ("Request fields"), which this test reads. A field the `openai` package knows and
the table does not list fails the test: a new field is decided, never ignored by default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai.types import completion_create_params as completions_params
from openai.types.chat import completion_create_params as chat_params
from starlette.testclient import TestClient

from pyggml.llm.runtime import LLM
from pyggml.server import make_server

DOC = Path(__file__).resolve().parent.parent / "docs" / "server.md"
ROW = re.compile(r"^\| `(\w+)` \| ([a-z, ]+) \| (honoured|label|refused) \|", re.M)
TABLE = {(m[1], ep.strip()): m[3] for m in ROW.finditer(DOC.read_text())
         for ep in m[2].split(",")}
SCHEMA = {"chat": set(chat_params.CompletionCreateParamsBase.__annotations__),
          "completions": set(completions_params.CompletionCreateParamsBase.__annotations__)}

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# a value each field is honoured with (or, for labels, accepted with)
ACCEPTED = {
    "messages": [{"role": "user", "content": "hi"}], "prompt": "a b c", "model": "any-name",
    "n": 1, "max_tokens": 3, "max_completion_tokens": 3, "temperature": 0.5, "top_p": 0.9, "seed": 7,
    "stop": ["zz"], "stream": False, "stream_options": {"include_usage": True},
    "presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"3": 1},
    "logprobs": None, "top_logprobs": 2, "echo": True, "tools": [TOOL], "tool_choice": "none",
    "parallel_tool_calls": False, "response_format": {"type": "text"},
    "reasoning_effort": "low", "user": "u1", "safety_identifier": "s1",
    "metadata": {"k": "v"}, "prompt_cache_key": "key",
}
# a value that turns each refused field on
REFUSED = {
    "best_of": 2, "suffix": "tail", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "x"}, "store": True, "service_tier": "flex",
    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"}, "web_search_options": {},
    "functions": [TOOL["function"]], "function_call": {"name": "f"}, "verbosity": "high",
    "moderation": {"mode": "x"},
}


@pytest.fixture(scope="module")
def client(tiny_models):
    llm = LLM(tiny_models.get("llama"), n_ctx=1024, n_threads=1, n_seq_max=1)
    server = make_server(llm, 1, "tiny", chat_template="chatml")
    with TestClient(server.app, base_url="http://127.0.0.1") as c:
        yield c
    server.engine.stop()
    llm.close()


@pytest.mark.parametrize("endpoint", sorted(SCHEMA))
def test_the_table_lists_every_field_of_the_openai_schema(endpoint):
    missing = sorted(f for f in SCHEMA[endpoint] if (f, endpoint) not in TABLE)
    assert not missing, f"docs/server.md's table does not say what {endpoint} does with {missing}"


def _post(c, endpoint, field, value):
    body = ({"messages": ACCEPTED["messages"]} if endpoint == "chat"
            else {"prompt": ACCEPTED["prompt"]})
    body.update({"max_tokens": 3, "temperature": 0, field: value})
    return c.post("/v1/chat/completions" if endpoint == "chat" else "/v1/completions", json=body)


@pytest.mark.parametrize("field,endpoint", sorted(TABLE))
def test_each_field_is_honoured_or_refused_by_name(client, field, endpoint):
    kind = TABLE[(field, endpoint)]
    if kind == "refused":
        r = _post(client, endpoint, field, REFUSED[field])
        assert r.status_code == 400, (field, r.text)
        err = r.json()["error"]
        assert err["param"] == field and "not supported" in err["message"], err
    else:
        value = ACCEPTED[field]
        r = _post(client, endpoint, field, value)
        assert r.status_code == 200, (field, r.text)
        if kind == "label":         # a label of the wrong type is still a 400 naming it
            bad = 5 if not isinstance(value, int) else "x"
            r = _post(client, endpoint, field, bad)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_reasoning_effort_reaches_the_template_as_llama_server_passes_it(client):
    from pyggml.server.app import _template_kwargs
    assert _template_kwargs({"reasoning_effort": "high"}) == {"reasoning_effort": "high"}
    assert _template_kwargs({"reasoning_effort": "none",
                             "chat_template_kwargs": {"reasoning_effort": "low"}}) == {
        "enable_thinking": False}
    r = _post(client, "chat", "reasoning_effort", "extreme")
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"


def test_several_prompts_are_one_choice_each_as_openai_numbers_them(client):
    prompts = ["a b c", "the cat", "x y"]
    singles = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 4,
                                                    "temperature": 0}).json() for p in prompts]
    r = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 4,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert [c["text"] for c in got["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert got["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert got["usage"]["completion_tokens"] == sum(s["usage"]["completion_tokens"]
                                                    for s in singles)
    ids = client.post("/tokenize", json={"content": "a b c"}).json()["tokens"]
    r = client.post("/v1/completions", json={"prompt": [ids, ids], "max_tokens": 4,
                                             "temperature": 0, "stream": True})
    texts = {0: "", 1: ""}
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            import json
            for c in json.loads(line[6:])["choices"]:
                texts[c["index"]] += c["text"]
    assert texts[0] == texts[1] != ""
    r = client.post("/v1/completions", json={"prompt": ["a"] * 65, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
