"""Completions in llama-cpp-python's shapes (pyggml/llm/completion.py) and prompt prefix reuse
(LLM.reuse_prefix, KVCache.can_keep_prefix).

Stop strings and UTF-8 holding-back are tested on `Generation` (pyggml/llm/generate.py) with a
scripted tokenizer and a real Context whose model is scripted (one token forced per step), so
every split of a character or stop string is exercised exactly; the API shapes and prefix
reuse run SmolLM2-135M-Instruct (make setup) and tiny models."""
import numpy as np
import pytest

from pyggml.errors import ChatTemplateError, ModelError
from pyggml.llm.completion import sampling_params
from pyggml.llm.context import Context
from pyggml.llm.generate import Generation, decode_step
from pyggml.models_pypi import ensure_smollm2
from pyggml.llm.runtime import LLM


class _Tok:
    def __init__(self, pieces):
        self.pieces = pieces

    def token_to_piece(self, t, special=False):
        return self.pieces[t]

    def is_eog(self, t):
        return t == 0


class _ScriptedContext(Context):
    """A real Context (its sequence API, epochs, LoRA bookkeeping and decode loop, over a real
    KV cache's cells) whose model is a script: a ubatch's wanted rows are the logits the test
    set in `next_logits`. Only the graph evaluation is replaced, so the calls a Generation
    makes are the real ones and this stand-in cannot drift from them."""

    def __init__(self, n_vocab: int, n_ctx: int = 256):
        from types import SimpleNamespace
        from pyggml.llm.hparams import HParams
        from pyggml.llm.kv_cache import KVCache
        hp = HParams(arch="llama", n_layer=1, n_embd=8, n_ff=[16], n_head=[2], n_head_kv=[1],
                     head_dim_k=4, head_dim_v=4, n_rot=4, n_vocab=n_vocab, n_ctx_train=n_ctx,
                     rms_eps=1e-6, rope_base=1e4, rope_base_swa=1e4, rope_freq_scale=1.0,
                     rope_neox=False, sliding_window=0)
        opts = SimpleNamespace(n_ctx=n_ctx, n_ubatch=512, n_seq_max=1, logits_all=False)
        run = SimpleNamespace(model=SimpleNamespace(hparams=hp), kv=KVCache(hp, n_ctx),
                              opts=opts, scheds=lambda: (), loras=(), close=lambda: None)
        super().__init__(run, None, "scripted")
        self.next_logits = np.zeros(n_vocab, np.float32)

    def _decode_ubatch(self, toks, pos, sids, want, output, lora):
        self.kv.place(pos, sids, atomic=False)
        return np.tile(self.next_logits, (int(np.count_nonzero(want)), 1))


def _run(pieces: list[bytes], stop, max_tokens=100, eog_at_end=True):
    """Force tokens 1..n (then EOG) through a Generation, one step each with the logits the
    decode of its input would give; return (chunks, generation)."""
    vocab = [b""] + pieces
    gen = Generation(_Tok(vocab), [1], max_tokens, sampling_params(temperature=0), stop)
    ctx = _ScriptedContext(len(vocab))
    gen.start(ctx)
    chunks = []
    for i in range(1, len(vocab) + 1):
        gen.next_input()
        ctx.next_logits = np.zeros(len(vocab), np.float32)
        ctx.next_logits[i if i < len(vocab) else 0] = 1.0
        chunks.append(gen.advance(decode_step(ctx, [gen])[gen.seq_id]))
        if gen.done:
            break
    # the sequence holds what was evaluated: the prompt and every sampled token but at most
    # the last (not evaluated when a stop string or max_tokens ended the generation)
    held = ctx.seq_tokens(gen.seq_id)
    assert held == ([1] + gen.tokens)[:len(held)] and len(held) >= len(gen.tokens)
    return chunks, gen


def test_stop_string_cuts_before_the_stop_and_chunks_never_end_inside_one():
    pieces = [b"Hel", b"lo wo", b"rld", b"! ST", b"O", b"P here"]
    chunks, gen = _run(pieces, ["STOP", "xyz"])
    assert "".join(chunks) == "Hello world! " and gen.finish_reason == "stop"
    text = ""
    for c in chunks[:-1]:
        text += c
        for s in ("STOP", "xyz"):       # no chunk ends with the start of a stop string
            assert not any(text.endswith(s[:k]) for k in range(1, len(s)))
    assert len(gen.tokens) == 6          # the token that completed the stop is counted


