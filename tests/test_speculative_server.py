"""Speculative decoding in `pyggml serve` (pyggml/server/engine.py): several slots draft, their
drafted tokens share the step's one decode_batch, and every stream is the request's plain
greedy output (compared on the scalar kernel path: see tests/test_speculative.py)."""
import json
import threading

import httpx
import numpy as np
import pytest

from pyggml import _native
from pyggml.llm.runtime import LLM
from pyggml.llm.speculative import DraftModel, PromptLookup
from pyggml.server import make_server, start_in_thread
from support.http_server import metrics

TIMEOUT_S = 120
PROMPTS = ["the capital of france is paris. the capital of france is",
           "hello world! hello world! hello", "def main(): return 0 def main():",
           "the sea, the mountains and the stars. the sea, the"]


@pytest.mark.parametrize("kind", ["lookup", "draft-model"])
def test_slots_draft_in_one_batch_and_equal_plain(tiny_models, scalar_path, kind):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    other = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=2)
    with LLM(tm.path, n_ctx=512, n_threads=1) as ref:
        plain = [ref.create_completion(p, max_tokens=24, temperature=0)["choices"][0]["text"]
                 for p in PROMPTS]
    draft = PromptLookup(n_max=4) if kind == "lookup" else DraftModel(other.path, n_max=4,
                                                                      n_threads=1)
    llm = LLM(tm.path, n_ctx=4 * 128, n_threads=1, n_seq_max=4, draft_model=draft)
    rs = start_in_thread(make_server(llm, 4, "m"))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        got = [None] * len(PROMPTS)
        start = threading.Barrier(len(PROMPTS), timeout=TIMEOUT_S)

        def stream(i):
            parts = []
            with httpx.Client(timeout=TIMEOUT_S) as c:
                start.wait()
                body = {"prompt": PROMPTS[i], "max_tokens": 24, "temperature": 0,
                        "stream": True}
                with c.stream("POST", f"{base}/v1/completions", json=body) as resp:
                    for line in resp.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            parts.append(json.loads(line[6:])["choices"][0]["text"])
            got[i] = "".join(parts)
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        m = metrics(base)
        assert got == plain
        assert m["pyggml_draft_tokens_total"] > 0
        assert 0 <= m["pyggml_draft_accepted_tokens_total"] <= m["pyggml_draft_tokens_total"]
        assert m["pyggml_decode_steps_multi_seq_total"] > 0
        with llm.lock:              # no cell of a rejected draft in any slot's sequence
            for sid in range(4):
                n = len(llm.seq_tokens(sid))
                bit = np.uint64(1 << sid)
                sp = llm.kv.spaces["full"]
                assert np.sort(sp.pos[(sp.seqs & bit) != 0]).tolist() == list(range(n))
    finally:
        rs.stop()
        llm.close()


