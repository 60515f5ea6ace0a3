"""Tokenizers built from GGUF metadata alone, giving the token ids llama.cpp gives.

Three vocabulary models, chosen by `tokenizer.ggml.model`:

- `llama`: SentencePiece-style BPE driven by token scores, `▁` (U+2581) as the space marker, an
  optional space prefix, byte fallback through `<0xXX>` tokens.
- `gpt2`: byte-level BPE driven by merge ranks, after the regex pre-tokenizer named by
  `tokenizer.ggml.pre`.
- `gemma4` (pre-tokenizer "gemma4"): BPE driven by merge ranks over raw UTF-8 symbols, spaces
  written as `▁` first (escape_whitespaces), words cut only at newline runs (a run that is a
  token is that token), byte fallback through `<0xXX>` tokens, BOS always added.

Before either runs, special tokens are cut out of the raw text (llama.cpp's
`tokenizer_st_partition`): CONTROL and UNKNOWN tokens only when `parse_special` is true,
USER_DEFINED tokens always. The reference is llama.cpp's `src/llama-vocab.cpp` and
`src/unicode.cpp`; docs/FORMATS.md §5 describes the algorithms.

Text is handled as Python `str`; a token text that is not valid UTF-8 is kept with
`surrogateescape`, so raw bytes round-trip.

Prompts may be `bytes` or `str`, valid UTF-8 or not, as llama.cpp takes any bytes
(`prompt_bytes`): a str becomes bytes first (U+DC80..U+DCFF, the `surrogateescape` form of
undecodable bytes that sys.argv and os.fsdecode give, back to those bytes; other lone
surrogates as their 3-byte form). Then, as llama.cpp's `unicode_cpts_from_utf8`: BPE decodes with
its lenient rules (any lead byte followed by the right number of continuation bytes is a code
point, so overlong forms and surrogates pass; every other byte that starts no such sequence is
one U+FFFD) before the pre-tokenizer; SPM keeps every byte: its first symbols are as many bytes
as each lead byte announces, so an invalid one takes the next bytes into its byte-fallback tokens.
Where llama.cpp would throw (a 4-byte form above U+10FFFF) BPE gives U+FFFD per byte.
tests/data/invalid_utf8_tokenize_refs.json holds llama.cpp's ids for such prompts.
"""

from __future__ import annotations

import codecs
import enum
import heapq
import os
from array import array
from typing import Any, Mapping

import numpy as np
import regex

from pyggml.errors import ArgumentTypeError, TokenizerError
from pyggml.llm.vocab import DuplicateTextError, Vocab

SPACE_MARK = "\u2581"   # '▁', SentencePiece's escaped space
_CACHE_MAX = 1 << 14    # entries kept per word/fragment cache before it is cleared
_CACHE_LEN = 512        # longest word/fragment (characters) that is cached


