"""Make the llama.cpp reference data for pyggml's tokenizer tests.

llama.cpp (through llama-cpp-python, installed in its OWN virtual environment, never a pyggml
dependency) tokenizes and detokenizes a fixed corpus; the ids and texts are written as JSON so the
tests run without llama.cpp:

- tests/data/gemma3_tokenizer_refs.json: the default model's vocabulary (Gemma 3 270M, SPM).
- tests/data/bpe_pretokenizer_refs.json: the gpt-2 test vocabulary (byte-level BPE) re-labelled
  with other `tokenizer.ggml.pre` values, which exercises those pre-tokenizer regexes.

Run from the repository root with the project's Python (it needs `gguf`), naming the Python that
has llama_cpp:

    .venv/bin/python tools/make_tokenizer_refs.py --llama-python /tmp/llamavenv/bin/python

The same file runs as the llama_cpp worker (`--worker JOB.json`) under that other Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPT2_VOCAB = REPO / "tests" / "data" / "tokenizer-tests" / "ggml-vocab-gpt-2.gguf"
BPE_PRE_TYPES = ("llama-bpe", "qwen2", "smollm", "default", "falcon", "deepseek-coder",
                 "deepseek-llm", "qwen35", "gpt-4o", "tekken")   # gpt-2: llama.cpp vectors

# ---------------------------------------------------------------------------------------------
# corpus

_HAND = [
    # ASCII, punctuation, contractions
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "Hello", "hello", "HELLO", "Hello world",
    " Hello world", "  Hello world", "   Hello world", "Hello World!", "hello, world.",
    "The quick brown fox jumps over the lazy dog.",
    "I'm fine, you're welcome; they've gone, we'll see, he'd say, it's OK.",
    "DON'T SHOUT, I'M HERE. WE'VE GOT IT, YOU'LL SEE, SHE'D KNOW.",
    "'s 't 're 've 'm 'll 'd", "rock 'n' roll", "\"quoted\" and 'single'",
    "e-mail: someone@example.com", "https://example.com/path?q=1&r=2#frag",
    "C:\\Windows\\System32\\drivers", "What?! No... Yes!!! (maybe) [sure] {ok}",
    "a.b.c,d;e:f!g?h", "--- *** ___ ~~~ === +++", "100% sure; 50/50 odds; #1 fan; $5 & €3",
    "Mr. Smith went to Washington, D.C., on Jan. 3rd.", "etc.", "...", "?!", " ?", " .",
    "x ' y", "it 's", "we 're here", "don 't",
    # whitespace runs, leading spaces, newlines
    "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a \t b", " leading", "   leading three",
    "trailing ", "trailing   ", "\n\nnew paragraph", "line1\nline2\n", "line1\r\nline2\r\n",
    "\r\n", "\r", " \n ", "\n \n", "a" + " " * 40 + "b", "\n" * 35, "\t \t \n", " " * 31,
    " " * 32, " " * 33, "x" + "\n" * 31 + "y", "end\n", "\n\tindented after newline",
    "\u00a0nbsp\u00a0", "\u3000ideographic\u3000space", "thin\u2009space", "em\u2003space",
    "para\u2029graph", "line\u2028sep", "next\u0085line", "\x0bvertical\x0cfeed",
    # digits
    "0", "1", "12", "123", "1234", "12345", "123456789", "3.14159", "1,000,000", "2024-01-15",
    "+1 (555) 010-9999", "0x1F 0b1010 0o17", "1e-10", "½ ¾ ² ³", "٣٤٥ arabic-indic digits",
    "१२३ devanagari digits", "Ⅻ roman numeral", "①②③", "version 1.2.3-rc4", "10:30 am",
    "-42", "007", "1st 2nd 3rd 4th",
    # accents and other Latin
    "café", "naïve résumé", "Ångström", "Äpfel", "façade", "Crème brûlée", "ñandú", "Zürich",
    "Øresund", "straße", "İstanbul", "ŁÓDŹ", "e\u0301", "Cafe\u0301", "a\u0300\u0301\u0302",
    "Ærøskøbing", "Dvořák", "São Paulo", "Ĳssel", "ǅemal", "ﬁnancial ﬂow",
    # other scripts
    "Привет, мир!", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया",
    "สวัสดีชาวโลก", "안녕하세요 세계", "こんにちは世界", "カタカナ ﾊﾝｶｸ", "你好，世界！",
    "我爱北京天安门", "繁體中文測試", "ᚠᛇᚻ᛫ᛒᛦᚦ", "ⲁⲃⲅ", "ქართული", "Հայերեն", "ትግርኛ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "𠜎𠜱𠝹", "Ѐ Ђ Ѓ",
    # emoji
    "🙂", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "I ❤️ NY", "🦙 llama",
    "emoji at end 🎉", "✅ done", "🤖🤖🤖", "☕︎ vs ☕️", "🏳️‍🌈", "#️⃣",
    # code
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '<div class="x">hi</div>', "SELECT * FROM t WHERE id = 42;", "import numpy as np",
    "x = [1, 2, 3]  # comment", "if a != b && c >= d || !e:", "console.log(`template ${x}`);",
    "#include <stdio.h>\nint main(void) { return 0; }", '{"key": [1, 2, {"a": null}]}',
    "$ ls -la | grep .py > out.txt 2>&1", "a->b = c::d;", "    indented 4", "\tindented tab",
    "^\\s+(\\d{3})$", "fn main() -> Result<(), Box<dyn Error>> {}", "x**2 + y**2 == z**2",
    "@decorator\nclass A(B, metaclass=M):\n    pass", "// comment\n/* block */",
    "<?php echo $x; ?>", "```python\nprint('hi')\n```",
    # special-token texts (Gemma) and look-alikes
    "<start_of_turn>", "<end_of_turn>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<unused0>", "<unused99>", "[multimodal]",
    "<start_of_image>", "<end_of_image>", "<table><tr><td>1</td></tr></table>",
    "<b>bold</b> <i>it</i>", "</s>", "<s>", "text</s>more", "<start_of_turn><start_of_turn>",
    "<start_of_turn", "start_of_turn>", "<<start_of_turn>>", " <start_of_turn> spaced ",
    "<h1>Title</h1>\n<p>para</p>", "<code>x</code>", "<0x41>", "▁", "▁▁hello", "<|endoftext|>",
    "<|im_start|>user<|im_end|>", "<bos>Hello<eos>", "<ul><li>one</li></ul>",
    # control characters and oddities
    "\x00", "\x07bell", "\x1b[31mred\x1b[0m", "\u200bzero\u200bwidth", "\ufeffBOM",
    "soft\u00adhyphen", "\ue000 private use", "\U0010fffd", "\ufffd", "\u0378 unassigned",
    "\x1c\x1d\x1e\x1f separators",
    # longer text
    ("Tokenizers split text into pieces. Some pieces are whole words, others are parts of "
     "words, and a few are single bytes.\n\n") * 3,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
    "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.",
]

_POOL = [
    "the", "The", "tokenizer", " model", "llama", "Gemma", "café", "naïve", "Straße", "東京",
    "北京", "한국어", "русский", "ελληνικά", "عربى", "हिन्दी", "🙂", "👍🏽", "🦙", "42",
    "3.14", "1234567", "½", "<start_of_turn>", "<end_of_turn>", "<bos>", "</s>", "<b>", "\n",
    "\n\n", "\t", "  ", "   ", "'s", "'ll", "don't", "(x)", "[i]", "{k: v}", "->", "==", "!=",
    "#", "$", "%", "&&", "||", "...", "?", "!", ",", ".", ";", ":", "\"", "'", "`", "_", "-",
    "▁", "<0x0A>", "\u00a0", "\u3000", "é", "e\u0301", "ß", "İ", "ǅ", "x²", "①",
]
_SEPS = ["", " ", " ", " ", "  ", "\n", "\t", " \n", "\n\n"]


def corpus() -> list[str]:
    """The test strings: the hand-written list, then seeded random mixtures of pool pieces."""
    rng = random.Random(20260101)
    mixed = []
    for _ in range(140):
        parts = [rng.choice(_POOL) for _ in range(rng.randint(2, 7))]
        text = parts[0]
        for p in parts[1:]:
            text += rng.choice(_SEPS) + p
        if rng.random() < 0.2:
            text = " " * rng.randint(1, 3) + text
        mixed.append(text)
    seen, out = set(), []
    for t in _HAND + mixed:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# worker: runs under the Python that has llama_cpp


def _worker(job_path: str) -> None:
    import ctypes

    import llama_cpp
    from llama_cpp import Llama

    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    texts = job["texts"]
    results = {"llama_cpp_python_version": llama_cpp.__version__, "vocabs": {}}
    for name, path in job["vocabs"].items():
        m = Llama(path, vocab_only=True, verbose=False)
        vocab = m._model.vocab
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

        def detok(ids, remove_special, unparse_special):
            arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
            cap = 64 + 64 * len(ids)
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, remove_special,
                                           unparse_special)
            assert 0 <= n <= cap, n
            return buf.raw[:n].decode("utf-8", "surrogateescape")

        def piece(tid, special):
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_token_to_piece(vocab, tid, buf, 256, 0, special)
            assert 0 <= n <= 256, n
            return buf.raw[:n]

        pieces_sha = {}
        for special in (False, True):
            h = hashlib.sha256()
            for tid in range(n_vocab):
                p = piece(tid, special)
                h.update(len(p).to_bytes(4, "little") + p)
            pieces_sha["special" if special else "plain"] = h.hexdigest()
        attrs = [llama_cpp.llama_vocab_get_attr(vocab, t) for t in range(n_vocab)]
        cases = []
        for text in texts:
            raw = text.encode("utf-8")
            ids = m.tokenize(raw, add_bos=True, special=True)
            ids_plain = m.tokenize(raw, add_bos=True, special=False)
            cases.append({
                "text": text,
                "ids": ids,                          # add_special=True, parse_special=True
                "ids_plain": ids_plain,              # add_special=True, parse_special=False
                "ids_nobos": m.tokenize(raw, add_bos=False, special=False),
                "detok": detok(ids, False, False),   # llama_detokenize(ids, remove_special=0,
                "detok_special": detok(ids, False, True),      # unparse_special=0 / 1)
                "detok_plain": detok(ids_plain, False, False),
            })

        def tok_id(fn):
            v = fn(vocab)
            return None if v < 0 else v

        results["vocabs"][name] = {
            "n_vocab": n_vocab,
            "bos": tok_id(llama_cpp.llama_vocab_bos), "eos": tok_id(llama_cpp.llama_vocab_eos),
            "eot": tok_id(llama_cpp.llama_vocab_eot),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
            "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
            "attrs_sha256": hashlib.sha256(
                b"".join(a.to_bytes(4, "little") for a in attrs)).hexdigest(),
            "pieces_sha256": pieces_sha,
            "cases": cases,
        }
        del m
    Path(job["out"]).write_text(json.dumps(results), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# driver: runs under the project's Python


def _relabel_vocab(src: Path, dst: Path, pre: str) -> None:
    """Copy a vocabulary-only GGUF with another tokenizer.ggml.pre value."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _to_json(obj, indent: str = "") -> str:
    """Dicts one key per line, lists of dicts/lists/strings one element per line, the rest
    compact."""
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {_to_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, (dict, list, str)) for x in obj):
        items = [inner + json.dumps(x, ensure_ascii=False) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def _write_json(path: Path, obj) -> None:
    text = _to_json(obj) + "\n"
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:      # a lone surrogate (invalid UTF-8 from llama.cpp): escape all
        data = (json.dumps(obj, indent=0) + "\n").encode("ascii")
    path.write_bytes(data)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", default="/tmp/llamavenv/bin/python",
                    help="a Python interpreter where `import llama_cpp` works")
    ap.add_argument("--model", help="Gemma 3 GGUF (default: the embedded default model)")
    ap.add_argument("--gpt2-vocab", default=str(GPT2_VOCAB))
    ap.add_argument("--out-dir", default=str(REPO / "tests" / "data"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker)
        return

    if args.model:
        model = Path(args.model)
    else:
        sys.path.insert(0, str(REPO))
        from pyggml.models_default import ensure_default_model
        model = ensure_default_model()
    texts = corpus()
    exe = Path(sys.executable)
    exe = exe.relative_to(REPO) if exe.is_relative_to(REPO) else exe
    command = " ".join([str(exe)] + [shlex.quote(a) for a in sys.argv])
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocabs = {"gemma3": str(model)}
        for pre in BPE_PRE_TYPES:
            dst = Path(tmp) / f"gpt2-{pre}.gguf"
            _relabel_vocab(Path(args.gpt2_vocab), dst, pre)
            vocabs[f"gpt2/{pre}"] = str(dst)
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.json"
        job.write_text(json.dumps({"texts": texts, "vocabs": vocabs, "out": str(out)}),
                       encoding="utf-8")
        subprocess.run([args.llama_python, __file__, "--worker", str(job)], check=True)
        res = json.loads(out.read_text(encoding="utf-8"))

    common = {
        "generator": "tools/make_tokenizer_refs.py",
        "command": command,
        "llama_cpp_python_version": res["llama_cpp_python_version"],
        "calls": ("Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=A, special=P) "
                  "for ids (A=add_special, P=parse_special); llama_detokenize(vocab, ids, "
                  "remove_special=False, unparse_special=U) for detok*; llama_token_to_piece("
                  "vocab, id, lstrip=0, special) for pieces_sha256 (sha256 over 4-byte LE length"
                  " + piece, all ids); llama_vocab_get_attr for attrs_sha256 (4-byte LE each)"),
    }
    gemma = {**common, "model": {"file": model.name, "sha256": _sha256(model)},
             **res["vocabs"]["gemma3"]}
    _write_json(out_dir / "gemma3_tokenizer_refs.json", gemma)
    bpe = {**common, "base_vocab": {"file": Path(args.gpt2_vocab).name,
                                    "sha256": _sha256(Path(args.gpt2_vocab))},
           "note": ("the base vocabulary with tokenizer.ggml.pre replaced by each key of 'pre'; "
                    "ids[i] (add_special=True, parse_special=True), ids_nobos[i] (False, False) "
                    "and detok[i] (of ids[i], unparse_special=False) belong to texts[i]"),
           "texts": texts, "pre": {}}
    for pre in BPE_PRE_TYPES:
        v = res["vocabs"][f"gpt2/{pre}"]
        bpe["pre"][pre] = {k: v[k] for k in ("bos", "eos", "add_bos", "add_eos", "eog")}
        for k in ("ids", "ids_nobos", "detok"):
            bpe["pre"][pre][k] = [c[k] for c in v["cases"]]
    _write_json(out_dir / "bpe_pretokenizer_refs.json", bpe)
    print(f"{len(texts)} strings; wrote {out_dir}/gemma3_tokenizer_refs.json and "
          f"{out_dir}/bpe_pretokenizer_refs.json (llama-cpp-python "
          f"{res['llama_cpp_python_version']})")


if __name__ == "__main__":
    main()
