"""`pyggml.Llama`, llama-cpp-python's class (pyggml/llm/compat.py): its constructor keywords
honoured, harmless or refused by name (never ignored), its call shapes, a session seed, and
`from_pretrained` against the local mock hub (tests/support/fake_hub.py); `LLM(chat_template=)`
and `embedding=True`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml
from pyggml.errors import ArgumentTypeError, ChatTemplateError
from pyggml.llm.compat import UnsupportedKeywordError
from pyggml.llm.runtime import LLM
from support.fake_hub import FakeHub

PROMPT = "a b c d"


@pytest.fixture(scope="module")
def path(tiny_models):
    return str(tiny_models.get("llama").path)


def test_defaults_and_shapes(path):
    with pyggml.Llama(path, n_threads=1, verbose=False, use_mmap=False, use_mlock=True,
                      no_perf=True, embedding=True) as llm:
        assert llm.n_ctx == 512 and llm.n_ctx() == 512          # llama-cpp-python's default
        assert llm.n_vocab() == llm.hparams.n_vocab and llm.n_embd() == llm.hparams.n_embd
        out = llm(PROMPT, None, 6, 0.0)             # positional: suffix, max_tokens, temperature
        assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] <= 6
        same = llm.create_completion(prompt=PROMPT, max_tokens=6, temperature=0.0)
        assert same["choices"][0]["text"] == out["choices"][0]["text"]
        assert llm(PROMPT, max_tokens=2, model="m")["model"] == "m"
        e = llm.create_embedding(["x y", "z"])
        assert [d["index"] for d in e["data"]] == [0, 1] and e["usage"]["prompt_tokens"] > 0
        v = llm.embed("x y")
        assert len(v) == llm.hparams.n_embd
        assert llm.token_eos() == llm.tokenizer.eos_id
        assert llm.tokenize(b"a", False, False) == llm.tokenizer.encode(b"a", add_special=False)


def test_session_seed_makes_the_session_reproducible(path):
    runs = []
    for _ in range(2):
        with pyggml.Llama(path, n_threads=1, verbose=False, seed=1234) as llm:
            runs.append([llm(PROMPT, max_tokens=8, temperature=30.0, top_k=0, min_p=0.0,
                             top_p=1.0)["choices"][0]["text"] for _ in range(3)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


@pytest.mark.parametrize("kw,names", [
    ({"lora_base": "a.gguf", "lora_path": "b.gguf"}, ["lora_base", "lora_path alone"]),
    ({"rope_freq_base": 1e6, "kv_overrides": {"a": 1}}, ["rope_freq_base", "kv_overrides"]),
    ({"tensor_split": [0.5, 0.5]}, ["tensor_split"]),
    ({"chat_format": "functionary"}, ["chat_format", "chatml"]),
    ({"pooling_type": 2}, ["pooling_type"]),
    ({"split_mode": 2}, ["split_mode"]), ({"vocab_only": True}, ["vocab_only"])])
def test_unhonourable_keywords_are_refused_by_name(path, kw, names):
    with pytest.raises(UnsupportedKeywordError) as e:
        pyggml.Llama(path, verbose=False, **kw)
    assert all(n in str(e.value) for n in names)


def test_unknown_keywords_are_refused(path):
    with pytest.raises(ArgumentTypeError, match="n_gqa"):
        pyggml.Llama(path, verbose=False, n_gqa=8)
    with pyggml.Llama(path, verbose=False, n_threads=1) as llm, \
            pytest.raises(UnsupportedKeywordError, match="suffix"):
        llm(PROMPT, "tail")


def test_chat_template_and_chat_format(path):
    msgs = [{"role": "user", "content": "hi"}]
    with LLM(path, n_ctx=256, n_threads=1, chat_template="chatml") as m:
        assert "<|im_start|>" in m.get_chat_template().render(msgs, add_generation_prompt=True)
        assert m.create_chat_completion(msgs, max_tokens=2)["object"] == "chat.completion"
    with pyggml.Llama(path, verbose=False, n_threads=1, chat_format="llama-2") as llm:
        assert "[INST]" in llm.get_chat_template().render(msgs, add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="no-such-template"):
        LLM(path, n_ctx=256, n_threads=1, chat_template="no-such-template")
    with pytest.raises(ArgumentTypeError, match="embedding"):
        LLM(path, n_ctx=256, n_threads=1, embedding="yes")


def test_from_pretrained_through_the_mock_hub(path, tmp_path):
    gguf = Path(path).read_bytes()
    repos = {"me/tiny-GGUF": {"tiny-Q8_0.gguf": gguf, "tiny-Q4_K_M.gguf": gguf + b"\0" * 32,
                              "README.md": b"hi"}}
    code = ("import sys, pyggml\n"
            "llm = pyggml.Llama.from_pretrained('me/tiny-GGUF', sys.argv[1], verbose=False, "
            "n_threads=1)\n"
            "print(llm.model_path)\n"
            "print(llm('a b', max_tokens=2, temperature=0)['object'])\n")
    with FakeHub(repos) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path),
                    "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
                    "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
        run = lambda pat: subprocess.run([sys.executable, "-c", code, pat], env=env,  # noqa
                                         capture_output=True, text=True, timeout=120)
        r = run("*q8_0.gguf")
        assert r.returncode == 0, r.stderr
        p, kind = r.stdout.split()
        assert Path(p).read_bytes() == gguf and kind == "text_completion"
        assert hub.downloads("tiny-Q8_0.gguf") == 1 and hub.downloads("tiny-Q4_K_M.gguf") == 0
        r = run("*.gguf")
        assert r.returncode != 0 and "2 files match" in r.stderr
        r = run("*Q2_K*")
        assert r.returncode != 0 and "no file matching" in r.stderr
