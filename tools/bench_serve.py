"""Aggregate decode speed of `pyggml serve -np N` next to llama.cpp's `llama-server -np N`, and
the time-to-first-token of a short request while a long prompt is being admitted.

    .venv/bin/python tools/bench_serve.py [-m MODEL] [--streams 1,2,4,8] [-n 64] [-t 2] [-r 3]
        [--llama-server PATH | --no-llama-server] [--slot-ctx 2560] [--json FILE]

Both servers run as their own processes (the client threads here never share a GIL with our
engine), on loopback ports, with the same model file, threads (-t; llama-server also -tb), slots
(-np N) and context per slot (-c N·slot_ctx). For each N both servers are started, then the
repetitions alternate ours / llama.cpp (A B A B). One run: N concurrent greedy /v1/completions
streams (temperature 0, `ignore_eos`, n tokens each, different prompts), released together.
Aggregate decode tokens/s = the SSE token chunks that arrive while every stream is generating
(from the last stream's first token to the first stream's last token) / that span: steady-state
decode, prompt processing excluded. Medians of -r runs.

TTFT (with the -np 4 servers, or the largest N below 4): time to the first streamed token of a
short prompt alone ("idle"), then sent 0.3 s after a ~1,800-token prompt ("busy"); every prompt
starts with a prefix never sent before, so neither server's prompt cache holds it; medians,
alternating the servers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
LLAMA_SERVER = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-server"
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "My favourite fruit is", "1, 2, 3, 4,", "The sky is blue because",
           "In the beginning", "Water boils at"]
SHORT = "Hello, my name is"
LONG = "The history of the city goes back many centuries. " * 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process on a loopback port; `name` is 'pyggml' or 'llama.cpp'."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path):
        self.name, self.port = name, port
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: see {log}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{name} did not answer /health within 300 s: see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_servers(args, n_slots: int, want_llamacpp: bool, logdir: Path) -> list[Server]:
    ctx = n_slots * args.slot_ctx
    out = []
    p = free_port()
    out.append(Server("pyggml", [str(REPO / ".venv/bin/pyggml"), "serve", "-m", args.model,
                                 "--port", str(p), "-np", str(n_slots), "-c", str(ctx),
                                 "-t", str(args.threads)], p, logdir / f"pyggml-np{n_slots}.log"))
    if want_llamacpp:
        p = free_port()
        try:
            out.append(Server("llama.cpp", [str(args.llama_server), "-m", args.model,
                                            "--host", "127.0.0.1", "--port", str(p),
                                            "-np", str(n_slots), "-c", str(ctx),
                                            "-t", str(args.threads), "-tb", str(args.threads),
                                            "--no-webui"],
                              p, logdir / f"llama-server-np{n_slots}.log"))
        except Exception:
            out[0].stop()
            raise
    return out


def stream_once(base, prompt, n, out, i, start):
    """Streams one greedy completion; out[i] = the arrival times of its token chunks."""
    stamps = []
    start.wait()
    with httpx.Client(timeout=600) as c:
        with c.stream("POST", f"{base}/v1/completions",
                      json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                            "ignore_eos": True, "stream": True}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    if json.loads(line[6:])["choices"][0].get("text"):
                        stamps.append(time.perf_counter())
    out[i] = stamps


def aggregate(base: str, n_streams: int, n: int) -> float:
    """Steady-state aggregate decode tokens/s of n_streams concurrent streams."""
    out = [None] * n_streams
    start = threading.Barrier(n_streams)
    ts = [threading.Thread(target=stream_once, args=(base, PROMPTS[i % 8], n, out, i, start))
          for i in range(n_streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if any(not o for o in out):
        raise RuntimeError(f"{base}: a stream produced no tokens")
    t0 = max(o[0] for o in out)            # every stream is generating from here ...
    t1 = min(o[-1] for o in out)           # ... to here
    if n_streams == 1:
        return (len(out[0]) - 1) / (t1 - t0)
    n_tok = sum(sum(1 for t in o if t0 < t <= t1) for o in out)
    return n_tok / (t1 - t0)


def ttft(base: str, prompt: str) -> float:
    t0 = time.perf_counter()
    with httpx.Client(timeout=600) as c:
        with c.stream("POST", f"{base}/v1/completions",
                      json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                            "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    return time.perf_counter() - t0
    raise RuntimeError(f"{base}: no token")


_unique = iter(range(1 << 30))


def fresh(prompt: str) -> str:
    """prompt behind a prefix never sent before, so no server's prompt cache holds it."""
    return f"Note {next(_unique)}. {prompt}"


