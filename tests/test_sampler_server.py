"""llama-server's sampler fields (typical_p, mirostat, mirostat_tau/eta, xtc_*, dry_*, min_keep)
are honoured by the server: a request gives the text LLM.create_completion gives with the same
keywords; bad values are a 400 naming the field. Starlette's TestClient over a tiny model."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from pyggml.llm.runtime import LLM
from pyggml.server import make_server

HOT = {"temperature": 40.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 11}


@pytest.fixture(scope="module")
def served(tiny_models):
    path = tiny_models.get("llama").path
    llm = LLM(path, n_ctx=256, n_threads=1, n_seq_max=1)
    server = make_server(llm, 1, "tiny", chat_template="chatml")
    with TestClient(server.app, base_url="http://127.0.0.1") as c, \
            LLM(path, n_ctx=256, n_threads=1) as ref:
        yield c, ref
    server.engine.stop()
    llm.close()


@pytest.mark.parametrize("fields", [
    {"typical_p": 0.5, **HOT},
    {"mirostat": 2, "mirostat_tau": 2.0, "mirostat_eta": 0.5, **HOT},
    {"mirostat": 1, **HOT},
    {"xtc_probability": 0.9, "xtc_threshold": 0.01, **HOT},
    {"dry_multiplier": 3.0, "dry_allowed_length": 1, "dry_base": 2.0,
     "dry_sequence_breakers": ["x"], "temperature": 0},
    {"dry_multiplier": 3.0, "dry_penalty_last_n": 8, "min_keep": 3, "typical_p": 0.2, **HOT},
])
def test_fields_are_honoured(served, fields):
    c, ref = served
    r = c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 10,
                                        "ignore_eos": True, **fields})
    assert r.status_code == 200, r.text
    want = ref.create_completion("a b c", max_tokens=10, stop_at_eog=False, **fields)
    assert r.json()["choices"][0]["text"] == want["choices"][0]["text"]


@pytest.mark.parametrize("field,value", [
    ("typical_p", 1.5), ("mirostat", 3), ("xtc_probability", -1), ("dry_allowed_length", -1),
    ("dry_sequence_breakers", "x"), ("dry_sequence_breakers", [""]), ("min_keep", 1.5),
    ("mirostat_tau", "a")])
def test_bad_values_name_the_field(served, field, value):
    c, _ = served
    r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


@pytest.fixture(scope="module")
def served2(tiny_models):
    llm = LLM(tiny_models.get("llama").path, n_ctx=512, n_threads=1, n_seq_max=2)
    server = make_server(llm, 2, "tiny", chat_template="chatml")
    with TestClient(server.app, base_url="http://127.0.0.1") as c:
        yield c
    server.engine.stop()
    llm.close()


def _texts_of_stream(r, key):
    import json
    out = {}
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                out[ch["index"]] = out.get(ch["index"], "") + (key(ch) or "")
    return out


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_n_choices_are_single_requests_with_seed_plus_i(served2, endpoint):
    c = served2
    chat = "chat" in endpoint
    base = ({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "a b c"})
    base.update(max_tokens=6, ignore_eos=True, **HOT)
    text = (lambda ch: ch["message"]["content"]) if chat else (lambda ch: ch["text"])
    singles = [text(c.post(endpoint, json=dict(base, seed=11 + i)).json()["choices"][0])
               for i in range(2)]
    r = c.post(endpoint, json=dict(base, n=2))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [ch["index"] for ch in out["choices"]] == [0, 1]
    assert [text(ch) for ch in out["choices"]] == singles and singles[0] != singles[1]
    assert out["usage"]["completion_tokens"] == 12
    with c.stream("POST", endpoint, json=dict(base, n=2, stream=True)) as r:
        got = _texts_of_stream(r, (lambda ch: ch["delta"].get("content")) if chat
                               else (lambda ch: ch["text"]))
    assert got == {0: singles[0], 1: singles[1]}
    r = c.post(endpoint, json=dict(base, n=3))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