def test_draft_model_evaluates_the_prompt_with_the_models_chunks(tiny_models, scalar_path):
    """`serve -md`: each prompt chunk goes to the draft model in the step that evaluates it for
    the model, so when admission completes the draft's cache holds the whole prompt and the
    first round evaluates only the last token in the draft (not the prompt)."""
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    other = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=2)
    prompt = " ".join(PROMPTS * 6)
    with LLM(tm.path, n_ctx=1024, n_threads=1) as ref:
        ids = ref.tokenize(prompt)
        plain = ref.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert len(ids) > 2 * 128, "the prompt must take several chunks"
    llm = LLM(tm.path, n_ctx=1024, n_threads=1, n_seq_max=2,
              draft_model=DraftModel(other.path, n_max=4, n_threads=1))
    draft = llm.speculator.draft.llm
    model_steps, draft_steps, at_first_round = [], [], []
    orig_model, orig_draft = llm.context.decode, draft.decode_batch

    def model_spy(batch, *a, **k):
        model_steps.append([(sid, len(t)) for t, sid in batch])
        return orig_model(batch, *a, **k)

    def draft_spy(batch, *a, **k):
        draft_steps.append([(sid, len(t)) for t, sid in batch])
        return orig_draft(batch, *a, **k)
    llm.context.decode, draft.decode_batch = model_spy, draft_spy
    # a tiny step target: the prompt goes in chunks of MIN_PROMPT_CHUNK tokens
    server = make_server(llm, 2, "m", step_target_s=1e-6)
    engine = server.engine
    orig_drafts = engine._drafts

    def drafts_spy(gen_slots):
        for s in gen_slots:
            if len(s.job.gen.tokens) == 1:     # a job's first round
                at_first_round.append((s.seq_id, draft.seq_tokens(s.seq_id),
                                       llm.seq_tokens(s.seq_id), len(model_steps),
                                       len(draft_steps)))
        return orig_drafts(gen_slots)
    engine._drafts = drafts_spy
    rs = start_in_thread(server)
    try:
        r = httpx.post(f"http://127.0.0.1:{rs.port}/v1/completions", timeout=TIMEOUT_S,
                       json={"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        # a second prompt sharing the first's beginning: its slot keeps that prefix, and the
        # draft evaluates the rest with the model's chunks too
        prompt2 = " ".join(PROMPTS * 4) + " and something else"
        ids2 = llm.tokenize(prompt2)
        r2 = httpx.post(f"http://127.0.0.1:{rs.port}/v1/completions", timeout=TIMEOUT_S,
                        json={"prompt": prompt2, "max_tokens": 4, "temperature": 0})
        assert r2.status_code == 200, r2.text
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        rs.stop()
        llm.context.decode, draft.decode_batch = orig_model, orig_draft
        llm.close()
    assert r.json()["choices"][0]["text"] == plain
    (sid, draft_held, model_held, n_model_steps, n_draft_steps), second = at_first_round
    assert second[1] == second[2] == ids2, "the second prompt is not in the draft's cache"
    assert model_held[:len(ids)] == ids and len(model_held) == len(ids)
    assert draft_held == ids, "the draft's cache lacks the prompt before the first round"
    # the draft's prompt went in the model's chunks, one draft batch per prompt step
    prompt_chunks = [n for step in model_steps[:n_model_steps] for s, n in step if s == sid]
    assert len(prompt_chunks) >= 3 and sum(prompt_chunks) == len(ids)
    assert [n for step in draft_steps[:n_draft_steps] for s, n in step] == prompt_chunks
    # the first round's first draft evaluation is the last sampled token alone
    assert draft_steps[n_draft_steps] == [(sid, 1)]


def test_served_plan_includes_the_draft_model(tiny_models):
    """GET /v1/pyggml/plan of a server decoding with a draft model lists the draft's memory
    (its weights as `pyggml mem` plans them, its KV cache for the served n_ctx); with prompt
    lookup there is no draft model to list."""
    from pyggml.planning.memory import plan_memory
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    other = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=2)
    for draft in (DraftModel(other.path, n_max=4, n_threads=1), PromptLookup(n_max=4)):
        llm = LLM(tm.path, n_ctx=256, n_threads=1, n_seq_max=2, draft_model=draft)
        rs = start_in_thread(make_server(llm, 2, "m"))
        try:
            p = httpx.get(f"http://127.0.0.1:{rs.port}/v1/pyggml/plan", timeout=TIMEOUT_S).json()
        finally:
            rs.stop()
            llm.close()
        plan = p["mem"]["plan"]
        if isinstance(draft, PromptLookup):
            assert "draft" not in plan
            continue
        alone = plan_memory(other.path, n_ctx=256, n_seq_max=2, swa_full=True)
        d = plan["draft"]
        assert d["model"] == alone.model and d["n_ctx"] == 256
        assert [x["weights"] for x in d["devices"]] == [x.weights for x in alone.devices]
        assert sum(x["bytes"] for x in d["kv_layers"]) == alone.kv_bytes > 0
