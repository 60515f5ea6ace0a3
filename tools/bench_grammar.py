"""Decode speed with a JSON-schema constraint against without, and grammar compile times.

    .venv/bin/python tools/bench_grammar.py MODEL.gguf [-t 2] [-n 128] [-r 5] [--chat-template gemma]
        [--llama-server ~/.cache/pyggml/llamacpp-0.3.36/bin/llama-server]

Interleaved A/B: each repetition runs the same greedy chat request without a constraint, then
with a JSON schema that lets the model write long (an object with an array of strings), both
for exactly -n generated tokens (ignore_eos-like: max_tokens and no stop at the end of the
object is not possible under a schema, so the free run is cut at the same count as the
constrained one). Prints tokens/s per run, the medians, the median of the per-pair ratios (constrained /
free), the
compile time of a 20-property schema (cold: a new vocabulary table; warm: a new schema on a
built table; cached: the same schema again), the CPU model and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyggml.llm.completion import sampling_params          # noqa: E402
from pyggml.llm.chatturn import prompt_ids                 # noqa: E402
from pyggml.llm.chat import chat_prompt                    # noqa: E402
from pyggml.llm.generate import Generation, run            # noqa: E402
from pyggml.llm.grammar import (Constraint, GrammarSpec, Vocabulary,  # noqa: E402
                                vocabulary_for)
from pyggml.llm.runtime import LLM                         # noqa: E402

LONG_SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "string", "maxLength": 40}}},
    "required": ["items"], "additionalProperties": False}


def twenty_properties(k: int = 0) -> dict:
    kinds = [{"type": "string", "maxLength": 30}, {"type": "integer", "minimum": 0},
             {"type": "number"}, {"type": "boolean"}, {"enum": ["a", "b", "c"]},
             {"type": "array", "items": {"type": "string"}, "maxItems": 4}]
    props = {f"p{k}_{i}": kinds[i % len(kinds)] for i in range(20)}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def one_run(llm, ids, n: int, spec: GrammarSpec | None) -> tuple[float, int]:
    """(tokens per second of the generated tokens after the first, tokens generated)."""
    llm.reset()
    filt = None if spec is None else Constraint(vocabulary_for(llm.tokenizer,
                                                               llm.hparams.n_vocab), spec)
    gen = Generation(llm.tokenizer, ids, n, sampling_params(temperature=0), stop_at_eog=False,
                     token_filter=filt, reuse_prefix=False)
    it = run(llm.context, gen)
    next(it)                        # the prompt and the first token: not decode speed
    n0, t0 = len(gen.tokens), time.perf_counter()
    for _ in it:
        pass
    dt = time.perf_counter() - t0
    return (len(gen.tokens) - n0) / dt, len(gen.tokens)


def llama_server_runs(server: str, model: str, threads: int, n: int, reps: int,
                      template: str | None) -> dict:
    """The same A/B on llama-server (its own timings.predicted_per_second), greedy, the chat
    request with and without its json_schema field, interleaved."""
    import socket
    import subprocess

    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [server, "-m", model, "--jinja", "-np", "1", "-c", "1024", "-t", str(threads),
           "--host", "127.0.0.1", "--port", str(port)]
    if template:
        cmd += ["--chat-template", template]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        msgs = [{"role": "user", "content": "List many fruits as JSON: {\"items\": [...]}"}]

        def one(schema):
            body = {"messages": msgs, "max_tokens": n, "temperature": 0, "ignore_eos": True}
            if schema is not None:
                body["json_schema"] = schema
            r = httpx.post(base + "/v1/chat/completions", json=body, timeout=600).json()
            return r["timings"]["predicted_per_second"]
        one(None)
        free, con = [], []
        for _ in range(reps):
            free.append(one(None))
            con.append(one(LONG_SCHEMA))
    finally:
        proc.terminate()
        proc.wait(30)
    return {"free_tps": [round(x, 2) for x in free], "constrained_tps": [round(x, 2) for x in con],
            "ratio_median_of_pairs": round(statistics.median(c / f for c, f in zip(con, free)),
                                           3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--chat-template", default=None)
    ap.add_argument("--llama-server", default=None, metavar="PATH",
                    help="also run the A/B on this llama-server binary (make llamacpp-tools)")
    args = ap.parse_args(argv)
    with LLM(args.model, n_ctx=1024, n_threads=args.threads) as llm:
        t0 = time.perf_counter()
        Vocabulary(llm.tokenizer, llm.hparams.n_vocab)
        t_vocab = time.perf_counter() - t0
        vocab = vocabulary_for(llm.tokenizer, llm.hparams.n_vocab)
        t0 = time.perf_counter()
        Constraint(vocab, GrammarSpec.json_schema(twenty_properties(1)))
        t_warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        Constraint(vocab, GrammarSpec.json_schema(twenty_properties(1)))
        t_cached = time.perf_counter() - t0
        msgs = [{"role": "user", "content": "List many fruits as JSON: {\"items\": [...]}"}]
        ids = prompt_ids(llm, chat_prompt(llm.get_chat_template(args.chat_template), msgs))
        spec = GrammarSpec.json_schema(LONG_SCHEMA)
        one_run(llm, ids, 8, None)          # warm-up: graphs, pages
        free, con = [], []
        for _ in range(args.repetitions):
            f, _ = one_run(llm, ids, args.n_predict, None)
            c, n_c = one_run(llm, ids, args.n_predict, spec)
            free.append(f)
            con.append(c)
        load = os.getloadavg()
    mf, mc = statistics.median(free), statistics.median(con)
    pair = statistics.median(c / f for c, f in zip(con, free))
    llama = None
    if args.llama_server:
        llama = llama_server_runs(args.llama_server, args.model, args.threads, args.n_predict,
                                  args.repetitions, args.chat_template)
    print(json.dumps({
        "model": os.path.basename(args.model), "cpu": cpu_model(), "threads": args.threads,
        "n_predict": args.n_predict, "free_tps": [round(x, 2) for x in free],
        "constrained_tps": [round(x, 2) for x in con], "median_free_tps": round(mf, 2),
        "median_constrained_tps": round(mc, 2),
        "ratio_median_of_pairs": round(pair, 3),
        "compile_20_props_s": {"vocabulary_table": round(t_vocab, 3),
                               "new_schema": round(t_warm, 4), "cached": round(t_cached, 5)},
        "llama.cpp": llama, "loadavg": [round(x, 2) for x in load]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
