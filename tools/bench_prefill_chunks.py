"""What cutting prompts into chunks costs prefill, and what the server's step time does.

    .venv/bin/python tools/bench_prefill_chunks.py [-m MODEL] [-r 3]

1. `LLM.eval` of 1,536 prompt tokens in chunks of 512 / 128 / 64 (prompt tokens per second).
2. An in-process server per `step_target_s` (0.25: `serve`'s default --step-ms 250; 0: whole
   ubatches), one ~1,800-token request alone with max_tokens 1 (prompt tokens per second).
Rounds interleave the settings; medians.
"""

import argparse
import statistics
import time

import httpx

from pyggml.llm.runtime import LLM
from pyggml.server import make_server, start_in_thread

LONG = "The history of the city goes back many centuries. " * 180


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    a = ap.parse_args()
    llm = LLM(a.model, n_ctx=4 * 2560, n_threads=2, n_seq_max=4)
    ids = llm.tokenize(LONG)[:1536]
    chunks, served = {}, {}
    for rnd in range(a.rounds):
        for chunk in (512, 128, 64):
            llm.reset()
            t0 = time.perf_counter()
            for i in range(0, len(ids), chunk):
                llm.eval(ids[i:i + chunk])
            chunks.setdefault(chunk, []).append(len(ids) / (time.perf_counter() - t0))
        for target in (0.25, 0.0):
            rs = start_in_thread(make_server(llm, 4, "m", step_target_s=target))
            t0 = time.perf_counter()
            r = httpx.post(f"http://127.0.0.1:{rs.port}/v1/completions", timeout=900,
                           json={"prompt": f"Note {rnd} {target}. " + LONG, "max_tokens": 1,
                                 "temperature": 0})
            n = r.json()["usage"]["prompt_tokens"]
            served.setdefault(target, []).append(n / (time.perf_counter() - t0))
            rs.stop()
            for s in range(4):
                llm.reset(s)
    for k, v in chunks.items():
        print(f"LLM.eval, chunks of {k}: {statistics.median(v):.0f} t/s "
              f"(runs {[round(x) for x in v]})")
    for k, v in served.items():
        print(f"server, step_target_s {k}: {n} prompt tokens alone: {statistics.median(v):.0f} "
              f"t/s (runs {[round(x) for x in v]})")
    llm.close()


if __name__ == "__main__":
    main()