class TokenAttr(enum.IntFlag):
    """llama.cpp's `llama_token_attr` bits."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_UNK, _UNUSED, _NORMAL, _CONTROL, _USER, _BYTE, _LSTRIP, _RSTRIP = (
    int(TokenAttr.UNKNOWN), int(TokenAttr.UNUSED), int(TokenAttr.NORMAL), int(TokenAttr.CONTROL),
    int(TokenAttr.USER_DEFINED), int(TokenAttr.BYTE), int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP))

# tokenizer.ggml.token_type value -> attribute; any other value is UNDEFINED
_TYPE_TO_ATTR = {1: _NORMAL, 2: _UNK, 3: _CONTROL, 4: _USER, 5: _UNUSED, 6: _BYTE}

# Texts llama.cpp recognizes when the GGUF names no id (src/llama-vocab.cpp, "auto-detect").
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["))
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# (GGUF key suffix, attribute name) in llama.cpp's order; the deprecated keys come last and win.
_SPECIAL_ID_KEYS = (
    ("bos_token_id", "bos_id"), ("eos_token_id", "eos_id"), ("eot_token_id", "eot_id"),
    ("eom_token_id", "eom_id"), ("unknown_token_id", "unk_id"), ("seperator_token_id", "sep_id"),
    ("padding_token_id", "pad_id"), ("mask_token_id", "mask_id"),
    ("fim_pre_token_id", "fim_pre_id"), ("fim_suf_token_id", "fim_suf_id"),
    ("fim_mid_token_id", "fim_mid_id"), ("fim_pad_token_id", "fim_pad_id"),
    ("fim_rep_token_id", "fim_rep_id"), ("fim_sep_token_id", "fim_sep_id"),
    ("prefix_token_id", "fim_pre_id"), ("suffix_token_id", "fim_suf_id"),
    ("middle_token_id", "fim_mid_id"),
)

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes (byte-level BPE). llama.cpp's `\s` is the Unicode White_Space set; the
# `regex` module's own `\s` differs on a few code points, so the set is spelled out.
_WS = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _ws(pattern: str) -> str:
    return (pattern.replace(r"[^\s", "[^" + _WS).replace(r"\s", f"[{_WS}]")
            .replace(r"\S", f"[^{_WS}]"))


# llama.cpp runs these two with hand-written scanners that also emit any unmatched code point
# on its own; `(?s:.)` does the same here.
_R_GPT2 = _ws(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
              r"|(?s:.)")
_R_LLAMA3 = _ws(r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
                r"\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+|(?s:.)")
_R_QWEN2 = _ws(r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
               r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-4o (gpt-oss, Llama 4) and tekken (Mistral): llama.cpp's rewrites of the tokenizer.json
# regexes, upper / lower case as "a letter that is not a-z / A-Z" (what its category collapsing
# makes of \p{Lu} / \p{Ll}), applied here to the real code points
_LU, _LL = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_R_GPT4O = _ws(rf"[^\r\n\p{{L}}\p{{N}}]?{_LU}*{_LL}+{_CONTR}|[^\r\n\p{{L}}\p{{N}}]?{_LU}+{_LL}*{_CONTR}"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_TEKKEN = _ws(rf"[^\r\n\p{{L}}\p{{N}}]?{_LU}*{_LL}+|[^\r\n\p{{L}}\p{{N}}]?{_LU}+{_LL}*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_R_QWEN35 = _ws(r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
                r"[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek's CJK / Hangul run (the same code point ranges as llama.cpp)
_R_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# deepseek-llm's letter class: the explicit ranges of llama.cpp's table (Latin, Greek, Cyrillic,
# Armenian, Georgian, Cherokee, ... full-width and a few astral blocks), not \p{L}
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943")

_PRE_REGEXES = {   # family -> regexes applied in sequence, each re-splitting every chunk
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _R_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_R_GPT2,),
    "llama3": (_R_LLAMA3,),
    "qwen2": (_R_QWEN2,),
    "smollm": (r"\p{N}", _R_GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _R_GPT2, r"[0-9][0-9][0-9]"),
    "qwen35": (_R_QWEN35,),
    "gpt4o": (_R_GPT4O,),
    "tekken": (_R_TEKKEN,),
    # std::regex's `$` (no multiline) is Python's \Z
    "deepseek-llm": ("[\r\n]", _ws(f"\\s?[{_DEEPSEEK_LETTERS}]+"),
                     _ws("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"),
                     _ws("\\s+\\Z"), _R_CJK, r"\p{N}+"),
    "deepseek-coder": ("[\r\n]", _ws(r"\s?\p{L}+"), _ws(r"\s?\p{P}+"), _R_CJK, r"\p{N}"),
    "gemma4": (r"[^\n]+|[\n]+",),
}


def _pre(family, ignore_merges=False, add_bos=False, clean_spaces=True):
    return (family, ignore_merges, add_bos, clean_spaces)


_LLAMA3 = _pre("llama3", ignore_merges=True, add_bos=True)
# tokenizer.ggml.pre -> (regex family, ignore_merges, add_bos default, clean_spaces), as
# llama_vocab::impl::load sets them.
_PRE_TYPES = {
    "default": _pre("default"),
    **{n: _LLAMA3 for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                            "midm-2.0", "lfm2", "jina-v5-nano")},
    "dbrx": _pre("llama3"), "smaug-bpe": _pre("llama3"),
    **{n: _pre("gpt2") for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                 "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo",
                                 "jais", "exaone4")},
    "trillion": _pre("gpt2", clean_spaces=False),
    "granite-docling": _pre("gpt2", clean_spaces=False),
    **{n: _pre("qwen2", clean_spaces=False) for n in ("qwen2", "deepseek-r1-qwen", "kormo",
                                                      "f2llmv2", "hunyuan", "solar-open",
                                                      "grok-2")},
    "stablelm2": _pre("qwen2"), "megrez": _pre("qwen2"),
    **{n: _pre("smollm") for n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b",
                                   "mellum2")},
    "smollm": _pre("smollm", clean_spaces=False),
    "command-r": _pre("smollm", clean_spaces=False),
    "falcon": _pre("falcon"),
    "qwen35": _pre("qwen35", clean_spaces=False),
    **{n: _pre("gpt4o", clean_spaces=False) for n in ("gpt-4o", "llama4", "kanana2", "talkie")},
    "tekken": _pre("tekken", ignore_merges=True, add_bos=True, clean_spaces=False),
    "deepseek-llm": _pre("deepseek-llm", clean_spaces=False),
    "deepseek-coder": _pre("deepseek-coder", clean_spaces=False),
    **{n: _pre("gemma4") for n in ("gemma4", "granite-embed-multi-311m")},
}
_ESCAPE_WS_PRES = ("gemma4", "granite-embed-multi-311m")


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable code point table."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_B2U = _bytes_to_unicode()
_U2B = {c: b for b, c in enumerate(_B2U)}
_C_SPACE = " \t\n\v\f\r"    # C isspace(), used by LSTRIP/RSTRIP and nothing else


def _raw(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


# ---- prompts that are not valid UTF-8 (see the module docstring) -------------------------------

def _encode_surrogates(exc: UnicodeEncodeError):
    out = bytearray()
    for c in exc.object[exc.start:exc.end]:
        cp = ord(c)
        if 0xDC80 <= cp <= 0xDCFF:
            out.append(cp - 0xDC00)             # surrogateescape: the byte it stands for
        else:
            out += c.encode("utf-8", "surrogatepass")
    return bytes(out), exc.end


def _decode_like_llama(exc: UnicodeDecodeError):
    """llama.cpp unicode_cpt_from_utf8 at the byte Python's strict decoder stopped at: a lead
    byte and the continuation bytes it announces give one code point (no overlong or surrogate
    check); otherwise this one byte is U+FFFD. Python resumes strictly after it; both decoders
    agree on valid UTF-8, so the result is llama.cpp's code point sequence."""
    data, i = exc.object, exc.start
    b = data[i]
    n = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 0
    if n and i + n <= len(data) and all(x & 0xC0 == 0x80 for x in data[i + 1:i + n]):
        cp = b & (0xFF >> (n + 1))
        for x in data[i + 1:i + n]:
            cp = cp << 6 | x & 0x3F
        if cp <= 0x10FFFF:
            return chr(cp), i + n
    return "\ufffd", i + 1


