"""Tokenizers: llama.cpp's own test vectors (tests/data/tokenizer-tests), and behaviour on
tiny vocabularies built in the test (special-token partition, byte fallback, merges, errors)."""
import time

import pytest

from pathlib import Path

from pyggml.errors import TokenizerError
from pyggml.llm import TokenAttr, Tokenizer

VECTORS = Path(__file__).resolve().parent / "data" / "tokenizer-tests"
SEP = "\n__ggml_vocab_test__\n"


def _load_vectors(name: str):
    """(texts, expected ids) of ggml-vocab-NAME.gguf.inp/.out (one text per .out line)."""
    texts = (VECTORS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEP)
    lines = (VECTORS / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()                 # the file's final newline
    if len(texts) == len(lines) + 1 and texts[-1] == "":
        texts.pop()                 # the text after the final separator
    assert len(texts) == len(lines), (name, len(texts), len(lines))
    return texts, [[int(x) for x in line.split()] for line in lines]


@pytest.fixture(scope="module", params=["llama-spm", "phi-3", "gpt-2"])
def vocab_vectors(request):
    name = request.param
    return name, Tokenizer.from_gguf(VECTORS / f"ggml-vocab-{name}.gguf"), *_load_vectors(name)


def test_llama_cpp_vectors(vocab_vectors):
    name, tok, texts, expected = vocab_vectors
    assert len(texts) >= 40
    failures = []
    for text, ids in zip(texts, expected):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != ids:
            failures.append((text, ids, got))
    assert not failures, f"{name}: {len(failures)}/{len(texts)} cases differ, first: {failures[0]}"


def test_vectors_round_trip(vocab_vectors):
    name, tok, texts, _ = vocab_vectors
    for text in texts:
        ids = tok.encode(text, add_special=False)
        if tok.is_spm:      # the space prefix is part of the first piece; detokenize drops it
            assert tok.decode(ids) == text
        else:               # gpt-2 cleans " ?" etc. on detokenize, as llama.cpp does
            assert b"".join(tok.token_to_piece(i) for i in ids) == text.encode()


def test_vectors_bos_and_metadata(vocab_vectors):
    name, tok, texts, expected = vocab_vectors
    if name == "gpt-2":
        assert (tok.model, tok.pre, tok.add_bos, tok.bos_id, tok.eos_id) == (
            "gpt2", "gpt-2", False, 50256, 50256)
        assert tok.eog_ids == {50256}
        assert tok.encode("Hello") == tok.encode("Hello", add_special=False)
        assert tok.encode("<|endoftext|>", parse_special=True) == [50256]
    else:
        assert tok.model == "llama" and tok.add_bos and tok.bos_id == 1
        assert tok.encode("Hello") == [1] + tok.encode("Hello", add_special=False)
        assert tok.encode("") == [1] and tok.encode("", add_special=False) == []
    if name == "phi-3":         # <|end|> is found by text: EOT and end of generation
        end = tok.text_to_id("<|end|>")
        assert tok.eot_id == end and tok.is_eog(end) and tok.is_eog(tok.eos_id)


def test_vectors_encode_speed(vocab_vectors):
    """A few KB of text in milliseconds (a generous bound; typical is ~20 ms cold)."""
    name, tok, texts, _ = vocab_vectors
    text = "\n".join(texts) * 4
    fresh = Tokenizer.from_gguf(VECTORS / f"ggml-vocab-{name}.gguf")    # empty caches
    t0 = time.perf_counter()
    ids = fresh.encode(text, parse_special=True)
    elapsed = time.perf_counter() - t0
    assert len(text.encode()) > 3000 and len(ids) > 500
    assert elapsed < 0.5, f"{name}: {len(text)} characters took {elapsed:.3f} s"


# ---------------------------------------------------------------------------------------------
# tiny vocabularies


def _spm_kv(tokens, scores=None, types=None, **extra):
    kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": list(tokens),
          "tokenizer.ggml.scores": scores or [0.0] * len(tokens),
          "tokenizer.ggml.token_type": types or [1] * len(tokens)}
    kv.update(extra)
    return kv


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _tiny_spm(**extra):
    """ids: 0 <unk>, 1 <s>, 2 </s>, 3.. byte tokens, then pieces with scores."""
    pieces = {"▁": -1.0, "ab": -2.0, "bc": -1.5, "abc": -3.0, "▁a": -2.5, "<ctl>": 0.0,
              "<ud>": 0.0, "xA": 0.0, "ABC": 0.0}
    tokens = ["<unk>", "<s>", "</s>"] + BYTES + list(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + list(pieces.values())
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    types[tokens.index("<ctl>")] = 3
    for t in ("<ud>", "xA", "ABC"):
        types[tokens.index(t)] = 4
    return Tokenizer.from_metadata(_spm_kv(tokens, scores, types, **extra))


def test_spm_merges_by_score_and_byte_fallback():
    tok = _tiny_spm()
    ids = tok.encode("abc", add_special=False)
    # "▁abc": bigrams ▁a (-2.5), ab (-2.0), bc (-1.5): bc merges first, then nothing joins ▁a+bc
    assert [tok.token_text(i) for i in ids] == ["▁a", "bc"]
    ids = tok.encode("é", add_special=False)        # not in vocab: one byte token per UTF-8 byte
    assert [tok.token_text(i) for i in ids] == ["▁", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "é"
    assert tok.token_to_piece(ids[1]) == b"\xc3"
    assert tok.encode("x") == [1] + tok.encode("x", add_special=False)


def test_spm_space_prefix_after_every_special_token():
    tok = _tiny_spm()
    ctl, s = tok.text_to_id("<ctl>"), tok.text_to_id("▁")
    ids = tok.encode("a<ctl>a", add_special=False, parse_special=True)
    assert ids == [tok.text_to_id("▁a"), ctl, tok.text_to_id("▁a")]
    no_prefix = _tiny_spm(**{"tokenizer.ggml.add_space_prefix": False})
    ids = no_prefix.encode(" a", add_special=False)
    assert ids == [tok.text_to_id("▁a")]
    assert s is not None


def test_partition_control_only_when_parsing_special():
    tok = _tiny_spm()
    ctl, ud = tok.text_to_id("<ctl>"), tok.text_to_id("<ud>")
    assert ctl in tok.encode("<ctl>", parse_special=True)
    assert ctl not in tok.encode("<ctl>", parse_special=False)
    assert ud in tok.encode("<ud>", parse_special=False)       # USER_DEFINED: always
    # with a space prefix, SPM also puts a space after every special token (llama.cpp does)
    assert tok.decode(tok.encode("q<ctl>q", parse_special=True)) == " q q"
    tok = _tiny_spm(**{"tokenizer.ggml.add_space_prefix": False})
    assert tok.decode(tok.encode("q<ctl>q", parse_special=True)) == "qq"
    assert tok.decode(tok.encode("q<ctl>q", parse_special=True), special=True) == "<s>q<ctl>q"
    assert tok.decode(tok.encode("q<ud>q")) == "q<ud>q"


def test_partition_longest_token_first():
    """llama.cpp cuts the longest special token out first, anywhere in the text: in "xABC" the
    3-character ABC wins over the 2-character xA that starts earlier."""
    tok = _tiny_spm(**{"tokenizer.ggml.add_space_prefix": False})
    ids = tok.encode("xABC", add_special=False)
    assert ids[-1] == tok.text_to_id("ABC")
    assert tok.text_to_id("xA") not in ids


def test_rstrip_for_phi3_named_models():
    kv = {"general.name": "Phi3 mini"}
    tok = _tiny_spm(**kv)
    ctl = tok.text_to_id("<ctl>")
    assert tok.token_attr(ctl) & TokenAttr.RSTRIP
    plain = _tiny_spm()
    assert (tok.encode("<ctl>  a", parse_special=True)
            == plain.encode("<ctl>a", parse_special=True))


def _tiny_bpe(pre="gpt-2", **extra):
    # byte-level: "Ġ" is the space, so " ab" is "Ġab"
    tokens = ["a", "b", "c", "Ġ", "ab", "Ġab", "abc", "<|eos|>", "1", "2", "3", "12", "123"]
    merges = ["a b", "Ġ ab", "ab c", "1 2", "12 3"]
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
          "tokenizer.ggml.token_type": [1] * 7 + [3] + [1] * 5,
          "tokenizer.ggml.eos_token_id": 7, "tokenizer.ggml.bos_token_id": 7}
    kv.update(extra)
    return Tokenizer.from_metadata(kv)


def test_bpe_merges_by_rank_and_pretokenizers():
    tok = _tiny_bpe()
    assert [tok.token_text(i) for i in tok.encode("abc ab")] == ["abc", "Ġab"]
    assert tok.encode("<|eos|>", parse_special=True) == [7]
    assert tok.is_eog(7) and not tok.add_bos
    assert tok.pretokenize("I'm 123 abc!!") == ["I", "'m", " 123", " abc", "!!"]
    llama3 = _tiny_bpe("llama-bpe")
    assert llama3.add_bos and llama3.encode("ab") == [7, 4]
    assert llama3.pretokenize("12345 x") == ["123", "45", " x"]
    assert _tiny_bpe("qwen2").pretokenize("123") == ["1", "2", "3"]
    assert _tiny_bpe("smollm").pretokenize(" 12ab") == [" ", "1", "2", "ab"]
    assert _tiny_bpe("default").pretokenize("ab,12345") == ["ab", ",", "123", "45"]
    assert [tok.token_text(i) for i in _tiny_bpe("qwen2").encode("123")] == ["1", "2", "3"]


def test_decode_rejects_bad_ids():
    tok = _tiny_bpe()
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([0, 99])
    with pytest.raises(TokenizerError):
        tok.token_to_piece(-1)


@pytest.mark.parametrize("change, key", [
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": ["a", "b", "a"]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": ["a", 5]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.scores": [0.0]}, "tokenizer.ggml.scores"),
    ({"tokenizer.ggml.scores": ["x", "y", "z"]}, "tokenizer.ggml.scores"),
    ({"tokenizer.ggml.token_type": [1.5, 1.0, 1.0]}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "tokenizer.ggml.add_bos_token"),
    ({"tokenizer.ggml.bos_token_id": -3}, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.scores": [0.0],      # default bos 1 is
      "tokenizer.ggml.token_type": [1]}, "tokenizer.ggml.bos_token_id"),   # out of range
])
def test_metadata_errors_name_the_key(change, key):
    kv = _spm_kv(["a", "b", "c"])
    for k, v in change.items():
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = v
    with pytest.raises(TokenizerError, match=key.replace(".", r"\.")):
        Tokenizer.from_metadata(kv)


def test_bpe_errors_name_the_key():
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.merges"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.pre"):
        _tiny_bpe("no-such-pre")


def test_spm_missing_byte_token():
    tok = Tokenizer.from_metadata(_spm_kv(["<unk>", "<s>", "</s>", "▁"]))
    with pytest.raises(TokenizerError, match="0x61"):
        tok.encode("a")


def test_from_gguf_rejects_non_gguf(tmp_path):
    from pyggml.errors import GGUFError
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"definitely not a GGUF file" * 4)
    with pytest.raises(GGUFError):
        Tokenizer.from_gguf(bad)
