"""llama-server's native endpoints (pyggml/server/llamacpp_api.py): POST /completion and POST
/infill answer as llama-server does — the same prompt layout (FIM tokens, extra files, mixed
string/id prompts), the same greedy tokens, stop_type and stopping_word as llama-server's own
answers on Qwen2.5-Coder-0.5B (tests/data/llamacpp_native_refs.json, made by
tools/make_llamacpp_native_refs.py); several prompts, streaming, and the 400s."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_qwen_coder_draft, ensure_smollm2
from pyggml.server import make_server, start_in_thread

REFS = json.loads((Path(__file__).parent / "data" / "llamacpp_native_refs.json").read_text())


@pytest.fixture(scope="module")
def qwen():
    llm = LLM(str(ensure_qwen_coder_draft()), n_ctx=REFS["n_ctx"], n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "qwen"))
    yield f"http://127.0.0.1:{rs.port}"
    rs.stop()
    llm.close()


@pytest.mark.parametrize("case", REFS["cases"], ids=lambda c: f"{c['path']}-{c['request'].get('prompt', '')!s:.12}")
def test_answers_as_llama_server(qwen, case):
    r = httpx.post(qwen + case["path"], timeout=120,
                   json=dict(case["request"], temperature=0, return_tokens=True))
    assert r.status_code == 200, r.text
    got, want = r.json(), case["answer"]
    assert got["prompt"] == want["prompt"]
    assert got["tokens_evaluated"] == want["tokens_evaluated"]
    assert got["tokens"] == want["tokens"]
    assert got["content"] == want["content"]
    assert (got["stop_type"], got["stopping_word"]) == (want["stop_type"], want["stopping_word"])
    assert got["stop"] is True and got["tokens_predicted"] == want["tokens_predicted"]


def test_several_prompts_and_a_stream_give_the_single_answers(qwen):
    one = [c for c in REFS["cases"] if c["path"] == "/completion"][:2]
    r = httpx.post(qwen + "/completion", timeout=120, json={
        "prompt": [c["request"]["prompt"] for c in one], "n_predict": 24, "temperature": 0,
        "stop": ["4."]})
    assert r.status_code == 200 and isinstance(r.json(), list)
    for k, (c, got) in enumerate(zip(one, r.json())):
        assert got["index"] == k
        assert c["answer"]["content"].startswith(got["content"].split("4.")[0][:20])
    single = httpx.post(qwen + "/completion", timeout=120, json={
        "prompt": one[0]["request"]["prompt"], "n_predict": 24, "temperature": 0,
        "stop": ["4."]}).json()
    assert r.json()[0]["content"] == single["content"]
    events = []
    with httpx.stream("POST", qwen + "/completion", timeout=120, json={
            "prompt": one[0]["request"]["prompt"], "n_predict": 24, "temperature": 0,
            "stop": ["4."], "stream": True}) as s:
        for line in s.iter_lines():
            if line:
                assert line.startswith("data: ") and line != "data: [DONE]"
                events.append(json.loads(line[6:]))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == single["content"]
    assert events[-1]["stop_type"] == single["stop_type"]


@pytest.mark.parametrize("path,body,param", [
    ("/completion", {"prompt": ""}, "prompt"),
    ("/completion", {"prompt": [1, "x", 10 ** 9]}, "prompt"),
    ("/completion", {"prompt": "x", "n_predict": "8"}, "n_predict"),
    ("/completion", {"prompt": "x", "n_probs": 3}, "n_probs"),
    ("/completion", {"prompt": "x", "top_n_sigma": 1.5}, "top_n_sigma"),
    ("/infill", {"input_prefix": "a"}, "input_suffix"),
    ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"name": 1}]},
     "input_extra"),
])
def test_bad_requests_name_their_field(qwen, path, body, param):
    r = httpx.post(qwen + path, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_infill_without_fim_tokens_says_so():
    llm = LLM(str(ensure_smollm2()), n_ctx=256, n_threads=1)
    rs = start_in_thread(make_server(llm, 1, "smol"))
    try:
        r = httpx.post(f"http://127.0.0.1:{rs.port}/infill", timeout=60,
                       json={"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501 and "fim_pre" in r.json()["error"]["message"], r.text
    finally:
        rs.stop()
        llm.close()


def test_slots_show_a_busy_slot_and_refuse_what_is_not_implemented(qwen):
    import threading
    done = threading.Event()

    def long_request():
        httpx.post(qwen + "/completion", timeout=120, json={
            "prompt": "def fibonacci(n):", "n_predict": 200, "temperature": 0,
            "ignore_eos": True})
        done.set()
    t = threading.Thread(target=long_request)
    t.start()
    try:
        seen = None
        for _ in range(400):
            slots = httpx.get(qwen + "/slots", timeout=10).json()
            busy = [s for s in slots if s["is_processing"]]
            if busy and busy[0]["next_token"]["n_decoded"] > 0:
                seen = busy[0]
                break
            if done.wait(0.02):
                break
        assert seen is not None, "no busy slot was seen while a request ran"
        assert len(slots) == 2 and seen["params"]["n_predict"] == 200
        assert seen["next_token"]["n_remain"] == 200 - seen["next_token"]["n_decoded"]
        assert "prompt" not in json.dumps(seen)        # no request text is shown
    finally:
        t.join(120)
    r = httpx.post(qwen + "/slots/0?action=save", json={"filename": "x.bin"}, timeout=10)
    assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]


def test_a_saved_slot_restored_continues_as_the_original(tmp_path):
    """llama-server's slot actions: save a slot after a completion, erase it, restore it into
    the other slot; a request continuing that conversation reuses the restored cells and gives
    the same greedy text as on the original server."""
    llm = LLM(str(ensure_smollm2()), n_ctx=512, n_threads=2, n_seq_max=2)
    server = make_server(llm, 2, "smol")
    server.slot_save_path = str(tmp_path)
    rs = start_in_thread(server)
    base = f"http://127.0.0.1:{rs.port}"
    try:
        first = {"prompt": "The history of the city of Rome begins", "n_predict": 12,
                 "temperature": 0}
        out = httpx.post(base + "/completion", json=first, timeout=60).json()
        follow = {"prompt": first["prompt"] + out["content"] + " In the end,", "n_predict": 8,
                  "temperature": 0}
        held = [i for i in (0, 1) if llm.seq_tokens(i)]
        assert len(held) == 1
        r = httpx.post(f"{base}/slots/{held[0]}?action=save", json={"filename": "rome.npz"})
        assert r.status_code == 200 and r.json()["n_saved"] == len(llm.seq_tokens(held[0]))
        assert (tmp_path / "rome.npz").stat().st_size == r.json()["n_written"]
        want = httpx.post(base + "/completion", json=follow, timeout=60).json()
        for i in (0, 1):
            r = httpx.post(f"{base}/slots/{i}?action=erase")
            assert r.status_code == 200
        assert not llm.seq_tokens(0) and not llm.seq_tokens(1)
        r = httpx.post(f"{base}/slots/1?action=restore", json={"filename": "rome.npz"})
        assert r.status_code == 200 and r.json()["n_restored"] > 0
        got = httpx.post(base + "/completion", json=follow, timeout=60).json()
        assert got["content"] == want["content"]
        assert got["timings"]["prompt_n"] < got["tokens_evaluated"]    # the restored cells
        for bad, code in ((("save", {"filename": "../x"}), 400),
                          (("restore", {"filename": "absent.npz"}), 404),
                          (("fly", {}), 400)):
            r = httpx.post(f"{base}/slots/0?action={bad[0]}", json=bad[1])
            assert r.status_code == code, r.text
        r = httpx.post(f"{base}/slots/7?action=erase")
        assert r.status_code == 404
    finally:
        rs.stop()
        llm.close()
