"""Reranking as llama-server's /v1/rerank (pyggml/server/rerank.py, rank pooling in
pyggml/llm/embedding.py): on two random-weight Qwen3-Reranker-style models (written by
tools/make_rerank_refs.py, byte-identical to the files the references were made on) the scores
equal llama-server's (tests/data/rerank_refs.json) within how far llama.cpp's own two attention
paths (flash attention on / off) are apart plus 0.002, the results come in the same order
(where llama.cpp's scores are further apart than that), and the prompt tokens (usage) are
exactly llama-server's — which checks the prompt layout (the rerank template; BOS / SEP without
one). The server's answers in Jina's and TEI's shapes, and its refusals: a model that is no
reranker (the 400 says why), no documents, top_n out of range, an unknown field; `serve
--reranking` with such a model is one line."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from pyggml.errors import ModelError
from pyggml.llm.embedding import rank_head, rank_prompt, rerank
from pyggml.llm.runtime import LLM
from pyggml.server import make_server, start_in_thread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_rerank_refs as R  # noqa: E402

REFS = json.loads((ROOT / "tests" / "data" / "rerank_refs.json").read_text())
NAMES = sorted(R.MODELS)


def _scores(answer) -> dict:
    return {r["index"]: r["relevance_score"] for r in answer["results"]}


def _tolerance(name) -> float:
    """llama.cpp's flash attention on vs off, the largest score difference, plus 0.002."""
    m = REFS["models"][name]
    spread = max(abs(a[i] - b[i]) for on, off in zip(m["answers"], m["answers_fa_off"])
                 for a, b in [(_scores(on), _scores(off))] for i in a)
    return spread + 0.002


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerank")
    out = {}
    for name in NAMES:
        p = R.write_model(name, d / f"{name}.gguf")
        assert hashlib.sha256(p.read_bytes()).hexdigest() == REFS["models"][name]["sha256"], (
            f"{name}: the generator no longer writes the file the references were made on; "
            f"rerun tools/make_rerank_refs.py")
        out[name] = p
    return out


def check_answer(name, case, want, got_results, tol):
    """got_results ([{index, relevance_score}], ours) against llama-server's answer `want`."""
    ref = _scores(want)
    assert len(got_results) == len(want["results"])
    got = {r["index"]: r["relevance_score"] for r in got_results}
    assert set(got) <= set(range(len(case["documents"])))
    for i, s in ref.items():
        assert abs(got[i] - s) <= tol, f"{name}: document {i}: {got[i]:.5f} vs {s:.5f}"
    # the order: ours is by our scores; where llama.cpp's neighbours are clearly apart, the same
    order = [r["index"] for r in got_results]
    assert all(got_results[k]["relevance_score"] >= got_results[k + 1]["relevance_score"]
               for k in range(len(order) - 1))
    for k, (a, b) in enumerate(zip(want["results"], want["results"][1:])):
        if a["relevance_score"] - b["relevance_score"] > 2 * tol:
            assert order.index(a["index"]) < order.index(b["index"]) if b["index"] in order \
                else a["index"] in order


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fa", [True, False], ids=["fa1", "fa0"])
def test_scores_equal_llama_servers(paths, name, fa):
    tol = _tolerance(name)
    key = "answers" if fa else "answers_fa_off"
    with LLM(paths[name], n_ctx=2048, n_threads=2, flash_attn=fa) as m:
        head = rank_head(m)
        assert head.labels == ("yes", "no") and head.softmax
        assert (head.template is not None) == (name == "qwen3-rerank")
        for case, want in zip(REFS["cases"], REFS["models"][name][key]):
            got = rerank(m, case["query"], case["documents"], case.get("top_n"))
            check_answer(name, case, want, got, tol)
            n = sum(len(rank_prompt(m, head, case["query"], d)) for d in case["documents"])
            assert n == want["usage"]["prompt_tokens"]
        assert m.seq_tokens(0) == []            # the cells are freed


def test_prompt_layout_without_a_template(paths):
    with LLM(paths["qwen3-rerank-plain"], n_ctx=256, n_threads=1) as m:
        head = rank_head(m)
        q, d = m.tokenize("w1 w2", add_special=False), m.tokenize("w3", add_special=False)
        assert rank_prompt(m, head, "w1 w2", "w3") == [1] + q + [R.SEP] + d     # BOS, SEP
    with LLM(paths["qwen3-rerank"], n_ctx=256, n_threads=1) as m:
        p = rank_prompt(m, rank_head(m), "w1", "w2")
        start, end = m.tokenizer.text_to_id("<|im_start|>"), m.tokenizer.text_to_id("<|im_end|>")
        assert p[0] == start and p.count(end) == 2 and p[0] != 1      # specials parsed, no BOS