def ttft_busy(base: str) -> float:
    th = threading.Thread(target=ttft, args=(base, fresh(LONG)))
    th.start()
    time.sleep(0.3)
    t = ttft(base, fresh(SHORT))
    th.join()
    return t


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("-n", type=int, default=64, help="tokens per stream")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--slot-ctx", type=int, default=2560, help="context tokens per slot")
    ap.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    ap.add_argument("--no-llama-server", action="store_true")
    ap.add_argument("--no-ttft", action="store_true")
    ap.add_argument("--ttft-only", action="store_true", help="skip the aggregate runs")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--logdir", type=Path, default=Path("/tmp/pyggml-bench-serve"))
    args = ap.parse_args()
    if args.model is None:
        from pyggml.models_default import ensure_default_model
        args.model = str(ensure_default_model())
    want_ll = not args.no_llama_server
    if want_ll and not args.llama_server.exists():
        sys.exit(f"{args.llama_server} missing: run `make llamacpp-tools` or pass "
                 "--no-llama-server")
    args.logdir.mkdir(parents=True, exist_ok=True)
    streams = [int(x) for x in args.streams.split(",")]
    ttft_n = max([n for n in streams if n <= 4] or streams[:1])
    result = {"model": os.path.basename(args.model), "threads": args.threads, "n": args.n,
              "load_before": uptime(), "rows": []}
    print(f"load average before: {result['load_before']}", flush=True)
    for n_slots in streams:
        servers = start_servers(args, n_slots, want_ll, args.logdir)
        try:
            for s in servers:
                aggregate(s.base, n_slots, 8)                         # warm-up
            runs = {s.name: [] for s in servers}
            for _ in range(0 if args.ttft_only else args.repetitions):
                for s in servers:
                    runs[s.name].append(aggregate(s.base, n_slots, args.n))
            row = {"streams": n_slots}
            for name, r in runs.items() if not args.ttft_only else ():
                row[name] = round(statistics.median(r), 2)
                row[name + "_runs"] = [round(x, 2) for x in r]
            if "llama.cpp" in row:
                row["ratio"] = round(row["pyggml"] / row["llama.cpp"], 2)
            if not args.ttft_only:
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
            if n_slots == ttft_n and not args.no_ttft:
                t = {s.name: {"idle": [], "busy": []} for s in servers}
                for _ in range(args.repetitions):
                    for s in servers:
                        t[s.name]["idle"].append(ttft(s.base, fresh(SHORT)))
                        t[s.name]["busy"].append(ttft_busy(s.base))
                tt = {"slots": n_slots}
                for name, d in t.items():
                    idle, busy = statistics.median(d["idle"]), statistics.median(d["busy"])
                    tt[name] = {"idle_s": round(idle, 3), "busy_s": round(busy, 3),
                                "busy_over_idle": round(busy / idle, 2),
                                "idle_runs": [round(x, 3) for x in d["idle"]],
                                "busy_runs": [round(x, 3) for x in d["busy"]]}
                result["ttft"] = tt
                print(json.dumps(tt), flush=True)
        finally:
            for s in servers:
                s.stop()
    for row in result["rows"]:
        for name in ("pyggml", "llama.cpp"):
            if name in row:
                row[name + "_vs_1"] = round(row[name] / result["rows"][0][name], 2)
    result["load_after"] = uptime()
    print(f"load average after: {result['load_after']}", flush=True)
    print("| streams | pyggml t/s | vs 1 | llama-server t/s | vs 1 | ours / theirs |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in result["rows"]:
        print(f"| {row['streams']} | {row['pyggml']} ({', '.join(map(str, row['pyggml_runs']))})"
              f" | {row['pyggml_vs_1']}× | {row.get('llama.cpp', '–')} "
              f"({', '.join(map(str, row.get('llama.cpp_runs', [])))}) | "
              f"{row.get('llama.cpp_vs_1', '–')}× | {row.get('ratio', '–')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
