"""Make tests/data/invalid_utf8_tokenize_refs.json: llama.cpp's token ids for prompts that are not
valid UTF-8 (truncated, stray continuation bytes, overlong forms, encoded surrogates, values past
U+10FFFF), on a byte-level BPE vocabulary (the gpt-2 test vocabulary) and on an SPM one (the
default model, Gemma 3 270M).

llama.cpp runs through llama-cpp-python in its OWN virtual environment (never a pyggml
dependency). Run from the repository root:

    .venv/bin/python tools/make_invalid_utf8_refs.py --llama-python /path/to/venv/bin/python

The same file runs as the llama_cpp worker (`--worker JOB.json`) under that other Python.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPT2_VOCAB = REPO / "tests" / "data" / "tokenizer-tests" / "ggml-vocab-gpt-2.gguf"
OUT = REPO / "tests" / "data" / "invalid_utf8_tokenize_refs.json"

# byte strings, as hex so the JSON stays ASCII
CASES = [
    b"\xff", b"a\xffb", b"Hello \xfe world", b"\x80", b"\x80\x81\x82 x", b"\xc3", b"caf\xc3",
    b"caf\xc3 au lait", b"\xe4\xbd", b"\xe4\xbda", b"\xe4\xbd\xa0\xe5", b"\xf0\x9f\x98",
    b"\xf0\x9f\x98 smile", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
    b"\xed\xbf\xbf x", b"\xf4\x8f\xbf\xbf", b"\xf8\x88\x80\x80\x80", b"\xfc", b"abc\xe2\x82",
    b" \xe2\x82\xac \xe2\x82 \xe2", b"\xce\xbb\xff\xce\xbb", b"12\xff34", b"\xff\xfe\xfd\xfc",
    b"line\n\xff\nline", b"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa", b"\xef\xbb\xbfBOM",
]


def worker(job_path: str) -> None:
    import llama_cpp
    job = json.loads(Path(job_path).read_text())
    out = {"llama_cpp_python_version": llama_cpp.__version__, "vocabs": {}}
    for name, path in job["vocabs"].items():
        llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        out["vocabs"][name] = [llm.tokenize(bytes.fromhex(h), add_bos=False, special=False)
                               for h in job["cases"]]
    Path(job["out"]).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", help="a Python that can `import llama_cpp`")
    ap.add_argument("--gpt2-vocab", default=str(GPT2_VOCAB),
                    help="ggml-vocab-gpt-2.gguf of llama.cpp's tokenizer tests (default: %(default)s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(REPO))
    from pyggml.models_default import ensure_default_model
    vocabs = {"gemma3-spm": str(ensure_default_model())}
    if Path(args.gpt2_vocab).is_file():
        vocabs["gpt-2"] = args.gpt2_vocab
    with tempfile.TemporaryDirectory() as tmp:
        job = {"vocabs": vocabs, "cases": [c.hex() for c in CASES],
               "out": str(Path(tmp) / "out.json")}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        subprocess.run([args.llama_python, __file__, "--worker", str(Path(tmp) / "job.json")],
                       check=True)
        res = json.loads(Path(job["out"]).read_text())
    data = {"generator": "tools/make_invalid_utf8_refs.py",
            "command": "python tools/make_invalid_utf8_refs.py --llama-python LLAMA_VENV_PYTHON",
            "llama_cpp_python_version": res["llama_cpp_python_version"],
            "calls": "Llama(path, vocab_only=True).tokenize(bytes, add_bos=False, special=False)",
            "vocab_files": {k: Path(v).name for k, v in vocabs.items()},
            "cases_hex": job["cases"], "ids": res["vocabs"]}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT} ({len(CASES)} cases, vocabularies {', '.join(vocabs)})")


if __name__ == "__main__":
    main()
