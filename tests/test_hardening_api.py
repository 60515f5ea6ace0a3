"""Hardening of the Python API (issue 15, engine side): adversarial probes that must end in a typed
PyggmlError naming the bad value (never a raw TypeError / AttributeError / ctypes error, never a
hang), use after close, sharing one LLM between threads, lossless streamed text, prompts that are
not valid UTF-8, context limits and llama.cpp's -1 conventions, memory refused before allocating.

The use-after-close, two-thread and stress scenarios run in a subprocess (a hang or a crash fails
one test), and again with the AddressSanitizer build of libpyggml (build/native-asan, built by
`make test` before pytest) preloaded into that subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyggml.errors import (ArgumentTypeError, ClosedError, ConfigError, ContextOverflowError,
                           GGUFError, InsufficientMemoryError, InvalidArgumentError, ModelError,
                           PyggmlError, TokenizerError)
from pyggml.llm import Tokenizer
from pyggml.llm.runtime import LLM
from pyggml.llm.sampler import Sampler, SamplingParams
from pyggml.llm.textstream import TextStream

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "tests" / "support" / "hardening_scenarios.py"
ASAN_LIB = REPO / "build" / "native-asan" / "libpyggml.so"
PROMPT = "the quick brown fox"

pytestmark = pytest.mark.timeout(60, method="thread")


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return tiny_models.get()        # gemma3, q8_0, n_ctx_train 256, SPM vocab with byte tokens


@pytest.fixture(scope="module")
def llm(tiny):
    with LLM(tiny.path, n_ctx=64, n_seq_max=2, n_threads=2) as m:
        yield m


# ---- adversarial probes ---------------------------------------------------------------------

def _ctor(**kw):
    return lambda path: LLM(path, **{"n_ctx": 32, **kw})


CTOR_PROBES = [
    # (id, call(path), error class, text the message must contain)
    ("model_path int", lambda p: LLM(123), ArgumentTypeError, "123"),
    ("model_path missing", lambda p: LLM("/nonexistent/x.gguf"), GGUFError, "/nonexistent/x.gguf"),
    ("n_ctx str", _ctor(n_ctx="4096"), ArgumentTypeError, "'4096'"),
    ("n_ctx negative", _ctor(n_ctx=-5), ModelError, "-5"),
    ("n_ctx bool", _ctor(n_ctx=True), ArgumentTypeError, "True"),
    ("n_ctx float", _ctor(n_ctx=2.5), ArgumentTypeError, "2.5"),
    ("n_ctx None", _ctor(n_ctx=None), ArgumentTypeError, "None"),
    ("n_batch 0", _ctor(n_batch=0), ModelError, "n_batch must be a positive integer, got 0"),
    ("n_ubatch list", _ctor(n_ubatch=[8]), ArgumentTypeError, "[8]"),
    ("n_threads 300", _ctor(n_threads=300), InvalidArgumentError, "1..256 (the CPU thread "
     "pool's limit), got 300"),
    ("n_threads -2", _ctor(n_threads=-2), InvalidArgumentError, "-2"),
    ("n_threads str", _ctor(n_threads="4"), InvalidArgumentError, "'4'"),
    ("n_threads_batch 300", _ctor(n_threads_batch=300), InvalidArgumentError, "300"),
    ("n_seq_max 0", _ctor(n_seq_max=0), ModelError, "n_seq_max must be a positive integer, got 0"),
    ("n_seq_max 65", _ctor(n_seq_max=65), ModelError, "65"),
    ("type_k q4_k", _ctor(type_k="q4_k"), ModelError, "Q4_K"),
    ("type_k float", _ctor(type_k=1.5), ArgumentTypeError, "1.5"),
    ("type_v per layer wrong count", _ctor(type_v=["f16"]), ModelError, "1 types for 2 layers"),
    ("flash_attn 'off'", _ctor(flash_attn="off"), ArgumentTypeError, "'off'"),
    ("logits_all int", _ctor(logits_all=1), ArgumentTypeError, "logits_all"),
    ("swa_full None", _ctor(swa_full=None), ArgumentTypeError, "swa_full"),
    ("n_gpu_layers str", _ctor(n_gpu_layers="all"), ArgumentTypeError, "'all'"),
    ("n_gpu_layers -3", _ctor(n_gpu_layers=-3), ConfigError, "-3"),
    ("offload dict", _ctor(offload={}), ArgumentTypeError, "offload"),
    ("config int", lambda p: LLM(p, config=42), ArgumentTypeError, "42"),
    ("progress str", _ctor(progress="yes"), ArgumentTypeError, "'yes'"),
    # (a quantized V without flash attention runs now: llama.cpp's KV types, both paths)
    ("KV type llama.cpp does not offer", _ctor(type_k="q2_k"), ModelError,
     "type_k must be one of f16"),
    ("KV cache past memory", _ctor(n_ctx=2 ** 36), InsufficientMemoryError, "n_ctx=68719476736"),
]


@pytest.mark.parametrize("call,cls,text", [c[1:] for c in CTOR_PROBES],
                         ids=[c[0] for c in CTOR_PROBES])
def test_constructor_probes(tiny, call, cls, text):
    with pytest.raises(cls) as ei:
        call(tiny.path)
    assert isinstance(ei.value, PyggmlError)
    assert text in str(ei.value), str(ei.value)


METHOD_PROBES = [
    ("eval str", lambda m: m.eval("hello"), ArgumentTypeError, "tokenize"),
    ("eval float token", lambda m: m.eval([1, 1.5]), ArgumentTypeError, "tokens[1]"),
    ("eval str token", lambda m: m.eval(["a"]), ArgumentTypeError, "'a'"),
    ("eval None", lambda m: m.eval(None), ArgumentTypeError, "None"),
    ("eval int", lambda m: m.eval(5), ArgumentTypeError, "int 5"),
    ("eval empty", lambda m: m.eval([]), ModelError, "empty prompt"),
    ("eval id too big", lambda m: m.eval([10 ** 9]), ModelError, "1000000000"),
    ("eval id negative", lambda m: m.eval([-1]), ModelError, "[-1]"),
    ("eval seq str", lambda m: m.eval([1], seq_id="0"), ArgumentTypeError, "'0'"),
    ("eval seq out of range", lambda m: m.eval([1], seq_id=5), ModelError, "got 5"),
    ("eval seq bool", lambda m: m.eval([1], seq_id=True), ArgumentTypeError, "True"),
    ("eval past n_ctx", lambda m: m.eval(list(range(3, 70))), ContextOverflowError, "67 new"),
    ("decode_batch str", lambda m: m.decode_batch("x"), ArgumentTypeError, "'x'"),
    ("decode_batch empty", lambda m: m.decode_batch([]), ArgumentTypeError, "non-empty"),
    ("decode_batch not pairs", lambda m: m.decode_batch([[1, 2, 3]]), ArgumentTypeError,
     "seqs[0]"),
    ("decode_batch seq twice", lambda m: m.decode_batch([([1], 0), ([2], 0)]), ModelError,
     "[0, 0]"),
    ("generate prompt int", lambda m: m.generate(123), ArgumentTypeError, "123"),
    ("generate prompt None", lambda m: m.generate(None), ArgumentTypeError, "None"),
    ("generate max_tokens str", lambda m: m.generate("hi", "5"), ArgumentTypeError, "'5'"),
    ("generate max_tokens -2", lambda m: m.generate("hi", -2), ModelError, "-2"),
    ("generate max_tokens float", lambda m: m.generate("hi", 2.0), ArgumentTypeError, "2.0"),
    ("generate temperature str", lambda m: m.generate("hi", temperature="hot"),
     ArgumentTypeError, "'hot'"),
    ("generate top_k float", lambda m: m.generate("hi", top_k=2.5), ArgumentTypeError, "2.5"),
    ("generate top_p nan", lambda m: m.generate("hi", top_p=float("nan")), ModelError, "nan"),
    ("generate min_p None", lambda m: m.generate("hi", min_p=None), ArgumentTypeError, "None"),
    ("generate repeat_penalty 0", lambda m: m.generate("hi", repeat_penalty=0.0), ModelError,
     "repeat_penalty must be > 0, got 0.0"),
    ("generate seed -2", lambda m: m.generate("hi", seed=-2), ModelError, "-2"),
    ("generate seed 2^33", lambda m: m.generate("hi", seed=2 ** 33), ModelError, "8589934592"),
    ("generate seed str", lambda m: m.generate("hi", seed="x"), ArgumentTypeError, "'x'"),
    ("generate seq_id 7", lambda m: m.generate("hi", seq_id=7), ModelError, "got 7"),
    ("generate stop_at_eog str", lambda m: m.generate("hi", stop_at_eog="no"),
     ArgumentTypeError, "'no'"),
    ("generate prompt past n_ctx", lambda m: m.generate(list(range(3, 80))),
     ContextOverflowError, "77 tokens"),
    ("reset seq 9", lambda m: m.reset(9), ModelError, "got 9"),
    ("reset seq str", lambda m: m.reset("0"), ArgumentTypeError, "'0'"),
    ("tokenize int", lambda m: m.tokenize(123), ArgumentTypeError, "123"),
    ("tokenize list", lambda m: m.tokenize(["a"]), ArgumentTypeError, "list"),
    ("tokenize add_special str", lambda m: m.tokenize("a", add_special="yes"),
     ArgumentTypeError, "'yes'"),
    ("detokenize float", lambda m: m.detokenize([1.5]), ArgumentTypeError, "1.5"),
    ("detokenize id too big", lambda m: m.detokenize([10 ** 9]), TokenizerError, "1000000000"),
    ("detokenize str", lambda m: m.detokenize("abc"), ArgumentTypeError, "'abc'"),
]


@pytest.mark.parametrize("call,cls,text", [c[1:] for c in METHOD_PROBES],
                         ids=[c[0] for c in METHOD_PROBES])
def test_method_probes_leave_the_model_usable(llm, call, cls, text):
    llm.reset()
    before = llm.eval(llm.tokenize(PROMPT))
    llm.reset()
    with pytest.raises(cls) as ei:
        call(llm)
    assert isinstance(ei.value, PyggmlError)
    assert text in str(ei.value), str(ei.value)
    llm.reset()
    assert np.array_equal(llm.eval(llm.tokenize(PROMPT)), before)


def test_kv_memory_refused_with_what_fits(tiny, monkeypatch):
    """The n_ctx the message proposes fits the (pretended) available memory; one step more
    does not. Nothing is allocated when refusing."""
    import re

    import pyggml.backend.cpu as cpu
    monkeypatch.setattr(cpu, "available_host_memory", lambda: 8 << 20)      # 8 MiB
    with pytest.raises(InsufficientMemoryError) as ei:
        LLM(tiny.path, n_ctx=1 << 20, n_threads=1)
    msg = str(ei.value)
    assert "n_ctx=1048576 needs" in msg and "GiB" in msg and "available" in msg, msg
    fit = int(re.search(r"n_ctx=(\d+) would fit", msg).group(1))
    assert fit >= 256
    LLM(tiny.path, n_ctx=fit, n_threads=1).close()
    with pytest.raises(InsufficientMemoryError):
        LLM(tiny.path, n_ctx=fit + 256, n_threads=1)


def test_host_buffer_past_memory_refused():
    import pyggml.backend.cpu as cpu
    with pytest.raises(InsufficientMemoryError, match=r"needs 1024\.00 GiB"):
        cpu.cpu_buffer_type().alloc_buffer(1 << 40)


# ---- context limits and llama.cpp's conventions ----------------------------------------------

def test_n_ctx_zero_is_the_trained_context_and_past_it_is_said(tiny):
    """The warning is one of llm.offload.warnings (the CLI prints them, one line each)."""
    with LLM(tiny.path, n_ctx=0, n_threads=1) as m:
        assert m.n_ctx == tiny.hparams.n_ctx_train == 256
        assert not any("trained" in w for w in m.offload.warnings)
    with LLM(tiny.path, n_ctx=512, n_threads=1) as m:
        assert any("n_ctx 512" in w and "trained for (256)" in w for w in m.offload.warnings)


def test_full_context_stops_generation_cleanly(tiny):
    """max_tokens=-1 runs until the cache is full: the last token has no cell to be evaluated in,
    so n_ctx - n_prompt + 1 tokens come out and the reason is 'context' (llama.cpp without
    context shift stops there too)."""
    with LLM(tiny.path, n_ctx=256, n_threads=2) as m:
        ids = m.tokenize(PROMPT)
        g = m.generate(ids, -1, temperature=0.0, stop_at_eog=False)
        toks = [t.id for t in g]
        assert g.finish_reason == m.last_finish_reason == "context"
        assert len(toks) == 256 - len(ids) + 1
        assert m.kv.n_used() == 256
        g2 = m.generate(ids, 3, temperature=0.0, stop_at_eog=False)   # usable again: a reset
        assert [t.id for t in g2] == toks[:3] and g2.finish_reason == "length"


def test_seed_minus_one_is_random_and_a_seed_reproduces():
    logits = np.random.default_rng(0).standard_normal(4000).astype(np.float32)

    def draws(seed):
        s = Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        return [s.sample(logits) for _ in range(30)]
    assert draws(42) == draws(42)
    assert draws(-1) != draws(-1)                   # 30 draws over 4000 ids: never equal
    assert draws(0xFFFFFFFF) != draws(0xFFFFFFFF)   # the default: random, as before


# ---- streamed text ---------------------------------------------------------------------------

def test_text_stream_decides_as_soon_as_possible():
    s = TextStream()
    assert [s.push(b) for b in (b"\xe4", b"\xbd", b"\xa0")] == ["", "", "\u4f60"]
    assert s.push(b"\xff") == "\ufffd"              # can never start a character: at once
    assert s.push(b"\xe4") == "" and s.pending == b"\xe4"
    assert s.push(b"a") == "\ufffda"                # not a continuation byte: decided now
    assert s.push(b"\xf0\x9f") == "" and s.flush() == "\ufffd" and s.pending == b""
    assert s.push(b"ok") == "ok" and s.flush() == ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=5), max_size=12))
def test_text_stream_equals_whole_decode(pieces):
    s = TextStream()
    text = "".join(s.push(p) for p in pieces) + s.flush()
    assert text == b"".join(pieces).decode("utf-8", "replace")


class _Script:
    """A stand-in Sampler that returns a fixed token sequence."""
    script: list[int] = []

    def __init__(self, params, tokenizer=None):
        self._it = iter(self.script)

    def accept(self, token):
        pass

    def sample(self, logits):
        return next(self._it)


@pytest.mark.parametrize("end", ["stop", "length", "context"])
def test_generation_flushes_unfinished_bytes_into_the_last_token(tiny, monkeypatch, end):
    import pyggml.llm.generate as generate
    with LLM(tiny.path, n_ctx=16, n_threads=1) as m:
        tk = m.tokenizer
        byte = {b: tk.text_to_id(f"<0x{b:02X}>") for b in (0xE4, 0xBD, 0xA0, 0xFF)}
        a = tk.encode("a", add_special=False)[0]
        script = [byte[0xE4], byte[0xBD], byte[0xA0], a, byte[0xFF], byte[0xE4]]
        prompt = m.tokenize(PROMPT)[:16 - len(script) + 1 if end == "context" else 4]
        _Script.script = script + [tk.eos_id] + [a] * 8
        monkeypatch.setattr(generate, "Sampler", _Script)
        n = {"stop": -1, "length": len(script), "context": -1}[end]
        g = m.generate(prompt, n, stop_at_eog=(end != "context"))
        out = list(g)
    assert g.finish_reason == end
    assert [t.id for t in out] == script
    assert [t.text for t in out] == ["", "", "\u4f60", "a", "\ufffd", "\ufffd"]


def test_sampled_text_is_never_lost(tiny):
    """Hot random sampling (the tied tiny model otherwise repeats itself) over a vocabulary that
    is half byte tokens: the streamed texts joined are the detokenized text, invalid bytes
    included."""
    texts = []
    with LLM(tiny.path, n_ctx=256, n_threads=2) as m:
        for seed in (1, 2, 3):
            g = m.generate(PROMPT, 60, temperature=40.0, top_k=0, top_p=1.0, min_p=0.0,
                           seed=seed, stop_at_eog=False)
            out = list(g)
            raw = b"".join(m.tokenizer.token_to_piece(t.id) for t in out)
            texts.append("".join(t.text for t in out))
            assert texts[-1] == raw.decode("utf-8", "replace")
    assert any("\ufffd" in t for t in texts)          # invalid sequences did come out


# ---- prompts that are not valid UTF-8 ---------------------------------------------------------

def _byte_level_bpe() -> Tokenizer:
    """gpt2-style vocabulary: every byte's character, plus 'ab' by one merge."""
    from pyggml.llm.tokenizer import _B2U
    tokens = list(_B2U) + ["ab", "<|eos|>"]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": [1] * 257 + [3],
        "tokenizer.ggml.eos_token_id": 257, "tokenizer.ggml.bos_token_id": 257})


