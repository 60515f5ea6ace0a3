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