_UNDECODABLE = regex.compile("[\udc80-\udcff]")     # surrogateescape'd bytes


def _spm_symbols(text: str) -> tuple[str, list[int]]:
    """llama.cpp's first SPM symbols over the bytes of `text` (undecodable ones surrogateescape'd):
    a symbol is as many bytes as its first byte announces (unicode_len_utf8: 0x80-0xBF one,
    0xC0-0xDF two, 0xE0-0xEF three, 0xF0-0xFF four; at most what is left), so a bad lead byte
    takes the bytes after it along, and the byte fallback turns the symbol into byte tokens.
    Returns the text rebuilt from the symbols' bytes and (n,) characters per symbol, 0 inside."""
    raw = _raw(text)
    parts, size = [], []
    off = 0
    while off < len(raw):
        n = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[raw[off] >> 4]
        piece = raw[off:off + n].decode("utf-8", "surrogateescape")
        parts.append(piece)
        size += [len(piece)] + [0] * (len(piece) - 1)
        off += n
    return "".join(parts), size


codecs.register_error("pyggml-surrogates", _encode_surrogates)
codecs.register_error("pyggml-llama-utf8", _decode_like_llama)


def prompt_bytes(text: str | bytes) -> bytes:
    """The bytes a prompt stands for (see the module docstring); ArgumentTypeError (also a
    TypeError) for anything but str and bytes-like objects."""
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "pyggml-surrogates")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise ArgumentTypeError(f"text must be str or bytes, got {type(text).__name__} "
                            f"{_short(text)}")


def _hex_byte(text: str) -> int:
    """The byte of a `<0xXX>` token (llama.cpp: strtol of text[3:5], 0 when unparsable)."""
    try:
        return int(text[3:5], 16) & 0xFF
    except ValueError:
        return 0


# ---------------------------------------------------------------------------------------------
# metadata access