def test_bpe_takes_bytes_as_llama_cpp():
    """llama.cpp (unicode_cpts_from_utf8): a byte that starts no well-formed sequence is one
    U+FFFD, decoding goes on at the next byte; lead + continuation bytes pass unchecked (an
    overlong NUL, an encoded surrogate)."""
    tok = _byte_level_bpe()

    def ids_of(raw: bytes):
        return [raw[i] for i in range(len(raw))]     # token i is byte i's character

    enc = lambda x: tok.encode(x, add_special=False)     # noqa: E731
    fffd = ids_of("\ufffd".encode())
    assert enc(b"ab") == enc("ab") == [256]
    assert enc(b"x\xffy") == ids_of(b"x") + fffd + ids_of(b"y")
    assert enc(b"\xe4\xbdx") == fffd + fffd + ids_of(b"x")          # one U+FFFD per byte
    assert enc(b"\xe4\xbd") == fffd + fffd                           # truncated at the end
    assert enc(b"\xc0\x80") == [0]                                   # overlong NUL -> U+0000
    assert enc(b"\xed\xa0\x80") == ids_of(b"\xed\xa0\x80")           # surrogate passes
    assert enc(b"\xf4\x90\x80\x80") == fffd * 4                      # > U+10FFFF
    assert enc("h\u00e9".encode()) == enc("h\u00e9")
    # str: surrogateescape'd bytes (sys.argv, os.fsdecode) are those bytes; other lone
    # surrogates their 3-byte form
    assert enc("x\udcffy") == enc(b"x\xffy")
    assert enc("\ud800") == enc(b"\xed\xa0\x80")
    assert tok.encode(b"a<|eos|>b", add_special=False, parse_special=True) == [97, 257, 98]
    with pytest.raises(ArgumentTypeError, match="int 5"):
        tok.encode(5)


