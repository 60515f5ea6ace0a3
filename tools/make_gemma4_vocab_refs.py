"""Make tests/data/gemma4_tokenizer_refs.json: llama.cpp's token ids and texts for a Gemma 4
style vocabulary (`tokenizer.ggml.model = "gemma4"`: BPE by merge ranks over raw UTF-8 with ▁
for spaces, newline runs, <0xXX> byte fallback, BOS forced), which pyggml's tokenizer must
reproduce (tests/test_tokenizer_gemma4.py).

No Gemma 4 vocabulary ships with llama.cpp's tests, so `write_vocab` derives one,
deterministically, from tests/data/tokenizer-tests/ggml-vocab-llama-spm.gguf: its pieces, the
newline runs "\\n" .. "\\n\\n\\n\\n" and Gemma 4's turn markers as tokens, and as merges every
split of a piece into two pieces (ranked by the piece's id, then the left part's, then the
right part's). The test regenerates it and checks its sha256 against the references.

Run from the repository root with the project's Python (it needs `gguf`), naming the Python
that has llama_cpp (llama-cpp-python 0.3.36, never a pyggml dependency):

    .venv/bin/python tools/make_gemma4_vocab_refs.py --llama-python /work/ref/llamacpp-venv/bin/python

Stored per corpus string (tools/make_tokenizer_refs.corpus()): the ids with BOS, without and with
special-token parsing, and llama_detokenize's text of the ids (special tokens rendered).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPM_VOCAB = REPO / "tests" / "data" / "tokenizer-tests" / "ggml-vocab-llama-spm.gguf"
OUT = REPO / "tests" / "data" / "gemma4_tokenizer_refs.json"
EXTRA = [("\n", 1), ("\n\n", 1), ("\n\n\n", 1), ("\n\n\n\n", 1),
         ("<|turn>", 3), ("<turn|>", 3), ("<|channel>", 4)]   # (text, token type)


def write_vocab(path) -> Path:
    """The derived gemma4 vocabulary (a GGUF with no tensors) at `path`."""
    import gguf
    r = gguf.GGUFReader(str(SPM_VOCAB))
    tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in r.fields["tokenizer.ggml.tokens"].data]
    scores = [float(r.fields["tokenizer.ggml.scores"].parts[i][0])
              for i in r.fields["tokenizer.ggml.scores"].data]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in r.fields["tokenizer.ggml.token_type"].data]
    for text, t in EXTRA:
        tokens.append(text)
        scores.append(0.0)
        types.append(t)
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, t in enumerate(tokens):
        if types[i] != 1 or len(t) < 2:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            ia, ib = ids.get(a), ids.get(b)
            if ia is not None and ib is not None and types[ia] == types[ib] == 1:
                merges.append((i, ia, ib, f"{a} {b}"))
    merges.sort()
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv", "rope.dimension_count"):
        w.add_uint32(f"llama.{key}", int(r.fields[f"llama.{key}"].parts[-1][0]))
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_name("gemma4-test-vocab")
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_token_merges([m[3] for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)          # llama.cpp forces it on for Gemma 4
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _worker(job_path: str) -> None:
    import ctypes

    import llama_cpp
    from llama_cpp import Llama
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    m = Llama(job["vocab"], vocab_only=True, verbose=False)
    vocab = m._model.vocab

    def detok(ids):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, True)
        return buf.raw[:n].decode("utf-8", "replace")

    rows = []
    for text in job["texts"]:
        plain = m.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        special = m.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        rows.append({"text": text, "ids": plain, "ids_special": special,
                     "detok": detok(special)})
    Path(job["out"]).write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__,
                                            "rows": rows}), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", help="the Python that has llama_cpp")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker)
        return 0
    if not args.llama_python:
        ap.error("--llama-python is required")
    sys.path.insert(0, str(REPO / "tools"))
    from make_tokenizer_refs import corpus
    with tempfile.TemporaryDirectory() as tmp:
        vocab = write_vocab(Path(tmp) / "gemma4-vocab.gguf")
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"vocab": str(vocab), "texts": corpus(), "out": str(out)}),
                       encoding="utf-8")
        subprocess.run([args.llama_python, __file__, "--worker", str(job)], check=True)
        res = json.loads(out.read_text(encoding="utf-8"))
        res["vocab_sha256"] = hashlib.sha256(vocab.read_bytes()).hexdigest()
    OUT.write_text(json.dumps(res, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{len(res['rows'])} strings; wrote {OUT.relative_to(REPO)} "
          f"(llama-cpp-python {res['llama_cpp_python']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