_REQUIRED = object()
_GENERAL_KEYS = ("general.name", "general.architecture")    # read for per-model token attributes


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _get(kv: Mapping[str, Any], key: str, kind: str, default=_REQUIRED):
    """kv[key] checked against `kind` (str, bool, uint, str[], num[], int[])."""
    if key not in kv or kv[key] is None:
        if default is _REQUIRED:
            raise TokenizerError(f"metadata key {key!r} is missing ({kind} expected)")
        return default
    v = kv[key]
    if kind == "str":
        if isinstance(v, bytes):
            v = v.decode("utf-8", "surrogateescape")
        if isinstance(v, str):
            return v
    elif kind == "bool":
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
    elif kind == "uint":
        if _is_int(v) and v >= 0:
            return int(v)
    elif kind == "str[]":
        if isinstance(v, Vocab):
            return v
        if isinstance(v, np.ndarray) and v.ndim == 1:
            v = v.tolist()
        if isinstance(v, (list, tuple)):
            if set(map(type, v)) <= {str}:
                return list(v)
            out = []
            for i, s in enumerate(v):
                if isinstance(s, bytes):
                    s = s.decode("utf-8", "surrogateescape")
                elif not isinstance(s, str):
                    raise TokenizerError(f"metadata key {key!r}: element {i} is "
                                         f"{type(s).__name__}, expected str")
                out.append(s)
            return out
    else:   # num[] / int[]
        if isinstance(v, (list, tuple, np.ndarray)):
            try:
                arr = np.asarray(v)
            except ValueError:
                arr = None
            kinds = "iu" if kind == "int[]" else "iuf"
            if arr is not None and arr.ndim == 1 and (arr.dtype.kind in kinds or arr.size == 0):
                return arr
    raise TokenizerError(f"metadata key {key!r} is {type(v).__name__} {_short(v)}, "
                         f"expected {kind}")


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def read_gguf_tokenizer_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The `tokenizer.ggml.*` keys and general.name/architecture of a GGUF file, as plain Python
    values (numeric arrays as numpy arrays; strings not valid UTF-8 kept with surrogateescape).
    File-level problems raise GGUFError."""
    from pyggml.gguf import GGUFModel

    kv: dict[str, Any] = {}
    with GGUFModel.open(path) as gf:
        for key in gf.keys():
            if not (key.startswith("tokenizer.ggml.") or key in _GENERAL_KEYS):
                continue
            vtype = gf.value_type(key)
            if key == "tokenizer.ggml.tokens" and vtype == "ARRAY[STRING]":
                kv[key] = Vocab.from_buffer(*gf.string_spans(key))     # no str per token
            elif vtype == "ARRAY[STRING]":
                kv[key] = [b.decode("utf-8", "surrogateescape")
                           for b in gf.get_arr(key, raw=True)]
            elif vtype.startswith("ARRAY["):
                kv[key] = np.array(gf.get_arr(key))     # a copy: the file is closed below
            else:
                kv[key] = gf.get(key)
    return kv


# ---------------------------------------------------------------------------------------------

class Tokenizer:
    """A vocabulary and its tokenizer, built from GGUF metadata (`from_metadata`, `from_gguf`).

    `encode(text, add_special, parse_special)` is llama.cpp's `llama_tokenize`;
    `detokenize(ids, special, remove_special)` is `llama_detokenize`; `token_to_piece(id,
    special)` is `llama_token_to_piece`."""

    def __init__(self, kv: Mapping[str, Any]):
        model = _get(kv, "tokenizer.ggml.model", "str")
        if model not in ("llama", "gpt2", "gemma4"):
            raise TokenizerError(f"metadata key 'tokenizer.ggml.model' is {model!r}; supported: "
                                 "'llama' (SentencePiece-style), 'gpt2' (byte-level BPE), "
                                 "'gemma4' (BPE over UTF-8 with ▁ for spaces)")
        self.model = model
        self.is_spm = model == "llama"
        # llama.cpp: a gemma4 vocabulary always has the gemma4 pre-tokenizer
        self.pre = "gemma4" if model == "gemma4" else _get(kv, "tokenizer.ggml.pre", "str", "")
        # spaces as ▁ before BPE, symbols raw UTF-8 (not byte-mapped), <0xXX> byte fallback
        self.escape_ws = self.pre in _ESCAPE_WS_PRES
        self._load_tokens(kv)
        if self.is_spm:
            self.add_space_prefix, self.clean_spaces, self.add_bos = True, False, True
            self.ignore_merges, self._pre_regexes = False, ()
            defaults = {"bos_id": 1, "eos_id": 2, "unk_id": 0}
        else:
            pre = self.pre or "default"
            if pre not in _PRE_TYPES:
                raise TokenizerError(f"metadata key 'tokenizer.ggml.pre' is {pre!r}, which this "
                                     f"tokenizer does not know; known: {sorted(_PRE_TYPES)}")
            family, self.ignore_merges, self.add_bos, self.clean_spaces = _PRE_TYPES[pre]
            self._pre_regexes = tuple(regex.compile(r) for r in _PRE_REGEXES[family])
            self.add_space_prefix = False
            defaults = {} if model == "gemma4" else {"bos_id": 11, "eos_id": 11}
            self._load_merges(kv)
        self.add_eos = False
        self.add_space_prefix = _get(kv, "tokenizer.ggml.add_space_prefix", "bool",
                                     self.add_space_prefix)
        self._load_special_ids(kv, defaults)
        if self.pre == "gemma4" and not self.add_bos:
            self.add_bos = True         # llama.cpp overrides add_bos_token = false for Gemma 4
            if self.bos_id is None:
                raise TokenizerError("a gemma4 vocabulary needs tokenizer.ggml.bos_token_id "
                                     "(BOS is always added)")
        self._detect_special_tokens()
        self._build_special_index()
        self._set_model_attrs(kv)
        self._byte_ids: list[int | None] = [self._byte_token_id(b) for b in range(256)]
        self._pieces: dict[int, bytes] = {}
        self._frag_cache: dict[str, list[int]] = {}
        self._word_cache: dict[str, list[int]] = {}

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, kv: Mapping[str, Any]) -> "Tokenizer":
        """From a mapping GGUF key -> Python value (str, bool, int, list or numpy array)."""
        return cls(kv)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "Tokenizer":
        """From the tokenizer keys of a GGUF file (weights are not read)."""
        kv = read_gguf_tokenizer_metadata(path)
        try:
            return cls(kv)
        except TokenizerError as e:
            raise TokenizerError(f"{os.fspath(path)}: {e}") from None

    def _load_tokens(self, kv) -> None:
        tokens = _get(kv, "tokenizer.ggml.tokens", "str[]")
        n = len(tokens)
        if n == 0:
            raise TokenizerError("metadata key 'tokenizer.ggml.tokens' is an empty array")
        scores = _get(kv, "tokenizer.ggml.scores", "num[]", None)
        types = _get(kv, "tokenizer.ggml.token_type", "int[]", None)
        for key, arr in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
            if arr is not None and len(arr) < n:
                raise TokenizerError(f"metadata key {key!r} has {len(arr)} entries for {n} "
                                     "tokens (tokenizer.ggml.tokens)")
        # flat arrays, not lists of Python objects: 4 and 2 bytes per token (Gemma 3: 262k)
        self._scores = (array("f", bytes(4 * n)) if scores is None
                        else array("f", np.asarray(scores[:n], dtype=np.float32).tobytes()))
        self._attrs = (array("H", [_NORMAL]) * n if types is None
                       else array("H", [_TYPE_TO_ATTR.get(t, 0) for t in types[:n].tolist()]))
        empty = ([i for i in range(n) if not tokens.text_bytes(i)] if isinstance(tokens, Vocab)
                 else [i for i, t in enumerate(tokens) if not t])
        if empty or not isinstance(tokens, Vocab):
            at = set(empty)
            tokens = [f"[EMPTY_{i}]" if i in at else tokens[i] for i in range(n)]
        try:
            vocab = tokens if isinstance(tokens, Vocab) else Vocab.from_texts(tokens)
        except DuplicateTextError as e:
            raise TokenizerError(f"metadata key 'tokenizer.ggml.tokens': duplicate token "
                                 f"{e.text!r} at ids {e.ids[0]} and {e.ids[1]}") from None
        self._tokens = self._to_id = vocab      # id -> text (vocab[i]) and text -> id (.get)

    def _load_merges(self, kv) -> None:
        merges = _get(kv, "tokenizer.ggml.merges", "str[]")
        ranks: dict[tuple[str, str], int] = {}
        for i, m in enumerate(merges):
            pos = m.find(" ", 1)
            pair = (m[:pos], m[pos + 1:]) if pos >= 0 else ("", "")
            ranks.setdefault(pair, i)
        self._ranks = ranks

    def _load_special_ids(self, kv, defaults: dict[str, int]) -> None:
        n = self.n_vocab
        for _, name in _SPECIAL_ID_KEYS:
            setattr(self, name, None)
        for name, value in defaults.items():
            setattr(self, name, value)
        for suffix, name in _SPECIAL_ID_KEYS:
            if getattr(self, name) is not None and getattr(self, name) >= n:
                setattr(self, name, None)               # default out of range: disabled
            new = _get(kv, "tokenizer.ggml." + suffix, "uint", None)
            if new is not None and new < n:             # out of range: default kept
                setattr(self, name, new)
        self.add_bos = _get(kv, "tokenizer.ggml.add_bos_token", "bool", self.add_bos)
        self.add_eos = _get(kv, "tokenizer.ggml.add_eos_token", "bool", self.add_eos)
        for flag, name, key in ((self.add_bos, "bos_id", "bos"), (self.add_eos, "eos_id", "eos")):
            if flag and getattr(self, name) is None:
                raise TokenizerError(f"tokenizer.ggml.add_{key}_token is true, but "
                                     f"tokenizer.ggml.{key}_token_id is not set")

    def _detect_special_tokens(self) -> None:
        """End-of-generation set and the attribute fixes llama.cpp applies by token text."""
        attrs, to_id = self._attrs, self._to_id

        def find(texts, name):
            # llama.cpp takes the first match in its hash map's order; here the first in `texts`
            # (so phi-3's <|end|> wins over <|endoftext|>, as it does in llama.cpp)
            if getattr(self, name) is None:
                found = [to_id.index(t) for t in texts if t in to_id]
                if found:
                    setattr(self, name, found[0])
                    attrs[found[0]] |= _CONTROL

        find(_EOT_TEXTS, "eot_id")
        find(("<|eom_id|>",), "eom_id")
        for kind, texts in _FIM_TEXTS.items():
            find(texts, kind + "_id")
        for i, a in enumerate(attrs):
            if a & _CONTROL and "unused" in self._tokens[i]:
                attrs[i] = a | _UNUSED
        eog = {i for i in (self.fim_pad_id, self.fim_rep_id, self.fim_sep_id) if i is not None}
        for t in _EOG_TEXTS:
            if t in to_id:
                eog.add(to_id.index(t))
                attrs[to_id.index(t)] |= _CONTROL
        for t in _ALWAYS_RENDERED:
            if t in to_id:
                attrs[to_id.index(t)] = _USER
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        texts = {self._tokens[i]: i for i in eog}
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])       # o200k_harmony / solar-open: <|end|> is no EOG
            attrs[texts["<|end|>"]] = _USER
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = _NORMAL
        self.eog_ids = frozenset(eog)

    def _build_special_index(self) -> None:
        """Tokens split out of raw text, longest (in UTF-8 bytes) first, grouped by their first
        three characters so that `encode` only looks for those whose prefix occurs."""
        specials = [i for i, a in enumerate(self._attrs) if a & (_CONTROL | _USER | _UNK)]
        specials.sort(key=lambda i: -len(_raw(self._tokens[i])))
        self._specials = specials
        self._special_index: tuple[dict, dict] = ({}, {})   # [parse_special] -> prefix -> list
        for rank, i in enumerate(specials):
            text = self._tokens[i]
            entry = (rank, i, text)
            self._special_index[True].setdefault(text[:3], []).append(entry)
            if not self._attrs[i] & (_CONTROL | _UNK):
                self._special_index[False].setdefault(text[:3], []).append(entry)

    def _set_model_attrs(self, kv) -> None:
        """Per-model LSTRIP/RSTRIP attributes llama.cpp sets by model name (not in GGUF)."""
        name = _get(kv, "general.name", "str", "").lower()
        arch = _get(kv, "general.architecture", "str", "")
        to_id, attrs = self._to_id, self._attrs
        if (any(s in self.pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
                or arch in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in to_id:
                attrs[to_id.index("<mask>")] |= _LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i in self._specials:
                attrs[i] |= _RSTRIP
            if "</s>" in to_id:
                attrs[to_id.index("</s>")] |= _RSTRIP
            for t in ("<unk>", "<s>", "<|endoftext|>"):
                if t in to_id:
                    attrs[to_id.index(t)] &= ~_RSTRIP
        elif "modern-bert" in name and "[MASK]" in to_id:
            attrs[to_id.index("[MASK]")] |= _LSTRIP

    def _byte_token_id(self, b: int) -> int | None:
        """Id used for byte b when a symbol is not a token (SPM: `<0xXX>`, else the byte)."""
        single = bytes([b]).decode("utf-8", "surrogateescape")
        if self.is_spm:
            tid = self._to_id.get(f"<0x{b:02X}>")
            return tid if tid is not None else self._to_id.get(single)
        if self.escape_ws:
            return self._to_id.get(f"<0x{b:02X}>")
        return self._to_id.get(single)

    # -- properties ---------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def token_text(self, token_id: int) -> str:
        """The vocabulary text of a token, as stored in the GGUF."""
        return self._tokens[self._check_id(token_id)]

    def token_attr(self, token_id: int) -> TokenAttr:
        return TokenAttr(self._attrs[self._check_id(token_id)])

    def token_score(self, token_id: int) -> float:
        return self._scores[self._check_id(token_id)]

    def text_to_id(self, text: str) -> int | None:
        return self._to_id.get(text)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def _check_id(self, token_id: int) -> int:
        if not (_is_int(token_id) and 0 <= token_id < len(self._tokens)):
            raise TokenizerError(f"token id {token_id!r} is outside the vocabulary "
                                 f"(0..{len(self._tokens) - 1})")
        return int(token_id)

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.

        add_special: prepend BOS / append EOS when the vocabulary asks for them.
        parse_special: cut CONTROL tokens (e.g. `<start_of_turn>`) out of the text; USER_DEFINED
        tokens are cut out either way. `text` may be bytes or a str that is not valid UTF-8
        (module docstring)."""
        text = self._prompt_text(text)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        frags = self._partition(text, parse_special) if text else []
        if self.is_spm:
            prev_special = True
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out += self._spm(frag.replace(" ", SPACE_MARK))
                prev_special = False
        else:
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out += self._bpe(frag.replace(" ", SPACE_MARK) if self.escape_ws else frag)
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _prompt_text(self, text: str | bytes) -> str:
        """`text` as the str the algorithms below cut: itself when it is valid UTF-8."""
        if isinstance(text, str):
            try:
                text.encode("utf-8")
                return text
            except UnicodeEncodeError:
                pass
        raw = prompt_bytes(text)
        if self.is_spm:     # keep every byte: undecodable ones reach the byte fallback
            return raw.decode("utf-8", "surrogateescape")
        return raw.decode("utf-8", "pyggml-llama-utf8")

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split raw text into raw fragments (str) and special tokens (int): each special token,
        longest first, is cut out of every remaining raw fragment, left to right."""
        found = []
        for prefix, entries in self._special_index[bool(parse_special)].items():
            if prefix in text:
                found += [e for e in entries if e[2] in text]
        if not found:
            return [text]
        found.sort()
        frags: list[str | int] = [text]
        attrs = self._attrs
        for _, tid, tok in found:
            lstrip, rstrip = attrs[tid] & _LSTRIP, attrs[tid] & _RSTRIP
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    out.append(frag)
                    continue
                pos, hit = 0, frag.find(tok)
                while hit >= 0:
                    left = frag[pos:hit]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = hit + len(tok)
                    if rstrip:
                        while pos < len(frag) and frag[pos] in _C_SPACE:
                            pos += 1
                    hit = frag.find(tok, pos)
                if pos < len(frag):
                    out.append(frag[pos:])
            frags = out
        return frags

    def _spm(self, text: str) -> list[int]:
        if len(text) > _CACHE_LEN:
            return self._spm_merge(text)
        ids = self._frag_cache.get(text)
        if ids is None:
            ids = self._spm_merge(text)
            if len(self._frag_cache) >= _CACHE_MAX:
                self._frag_cache.clear()
            self._frag_cache[text] = ids
        return ids

    def _spm_merge(self, text: str) -> list[int]:
        """llama.cpp `llm_tokenizer_spm_session::tokenize`: merge the adjacent pair whose joined
        text is the best-scoring token (ties: leftmost) until none is left. Symbol i starts at
        character i, so its text is text[i:i + size[i]]. The first symbols are the characters,
        or with undecodable bytes llama.cpp's byte groups (_spm_symbols)."""
        if _UNDECODABLE.search(text):
            text, size = _spm_symbols(text)
        else:
            size = [1] * len(text)          # (n,) characters per symbol, 0 once merged away
        n = len(text)
        to_id, scores = self._to_id, self._scores
        nxt = [n] * n                       # (n,) next symbol, n at the end
        prev = [-1] * n                     # (n,) previous symbol, -1 at the start
        starts = [i for i in range(n) if size[i]]
        for a, b in zip(starts, starts[1:]):
            nxt[a], prev[b] = b, a
        heap = []
        for a, b in zip(starts, starts[1:]):
            tid = to_id.get(text[a:b + size[b]])
            if tid is not None:
                heap.append((-scores[tid], a, b, size[a] + size[b]))
        heapq.heapify(heap)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue                    # stale: one side changed since this was queued
            size[left], size[right] = joined, 0
            after = nxt[right]
            nxt[left] = after
            if after < n:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                s = size[before] + joined
                tid = to_id.get(text[before:before + s])
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], before, left, s))
            if after < n:
                s = joined + size[after]
                tid = to_id.get(text[left:left + s])
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, after, s))
        out = []
        i = 0
        while i < n:
            piece = text[i:i + size[i]]
            tid = to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:                           # byte fallback, one token per UTF-8 byte
                for b in _raw(piece):
                    bid = self._byte_ids[b]
                    if bid is None:
                        raise TokenizerError(f"SPM vocabulary has no token for byte 0x{b:02X} "
                                             f"(neither '<0x{b:02X}>' nor the byte itself)")
                    out.append(bid)
            i = nxt[i]
        return out

    def pretokenize(self, text: str) -> list[str]:
        """BPE pre-tokenizer: the words (before byte mapping) the regexes cut `text` into."""
        chunks = [text]
        for pattern in self._pre_regexes:
            out = []
            for chunk in chunks:
                pos = 0
                for m in pattern.finditer(chunk):
                    start, end = m.span()
                    if start > pos:
                        out.append(chunk[pos:start])
                    out.append(chunk[start:end])
                    pos = end
                if pos < len(chunk):
                    out.append(chunk[pos:])
            chunks = out
        return chunks

    def _bpe(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for word in self.pretokenize(text):
            ids = cache.get(word)
            if ids is None:
                if self.escape_ws:
                    # raw UTF-8 symbols; a newline run that is a token is that token (llama.cpp)
                    tid = self._to_id.get(word) if not word.strip("\n") else None
                    ids = [tid] if tid is not None else self._bpe_word(word)
                else:
                    # surrogatepass: lone surrogates that llama.cpp's decoder let through
                    ids = self._bpe_word("".join([_B2U[b] for b in word.encode(
                        "utf-8", "surrogatepass")]))
                if len(word) <= _CACHE_LEN:
                    if len(cache) >= _CACHE_MAX:
                        cache.clear()
                    cache[word] = ids
            out += ids
        return out

    def _bpe_word(self, word: str) -> list[int]:
        """llama.cpp `llm_tokenizer_bpe_session::tokenize` for one byte-mapped word: merge the
        adjacent pair of lowest merge rank (ties: leftmost) until none is left."""
        to_id, ranks = self._to_id, self._ranks
        if self.ignore_merges and word in to_id:
            return [to_id.index(word)]
        syms = list(word)                   # (n,) symbol texts, "" once merged away
        n = len(syms)
        nxt = list(range(1, n + 1))
        prev = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            rank = ranks.get((syms[i], syms[i + 1]))
            if rank is not None:
                heap.append((rank, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != joined:
                continue
            syms[left], syms[right] = joined, ""
            after = nxt[right]
            nxt[left] = after
            if after < n:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                rank = ranks.get((syms[before], joined))
                if rank is not None:
                    heapq.heappush(heap, (rank, before, left, syms[before] + joined))
            if after < n:
                rank = ranks.get((joined, syms[after]))
                if rank is not None:
                    heapq.heappush(heap, (rank, left, after, joined + syms[after]))
        out = []
        for s in syms:
            if not s:
                continue
            tid = to_id.get(s)
            if tid is not None:
                out.append(tid)
            else:   # practically unreachable: each byte's own text, bytes without one dropped
                out += [self._byte_ids[b] for b in _raw(s) if self._byte_ids[b] is not None]
        return out

    # -- decoding -----------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes one token stands for (llama.cpp `llama_token_to_piece`, lstrip 0).

        CONTROL and UNKNOWN tokens give b"" unless `special`; a byte token gives one byte, which
        may be part of a UTF-8 sequence that the following tokens complete."""
        tid = self._check_id(token_id)
        if not special and self._attrs[tid] & (_UNK | _CONTROL):
            return b""
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid)
        return piece

    def _make_piece(self, tid: int) -> bytes:
        attr, text = self._attrs[tid], self._tokens[tid]
        if attr & (_UNK | _CONTROL | _USER):
            return _raw(text)
        if attr & _NORMAL:
            if self.is_spm or self.escape_ws:
                return _raw(text.replace(SPACE_MARK, " "))
            out = bytearray()
            for c in text:
                b = _U2B.get(c)
                if b is not None:
                    out.append(b)
                else:   # llama.cpp's llama_decode_text marker for a code point with no byte
                    out += b"[UNK_BYTE_0x" + _raw(c).hex().encode() + _raw(text) + b"]"
            return bytes(out)
        if attr & _BYTE:
            return bytes([_hex_byte(text)])
        return b""      # UNUSED, UNDEFINED

    def detokenize(self, ids, special: bool = False, remove_special: bool = False) -> bytes:
        """llama.cpp `llama_detokenize(ids, remove_special, unparse_special=special)`: pieces
        joined, the space prefix removed from the first piece when the vocabulary adds one, and
        for vocabularies with clean_spaces (most BPE ones) spaces before ?!., removed."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            piece = self.token_to_piece(tid, special)
            if remove_space and piece[:1] == b" ":
                piece = piece[1:]
            remove_space = False
            parts.append(piece)
        text = b"".join(parts)
        return _clean_spaces(text) if self.clean_spaces else text

    def decode(self, ids, special: bool = False) -> str:
        """Text of `ids` (llama.cpp `common_detokenize`); invalid UTF-8 becomes U+FFFD."""
        return self.detokenize(ids, special=special).decode("utf-8", "replace")


def _clean_spaces(text: bytes) -> bytes:
    """The three clean-up passes of llama_detokenize, done in place on a copy."""
    t = bytearray(text)
    # " ?" " !" " ." " ," -> drop the space
    total1, total = len(t), (1 if t else 0)
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # " ' " -> "'"
    total2, total = total, (1 if total else 0)
    i = 1
    while i < total2:
        x = t[i]
        if x == 0x27 and i + 1 < total2 and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # " 's" " 'm" " 're" " 've" -> drop the space
    total3, total = total, (1 if total else 0)
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                if (x1, t[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):    # 're, 've
                    total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])
