"""Reranker references: small random-weight Qwen3-Reranker-style GGUFs (written here,
deterministic: the bytes depend only on the specs below) and llama-server's `/v1/rerank`
answers on them, for tests/test_rerank.py. llama-server is only needed to make the file:

    .venv/bin/python tools/make_rerank_refs.py \
        [--server ~/.cache/pyggml/llamacpp-0.3.36/bin/llama-server] \
        [--out tests/data/rerank_refs.json]

What llama.cpp calls a Qwen3 reranker (conversion/qwen.py, src/models/qwen3.cpp,
src/llama-graph.cpp build_pooling): architecture qwen3 with `qwen3.pooling_type` 4 (rank),
`qwen3.classifier.output_labels` ["yes", "no"], a head `cls.output.weight` [n_embd, 2] (the
"yes" and "no" rows of the LM head) applied to the last token's normed hidden state, then a
softmax; the score is its first value. The prompt is the named chat template
`tokenizer.chat_template.rerank` with {query} and {document} replaced, tokenized without BOS with
special tokens parsed; a model without it gets [BOS] query [EOS] [SEP] document [EOS] per the
vocabulary's add_* flags (tools/server/server-common.cpp format_prompt_rerank).

Two models: `qwen3-rerank` (a template with <|im_start|> / <|im_end|> control tokens, an F16
head) and `qwen3-rerank-plain` (no template, add_bos and add_sep set, a Q8_0 head). Both end the
prompt with the document (Qwen3's own template ends with a fixed assistant turn; on random
weights the last token's hidden state then hardly depends on the document, and every score
would be about the same). Stored per
model: the sha256 of the GGUF (the test regenerates the file and checks it is the same bytes)
and, per request of cases(), llama-server's response (results in its order, usage) with flash
attention on (`answers`, as pyggml's default) and off (`answers_fa_off`: how far llama.cpp's
own two attention paths are apart sets the test's tolerance). llama-server runs with -c 2048
-np 1 -t 2 --no-repack (the CPU's AMX tile kernels stop with SIGILL on this machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_arch_models as M  # noqa: E402

import gguf  # noqa: E402

SERVER = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-server"
SEP = M.N_VOCAB - 1                     # the "<sep>" control token
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "rerank_refs.json"

TEMPLATE = ("<|im_start|>system\nJudge whether the Document answers the Query: yes or no."
            "<|im_end|>\n<|im_start|>user\n<Query>: {query}<|im_end|>\n<|im_start|>assistant"
            "\n<Document>: {document}")

#: name -> (weight types round robin, head type, template, add_bos, add_sep, head scale, seed)
MODELS = {
    "qwen3-rerank": (("q8_0", "f16"), "f16", TEMPLATE, False, False, 1.5, 31),
    "qwen3-rerank-plain": (("f16", "q8_0"), "q8_0", None, True, True, 1.5, 32),
}


def _words(rng, n: int) -> str:
    return " ".join(f"w{int(i)}" for i in rng.integers(0, 120, n))


def cases() -> list[dict]:
    """The requests (bodies of POST /v1/rerank); deterministic."""
    rng = np.random.default_rng(7)
    q = _words(rng, 5)
    docs = [_words(rng, int(n)) for n in rng.integers(1, 30, 7)]
    return [
        {"query": q, "documents": docs},
        {"query": q, "documents": docs + [q, "caf\u00e9 \u2615 " + q], "top_n": 3},
        {"query": _words(rng, 12), "documents": [_words(rng, 200), _words(rng, 3), "w1"]},
        {"query": "w5", "documents": ["w5", "w6 w5", _words(rng, 9)], "top_n": 10},
    ]


def write_model(name: str, path) -> Path:
    """Write reranker `name` of MODELS to `path` (qwen3, 2 layers of make_arch_models' shapes)."""
    types, head_type, template, add_bos, add_sep, scale, seed = MODELS[name]
    s = M.Spec("qwen3", types, n_layer=2, qk_norm="head", kv={"rope.freq_base": 1000000.0},
               seed=seed)
    rng = np.random.default_rng(2000 + seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "qwen3")
    a = "qwen3"
    w.add_name(f"pyggml-random-{name}")
    for key, v in (("context_length", 4096), ("embedding_length", s.n_embd),
                   ("block_count", s.n_layer), ("feed_forward_length", s.n_ff),
                   ("attention.head_count", s.n_head), ("attention.head_count_kv", s.n_head_kv),
                   ("attention.key_length", s.head_dim), ("attention.value_length", s.head_dim),
                   ("rope.dimension_count", s.head_dim), ("vocab_size", M.N_VOCAB)):
        w.add_uint32(f"{a}.{key}", v)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1000000.0)
    w.add_uint32(f"{a}.pooling_type", 4)                        # LLAMA_POOLING_TYPE_RANK
    w.add_array(f"{a}.classifier.output_labels", ["yes", "no"])
    tokens, scores, ttypes = M._vocab()
    # control tokens for the template and the separator (in place of the last three pieces)
    tokens[-3:], ttypes[-3:] = ["<|im_start|>", "<|im_end|>", "<sep>"], [3, 3, 3]
    M.add_vocab(w, vocab=(tokens, scores, ttypes), add_bos=add_bos)
    w.add_add_eos_token(False)
    if add_sep:
        w.add_sep_token_id(SEP)
        w.add_bool("tokenizer.ggml.add_sep_token", True)
    if template is not None:
        w.add_chat_template([{"name": "rerank", "template": template}])
    k = 0
    tensors = M.tensors_of(s, rng)
    E = s.n_embd
    head = rng.standard_normal((2, E)) * scale / np.sqrt(E)
    tensors.append(("cls.output.weight", head.astype(np.float32)))
    for tname, arr in tensors:
        if arr.ndim == 1:
            w.add_tensor(tname, arr)
            continue
        if tname == "cls.output.weight":
            t = head_type
        else:
            t = types[k % len(types)]
            k += 1
        data = M._encode(arr, t)
        if t in ("f16", "f32"):
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=M._QT[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def server_answers(server: Path, model: Path, bodies: list[dict], fa: str) -> list[dict]:
    """llama-server --reranking's /v1/rerank responses to `bodies` (results and usage: the
    prompt tokens of all documents), with flash attention `fa` (on / off)."""
    port = _free_port()
    proc = subprocess.Popen([str(server), "-m", str(model), "--reranking", "--port", str(port),
                             "-c", "2048", "-np", "1", "-fa", fa, "-t", "2", "--no-repack",
                             "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > 60:
                raise SystemExit(f"llama-server did not start: {proc.stderr.read().decode()}")
            time.sleep(0.2)
        out = []
        for body in bodies:
            r = _post(port, "/v1/rerank", body)
            out.append({"results": r["results"], "usage": r["usage"]})
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", type=Path, default=SERVER)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    bodies = cases()
    # the references come from a llama-server off its defaults (--no-repack): say so
    from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
    announce_llamacpp(llamacpp_nondefaults(no_repack=True))
    version = subprocess.run([str(args.server), "--version"], capture_output=True, text=True)
    ref = {"llama_server": (version.stdout + version.stderr).strip().splitlines()[0],
           "cases": bodies, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in MODELS:
            p = write_model(name, Path(d) / f"{name}.gguf")
            answers = server_answers(args.server, p, bodies, "on")
            fa_off = server_answers(args.server, p, bodies, "off")
            ref["models"][name] = {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                                   "answers": answers, "answers_fa_off": fa_off}
            for a, b in zip(answers, fa_off):
                off = {x["index"]: x["relevance_score"] for x in b["results"]}
                print(name, [(x["index"], round(x["relevance_score"], 4),
                              round(x["relevance_score"] - off.get(x["index"], np.nan), 4))
                             for x in a["results"]], a["usage"])
    args.out.write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