INVALID_UTF8_REFS = json.loads((REPO / "tests" / "data" / "invalid_utf8_tokenize_refs.json")
                               .read_text(encoding="utf-8"))


@pytest.mark.parametrize("vocab", ["gemma3-spm", "gpt-2"])
def test_invalid_utf8_prompts_give_llama_cpp_ids(vocab):
    """llama.cpp's ids for prompts that are not UTF-8 (tools/make_invalid_utf8_refs.py)."""
    if vocab == "gpt-2":
        path = REPO / "tests" / "data" / "tokenizer-tests" / "ggml-vocab-gpt-2.gguf"
    else:
        from pyggml.models_default import ensure_default_model
        path = ensure_default_model()
    tok = Tokenizer.from_gguf(path)
    cases = INVALID_UTF8_REFS["cases_hex"]
    assert len(cases) >= 25
    bad = [(h, ref, got) for h, ref in zip(cases, INVALID_UTF8_REFS["ids"][vocab])
           if (got := tok.encode(bytes.fromhex(h), add_special=False)) != ref]
    assert not bad, f"{len(bad)}/{len(cases)} differ from llama.cpp, first: {bad[0]}"
    # the same bytes as a surrogateescape'd str (sys.argv) give the same ids
    for h in cases:
        raw = bytes.fromhex(h)
        assert (tok.encode(raw.decode("utf-8", "surrogateescape"), add_special=False)
                == tok.encode(raw, add_special=False))


