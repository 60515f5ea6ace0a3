"""Aggregate decode speed of `pyggml serve` with 1, 2, 4, 8 parallel streams, and the
time-to-first-token of a short request while a long prompt is being admitted.

    .venv/bin/python tools/bench_serve.py [-m MODEL] [--streams 1,2,4,8] [-n 32] [-t 2] [-r 3]

Each run: N concurrent greedy /v1/completions streams with different prompts, `ignore_eos`, n
tokens each; aggregate tokens/s = N·n / (wall time from the first request to the last token,
prompts excluded: timed from each stream's first token). Medians of -r runs. TTFT: a 6-token
request alone, then while a ~2000-token prompt is admitted (chunks of n_ubatch).
"""

import argparse
import json
import statistics
import threading
import time

import httpx

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "My favourite fruit is", "1, 2, 3, 4,", "The sky is blue because",
           "In the beginning", "Water boils at"]


def stream_once(base, prompt, n, out, i, start):
    start.wait()
    t_first = None
    n_chunks = 0
    with httpx.Client(timeout=600) as c:
        with c.stream("POST", f"{base}/v1/completions",
                      json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                            "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    if t_first is None:
                        t_first = time.perf_counter()
                    n_chunks += 1
    out[i] = (t_first, time.perf_counter())


def aggregate(base, n_streams, n):
    out = [None] * n_streams
    start = threading.Barrier(n_streams)
    ts = [threading.Thread(target=stream_once, args=(base, PROMPTS[i % 8], n, out, i, start))
          for i in range(n_streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t0 = max(o[0] for o in out)          # every stream is generating from here on
    t1 = max(o[1] for o in out)
    # tokens generated after t0: each stream's share of (t1 - its first token) is measured
    # conservatively as N·(n-1) tokens over the span from the earliest first token
    t_start = min(o[0] for o in out)
    return n_streams * (n - 1) / (t1 - t_start), t0 - t_start


def ttft(base, prompt):
    t0 = time.perf_counter()
    with httpx.Client(timeout=600) as c:
        with c.stream("POST", f"{base}/v1/completions",
                      json={"prompt": prompt, "max_tokens": 1, "temperature": 0,
                            "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    return time.perf_counter() - t0


def main():
    from pyggml.llm.runtime import LLM
    from pyggml.server import make_server, start_in_thread
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    n_slots = max(streams)
    llm = LLM(args.model, n_ctx=n_slots * 512 if n_slots > 4 else 4096, n_threads=args.threads,
              n_seq_max=n_slots)
    rs = start_in_thread(make_server(llm, n_slots, "bench"))
    base = f"http://127.0.0.1:{rs.port}"
    rows = []
    try:
        aggregate(base, 1, 4)                                    # warm-up
        for n in streams:
            runs = [aggregate(base, n, args.n)[0] for _ in range(args.repetitions)]
            rows.append({"streams": n, "aggregate_tps": statistics.median(runs),
                         "runs": [round(x, 2) for x in runs]})
            print(json.dumps(rows[-1]), flush=True)
        short = "Hello, my name is"
        idle = statistics.median(ttft(base, short) for _ in range(3))
        long_prompt = "The history of the city goes back many centuries. " * 180
        busy = []
        for _ in range(3):
            th = threading.Thread(target=ttft, args=(base, long_prompt))
            th.start()
            time.sleep(0.3)
            busy.append(ttft(base, short))
            th.join()
        print(json.dumps({"ttft_idle_s": round(idle, 3),
                          "ttft_during_long_prompt_s": round(statistics.median(busy), 3),
                          "long_prompt_tokens": len(llm.tokenize(long_prompt))}), flush=True)
    finally:
        rs.stop()
        llm.close()


if __name__ == "__main__":
    main()
