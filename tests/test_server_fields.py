"""Request fields the server does not implement are refused with a 400 naming them (never ignored);
the penalties and logit_bias are honoured (llama.cpp's sampler, pyggml/llm/sampler.py); base64
embeddings. Starlette's TestClient over a tiny model: no sockets, no SmolLM2."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from starlette.testclient import TestClient

from pyggml.llm.runtime import LLM
from pyggml.server import make_server
from pyggml.server.app import NOT_SUPPORTED


@pytest.fixture(scope="module")
def client(tiny_models):
    llm = LLM(tiny_models.get("llama"), n_ctx=256, n_threads=1, n_seq_max=1)
    server = make_server(llm, 1, "tiny", chat_template="chatml")
    with TestClient(server.app, base_url="http://127.0.0.1") as c:
        yield c, llm
    server.engine.stop()
    llm.close()


def _complete(c, **kw):
    return c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 8,
                                           "temperature": 0, **kw})


@pytest.mark.parametrize("field,value", [
    ("suffix", "tail"), ("best_of", 2), ("top_n_sigma", 1.5), ("tfs_z", 0.9), ("store", True),
    ("dynatemp_range", 0.5), ("samplers", ["top_k"]),
    ("service_tier", "flex"), ("prediction", {"type": "content", "content": "x"}),
    ("penalize_nl", True)])
def test_unimplemented_fields_are_refused_by_name(client, field, value):
    c, _ = client
    r = _complete(c, **{field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and f"not supported: {field}" in err["message"]
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_off_values_of_unimplemented_fields_are_accepted(client):
    c, _ = client
    off = {k: v[-1] for k, v in NOT_SUPPORTED.items()}
    r = _complete(c, **off)
    assert r.status_code == 200, r.text


def test_penalties_and_logit_bias_are_honoured(client):
    c, llm = client
    out = _complete(c, logprobs=1).json()["choices"][0]
    plain = out["text"]
    ids = llm.tokenize(out["logprobs"]["tokens"][0], add_special=False)
    first = ids[0] if len(ids) == 1 else None
    # a ban on the first greedy token changes the text
    if first is not None:
        r = _complete(c, logit_bias={str(first): -100})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] != plain
        r = c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 8, "temperature": 0,
                                            "logit_bias": [[first, False]]})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] != plain
    # a strong push on one token: greedy picks it every time
    tok = llm.tokenize(" b", add_special=False)[-1]
    r = _complete(c, logit_bias={str(tok): 100}, max_tokens=3)
    assert r.json()["choices"][0]["text"] == " b" * 3
    # a push just big enough to win once: the penalties (count * 2 + 2 after one) stop a repeat
    logits = None
    for bias in (8, 16, 32):
        r2 = _complete(c, logit_bias={str(tok): bias}, max_tokens=3)
        if r2.json()["choices"][0]["text"] == " b" * 3:
            logits = bias
            break
    assert logits is not None
    r2 = _complete(c, logit_bias={str(tok): logits}, frequency_penalty=2.0,
                   presence_penalty=2.0, max_tokens=3, repeat_penalty=100.0)
    assert r2.status_code == 200, r2.text
    assert r2.json()["choices"][0]["text"] != llm.detokenize([tok] * 3)
    assert c.post("/v1/completions", json={"prompt": "x", "presence_penalty": 3}).status_code \
        == 400
    r = _complete(c, logit_bias={"abc": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = _complete(c, logit_bias={str(llm.hparams.n_vocab): 1})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]


def test_base64_embeddings_equal_the_floats(client):
    c, _ = client
    f = c.post("/v1/embeddings", json={"input": "hello"}).json()["data"][0]["embedding"]
    b = c.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"})
    assert b.status_code == 200, b.text
    v = np.frombuffer(base64.b64decode(b.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(v, np.asarray(f, dtype=np.float32), rtol=0, atol=0)
    r = c.post("/v1/embeddings", json={"input": "hello", "dimensions": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