def test_spm_keeps_every_byte(tiny):
    tok = Tokenizer.from_gguf(tiny.path)
    enc = lambda x: tok.encode(x, add_special=False)     # noqa: E731
    b = lambda v: tok.text_to_id(f"<0x{v:02X}>")         # noqa: E731
    assert b(0xFF) in enc(b"a\xffb")
    assert enc("a\udcffb") == enc(b"a\xffb")
    assert enc("\ud800") == [b(0xED), b(0xA0), b(0x80)]
    assert enc("caf\u00e9".encode()) == enc("caf\u00e9")
    assert tok.detokenize(enc(b"x\xff\xe4y")) == b"x\xff\xe4y"


# ---- lifetime and threads (subprocesses; again under AddressSanitizer) ------------------------

def _asan_env() -> dict | None:
    """Environment that preloads the ASan runtime the sanitizer build links (found with ldd)."""
    if not ASAN_LIB.is_file():
        return None
    out = subprocess.run(["ldd", str(ASAN_LIB)], capture_output=True, text=True).stdout
    runtime = [line.split("=>")[1].split()[0] for line in out.splitlines()
               if "libasan" in line and "=>" in line]
    if not runtime:
        return None
    env = dict(os.environ, PYGGML_LIB=str(ASAN_LIB), LD_PRELOAD=runtime[0],
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=99",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return env


def _scenario(name: str, model, env=None, seed: int = 0, timeout_s: float = 120):
    p = subprocess.run([sys.executable, str(SCENARIOS), name, str(model), str(seed)],
                       capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)
    tail = (p.stdout + p.stderr)[-3000:]
    assert "Sanitizer" not in p.stderr, tail
    assert p.returncode == 0, tail
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    return result


@pytest.mark.parametrize("name", ["use_after_close", "two_threads"])
def test_lifetime_and_two_threads(tiny, name):
    result = _scenario(name, tiny.path)
    if name == "two_threads":
        assert result["counts"]["correct"] >= 12


@pytest.mark.parametrize("name", ["use_after_close", "two_threads", "stress"])
def test_under_address_sanitizer(tiny, name):
    env = _asan_env()
    if env is None:
        pytest.skip(f"{ASAN_LIB} not built (make native-asan; `make test` builds it first)")
    out = subprocess.run([sys.executable, "-c", "from pyggml import _native; _native.version(); "
                          "print(_native._lib._name)"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "native-asan" in out.stdout, out.stdout + out.stderr[-2000:]
    _scenario(name, tiny.path, env=env, seed=2)        # stress: another seed than below


def test_stress_four_threads(tiny):
    """4 threads x 50 random calls on a shared and on per-thread LLMs: every result equals the
    single-threaded one or is a clear ClosedError / GeneratorInvalidatedError."""
    c = _scenario("stress", tiny.path, seed=1)["counts"]
    assert sum(c.values()) == 200
    assert c.get("generate-ok", 0) + c.get("resume-ok", 0) > 10, c
    assert c.get("eval-ok", 0) > 10, c


def test_closed_error_in_process(tiny):
    m = LLM(tiny.path, n_ctx=32, n_threads=1)
    g = m.generate(PROMPT, 4, temperature=0.0)
    m.close()
    with pytest.raises(ClosedError, match="closed"):
        next(g)
    with pytest.raises(ClosedError):
        m.eval([1])
    m.close()