def test_a_stop_spanning_tokens_and_a_false_start_is_released():
    chunks, gen = _run([b"a S", b"T", b"x b", b"ST", b"OP"], ["STOP"])
    assert chunks[:4] == ["a ", "", "STx b", ""]   # "S", "ST" held; released once "x" follows
    assert "".join(chunks) == "a STx b" and gen.finish_reason == "stop"


def test_utf8_split_across_tokens_never_reaches_a_chunk():
    e = "é✓".encode()                              # 2 + 3 bytes
    chunks, gen = _run([e[:1], e[1:3], e[3:4], e[4:], b"!"], [])
    assert chunks[:5] == ["", "é", "", "✓", "!"] and "".join(chunks) == "é✓!"
    assert gen.finish_reason == "stop"             # EOG after the pieces


def test_length_finish_flushes_held_back_text_and_an_unfinished_character():
    chunks, gen = _run([b"ab", b" S", "é".encode()[:1]], ["STOP"], max_tokens=3)
    assert "".join(chunks) == "ab S\ufffd" and gen.finish_reason == "length"
    assert len(gen.tokens) == 3


@pytest.fixture(scope="module")
def smol():
    with LLM(ensure_smollm2(), n_ctx=1024, n_threads=2) as m:
        yield m


PROMPT = "The three primary colours are"