@pytest.fixture(scope="module")
def server(paths):
    llm = LLM(paths["qwen3-rerank"], n_ctx=2048, n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "reranker"))
    yield f"http://127.0.0.1:{rs.port}"
    rs.stop()
    llm.close()


def test_server_answers_as_llama_server(server):
    name, tol = "qwen3-rerank", _tolerance("qwen3-rerank")
    for k, (case, want) in enumerate(zip(REFS["cases"], REFS["models"][name]["answers"])):
        path = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")[k % 4]
        r = httpx.post(server + path, json=case, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "list" and got["model"] == "reranker"
        assert got["usage"] == want["usage"]
        check_answer(name, case, want, got["results"], tol)
        assert set(got["results"][0]) == {"index", "relevance_score"}


def test_server_shapes(server):
    case = REFS["cases"][0]
    r = httpx.post(server + "/v1/rerank", timeout=120, json={
        "model": "mine", "query": case["query"], "documents": case["documents"][:3],
        "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["model"] == "mine" and len(j["results"]) == 2
    for x in j["results"]:
        assert x["document"] == {"text": case["documents"][x["index"]]}
    # TEI's request (texts): the bare list with "score" (and the text with return_text)
    t = httpx.post(server + "/rerank", timeout=120, json={
        "query": case["query"], "texts": case["documents"][:3], "return_text": True}).json()
    assert isinstance(t, list) and len(t) == 3
    assert [x["index"] for x in t[:2]] == [x["index"] for x in j["results"]]
    assert all(x["text"] == case["documents"][x["index"]] for x in t)
    np.testing.assert_allclose([x["score"] for x in t[:2]],
                               [x["relevance_score"] for x in j["results"]], atol=1e-6)


@pytest.mark.parametrize("body,param,text", [
    ({"query": "w1", "documents": []}, "documents", "non-empty list of strings"),
    ({"query": "w1"}, "documents", "non-empty list of strings"),
    ({"query": "w1", "documents": ["w2", 3]}, "documents", "non-empty list of strings"),
    ({"documents": ["w2"]}, "query", "'query' is required"),
    ({"query": ["w1"], "documents": ["w2"]}, "query", "must be a string"),
    ({"query": "w1", "documents": ["w2"], "top_n": 0}, "top_n", "integer >= 1"),
    ({"query": "w1", "documents": ["w2"], "top_n": -3}, "top_n", "integer >= 1"),
    ({"query": "w1", "documents": ["w2"], "top_n": "2"}, "top_n", "integer >= 1"),
    ({"query": "w1", "documents": ["w2"], "top_n": True}, "top_n", "integer >= 1"),
    ({"query": "w1", "documents": ["w2"], "rank_fields": ["a"]}, "rank_fields",
     "not supported: rank_fields"),
    ({"query": "w1", "documents": ["w2"], "raw_scores": True}, "raw_scores",
     "not supported: raw_scores"),
    ({"query": "w1", "documents": ["w2"] * 257}, "documents", "at most 256"),
    ({"query": "w1", "documents": ["w2 " * 3000]}, "documents", "'documents'[0]"),
    ({"query": "w1", "documents": ["w2"], "return_documents": 1}, "return_documents",
     "boolean"),
])
def test_server_refusals(server, body, param, text):
    r = httpx.post(server + "/v1/rerank", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and text in err["message"]


def test_top_n_beyond_the_documents_gives_them_all(server):
    r = httpx.post(server + "/v1/rerank", json={"query": "w1", "documents": ["w2", "w3"],
                                                "top_n": 50}, timeout=60)
    assert r.status_code == 200 and len(r.json()["results"]) == 2


def test_not_a_reranker(tiny_models, capsys):
    """The API, the server (a 400 naming why) and serve --reranking (one line, exit 1)."""
    from pyggml.cli import main
    from support.serve_process import free_port
    path = str(tiny_models.get(arch="llama", weight_type="q8_0").path)
    with LLM(path, n_ctx=256, n_threads=1) as m:
        with pytest.raises(ModelError, match=r"is not a reranker: it has no llama.pooling_type"):
            rerank(m, "a", ["b"])
        with pytest.raises(ModelError, match="is not a reranker"):
            m.embed(["a"], pooling="rank")
        rs = start_in_thread(make_server(m, 1, "plain"))
        try:
            r = httpx.post(f"http://127.0.0.1:{rs.port}/v1/rerank",
                           json={"query": "a", "documents": ["b"]}, timeout=60)
        finally:
            rs.stop()
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith(
            "reranking needs a reranker model: ") and "pooling_type" in r.json()["error"]["message"]
    assert main(["serve", "-m", path, "--reranking", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a reranker" in err[0] and "rank" in err[0], err