def test_completion_shape_usage_and_equals_generate(smol):
    r = smol.create_completion(PROMPT, max_tokens=12, temperature=0)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    ch = r["choices"][0]
    ref = [t.id for t in smol.generate(PROMPT, 12, temperature=0)]
    assert ch["text"] == smol.detokenize(ref)
    n_prompt = len(smol.tokenize(PROMPT))
    assert r["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(ref),
                          "total_tokens": n_prompt + len(ref)}
    assert ch["finish_reason"] == ("length" if len(ref) == 12 else "stop")
    chunks = list(smol.create_completion(PROMPT, max_tokens=12, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == ch["text"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == ch["finish_reason"]
    assert chunks[-1]["usage"] == r["usage"]
    e = smol.create_completion(PROMPT, max_tokens=12, temperature=0, echo=True)
    assert e["choices"][0]["text"] == PROMPT + ch["text"]


def test_stop_strings_on_the_model(smol):
    full = smol.create_completion(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = full[:full.index(stop)]
    r = smol.create_completion(PROMPT, max_tokens=24, temperature=0, stop=[stop, "\x00never"])
    assert r["choices"][0]["text"] == cut and r["choices"][0]["finish_reason"] == "stop"
    streamed = list(smol.create_completion(PROMPT, max_tokens=24, temperature=0, stop=stop,
                                           stream=True))
    assert "".join(c["choices"][0]["text"] for c in streamed) == cut


def test_logprobs(smol):
    r = smol.create_completion(PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == r["usage"]["completion_tokens"] == 4
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    for tok, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert p <= 0 and len(top) <= 3 and max(top.values()) == pytest.approx(p)  # greedy: best


def test_chat_completion_shapes(smol):
    msgs = [{"role": "user", "content": "Say hello."}]
    r = smol.create_chat_completion(msgs, max_tokens=8, temperature=0)
    assert r["object"] == "chat.completion"
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    chunks = list(smol.create_chat_completion(msgs, max_tokens=8, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == msg["content"]
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["usage"] == r["usage"]
    with pytest.raises(ChatTemplateError, match="messages must be a non-empty list"):
        smol.create_chat_completion([])


def test_context_limits_are_clear_errors(smol):
    with pytest.raises(ModelError, match=r"exceeds the context of 1024 tokens"):
        smol.create_completion(PROMPT, max_tokens=5000)
    with pytest.raises(ModelError, match="stop must be a string or a list of strings"):
        smol.create_completion(PROMPT, stop=3)


def test_prefix_reuse_gives_the_tokens_of_a_fresh_run(smol):
    a = "Here is a list of fruits: apple, banana, cherry. Here is a list of colours:"
    b = "Here is a list of fruits: apple, banana, cherry. Here is a list of animals: dog,"
    smol.reset()
    fresh = smol.create_completion(b, max_tokens=10, temperature=0)["choices"][0]["text"]
    smol.reset()
    smol.create_completion(a, max_tokens=5, temperature=0)
    before = smol.stats.n_prompt_reused
    reused = smol.create_completion(b, max_tokens=10, temperature=0)["choices"][0]["text"]
    n_common = next(i for i, (x, y) in enumerate(zip(smol.tokenize(a), smol.tokenize(b)))
                    if x != y)
    assert smol.stats.n_prompt_reused - before == n_common
    assert reused == fresh
    assert smol.seq_tokens(0)[:len(smol.tokenize(b))] == smol.tokenize(b)
    # the same prompt again: all but its last two tokens kept, the same text
    before = smol.stats.n_prompt_reused
    again = smol.create_completion(b, max_tokens=10, temperature=0)["choices"][0]["text"]
    assert smol.stats.n_prompt_reused - before == len(smol.tokenize(b)) - 2
    assert again == fresh


def test_sliding_window_cells_that_fell_out_are_not_reused(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="f32", n_layer=2, sliding_window=8)
    with LLM(tm.path, n_ctx=1024, n_threads=1, n_ubatch=16) as m:   # own 256-cell SWA space
        assert "swa" in m.kv.spaces
        ids = list(range(5, 45))                          # 40 tokens, window 8
        m.reset()
        m.eval(ids[:20]); m.eval(ids[20:])                # the window space dropped old cells
        assert not m.kv.can_keep_prefix(0, 10)            # would need positions 3.. again
        assert m.kv.can_keep_prefix(0, 39)
        assert m.reuse_prefix(ids[:11], 0) == 0           # refused: evaluated from scratch
        n = m.reuse_prefix(ids[:30] + [7, 8, 9], 0)
        assert n == 0 and m.seq_tokens(0) == []
        m.eval(ids)
        n = m.reuse_prefix(ids + [9, 9], 0)               # longer prompt: all 40 kept
        assert n == 40
        got = m.eval([9, 9], 0)
        m.reset()
        want = m.eval(ids + [9, 9], 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with LLM(tm.path, n_ctx=1024, n_threads=1, n_ubatch=16, swa_full=True) as m:
        m.eval(ids[:20]); m.eval(ids[20:])
        assert m.kv.can_keep_prefix(0, 10)                # all cells kept: reusable


def test_gemma_chats_with_a_builtin_template():
    """Gemma 3 270M has no template in its GGUF: the built-in 'gemma' one; one BOS."""
    with LLM(None, n_ctx=512, n_threads=2) as m:
        with pytest.raises(ChatTemplateError, match="--chat-template"):
            m.create_chat_completion([{"role": "user", "content": "Hi"}])
        from pyggml.llm.completion import chat_prompt_ids
        ids = chat_prompt_ids(m, m.get_chat_template("gemma"), [{"role": "user", "content": "Hi"}])
        assert ids[0] == m.tokenizer.bos_id and ids[1] != m.tokenizer.bos_id
        assert m.detokenize(ids, special=True).startswith("<bos><start_of_turn>user\nHi")
        # the 270M model is a base model (no instruction tuning): only the mechanics are checked
        r = m.create_chat_completion([{"role": "user", "content": "Hi"}], chat_template="gemma",
                                     max_tokens=8, temperature=0)
        assert r["usage"]["prompt_tokens"] == len(ids)
        assert r["usage"]["completion_tokens"] == 8 or r["choices"][0]["finish_reason"] == "stop"


def test_qwen_coder_answers_when_fetched():
    """Qwen2.5-Coder-1.5B-Instruct (1.1 GB) is fetched only by `make models`."""
    from pyggml.models_pypi import QWEN_CODER_1_5B, cached_path
    path = cached_path(QWEN_CODER_1_5B)
    if path is None:
        pytest.skip("Qwen2.5-Coder-1.5B-Instruct is not fetched (make models)")
    with LLM(path, n_ctx=512, n_threads=2) as m:
        r = m.create_chat_completion([{"role": "user", "content": "What is 2+3? Reply with the "
                                       "number only."}], max_tokens=4, temperature=0)
        assert "5" in r["choices"][0]["message"]["content"]
