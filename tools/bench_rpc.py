"""Decode speed and traffic of a model split over loopback rpc-servers.

    .venv/bin/python tools/bench_rpc.py [--model PATH] [--tokens 32] [--reps 3] [--threads 1]
    .venv/bin/python tools/bench_rpc.py --vs-llamacpp [--model PATH] [--tokens 32]
        [--prompt 64] [--reps 3] [--threads 1] [--llama-bench PATH]

Runs, interleaved per repetition (the machine is noisy): CPU only; every layer on one server
(-ngl all); layers split over two servers (-ngl all, -ts 1,1). Servers: llama.cpp's rpc-server
from build/rpc-server/bin (make setup), on 127.0.0.1, `--threads` threads each, the same number
the local CPU backend gets. Prints per configuration the median decode tokens/s, the ratio to
CPU only, and per decoded token: bytes sent and received, and the commands sent.

--vs-llamacpp: our RPC client next to llama.cpp's own (llama-bench --rpc, from
~/.cache/pyggml/llamacpp-0.3.36/bin, `make llamacpp-tools`) against the same unmodified
rpc-servers (`--threads` threads each), every client with `--threads` threads, flash attention
on: `pyggml bench` and `llama-bench` with -p P -n N -r 1, alternating ours / theirs per
repetition (both run each test once untimed first: a prompt of P tokens, one generated token,
so neither times the first build and upload of a graph); configs: one server with every
layer and the output (-ngl 99), two servers (-ngl 99, -ts 1,1), the local CPU and one server
(-ngl n_layer/2: the last half of the layers and the output remote, llama.cpp's rule). Bytes per decoded token, for both clients alike: a
counting TCP proxy sits in front of each server for two extra runs with -n N and -n 2N (-p 0);
(bytes(2N) - bytes(N)) / N, so the weight upload and the warm-up cancel out. Ratios: of the
medians, and the median of each repetition's ours / theirs pair (run back to back, so both see
the same machine state) with how many pairs ours won. --configs 1,2,3 picks configurations.
--vs-tree PATH puts our client from another source tree (an earlier commit's worktree) in
llama.cpp's column: a before/after run of the client alone, against the same servers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from pyggml.backend import rpc  # noqa: E402
from pyggml.llm.runtime import LLM  # noqa: E402
from support.rpc_server import RpcServer  # noqa: E402

PROMPT = "The capital of France is"


def decode_run(llm, n_tokens: int, regs) -> tuple[float, dict]:
    """Decode tokens/s over n_tokens after the prompt, and traffic per decoded token."""
    gen = llm.generate(PROMPT, n_tokens + 1, temperature=0, stop_at_eog=False)
    next(gen)                           # prompt processed, first token sampled
    before = [r.traffic() for r in regs]
    t0 = time.perf_counter()
    n = sum(1 for _ in gen)
    dt = time.perf_counter() - t0
    after = [r.traffic() for r in regs]
    per = {"sent": 0.0, "received": 0.0, "commands": {}}
    for b, a in zip(before, after):
        per["sent"] += (a.bytes_sent - b.bytes_sent) / n
        per["received"] += (a.bytes_received - b.bytes_received) / n
        for c, k in a.commands.items():
            d = (k - b.commands.get(c, 0)) / n
            if d:
                per["commands"][c] = per["commands"].get(c, 0) + d
    return n / dt, per


LLAMA_BENCH = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-bench"


class CountingProxy:
    """127.0.0.1:<port> → target; counts bytes client→server (sent) and back (received), and
    turns: answers, i.e. server bytes that follow client bytes (a client that waits for each
    answer makes one turn per round trip; commands without an answer make none). Times, in
    seconds: server_s, from the client's last bytes to the answer's first (the server's work,
    a graph's compute included); client_s, from an answer's last bytes to the client's next
    (the client's own work between round trips)."""

    def __init__(self, target: str):
        import socket
        import threading
        self.target = target
        self.sent = self.received = self.turns = 0
        self.server_s = self.client_s = 0.0
        self._last = "received"
        self._t_last = None                     # perf_counter() of the latest bytes
        self._lock = threading.Lock()
        self._ls = socket.socket()
        self._ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(4)
        self.endpoint = f"127.0.0.1:{self._ls.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading
        while True:
            try:
                c, _ = self._ls.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=300)
            for sock in (c, s):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(c, s, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, "received"), daemon=True).start()

    def _pump(self, a, b, field: str) -> None:
        try:
            while True:
                data = a.recv(1 << 20)
                if not data:
                    break
                with self._lock:                # counted before it is forwarded
                    now = time.perf_counter()
                    setattr(self, field, getattr(self, field) + len(data))
                    if field != self._last and self._t_last is not None:
                        if field == "received":
                            self.turns += 1
                            self.server_s += now - self._t_last
                        else:
                            self.client_s += now - self._t_last
                    self._last, self._t_last = field, now
                b.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (a, b):
                try:
                    sock.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self._ls.close()


def _ours(model, rpc_eps, extra, p, n, t, tree: Path | None = None) -> dict:
    """`pyggml bench` of this checkout, or of the source tree `tree` (another commit's
    worktree: its package, and its libpyggml.so when it has built one)."""
    import os
    import subprocess
    args = ["-m", "pyggml.cli", "bench", "-m", model, "--rpc", ",".join(rpc_eps),
            "-p", str(p), "-n", str(n), "-r", "1", "-t", str(t), "-fa", "on", *extra]
    env = dict(os.environ)
    if tree is not None:
        lib = tree / "build/native/libpyggml.so"
        env.update(PYTHONPATH=str(tree),
                   PYGGML_LIB=str(lib if lib.is_file() else REPO / "build/native/libpyggml.so"))
    args = [str(REPO / ".venv/bin/python"), *args]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env,
                         cwd=str(tree or REPO))
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr[-600:]}")
    res = {}
    for ln in out.stdout.splitlines():
        cells = [c.strip() for c in ln.split("|")]
        if len(cells) > 4 and cells[2][:2] in ("pp", "tg"):
            res[cells[2][:2]] = float(cells[-2].split("±")[0])
    return res


def _theirs(bin_, model, rpc_eps, extra, p, n, t) -> dict:
    import json
    import subprocess
    args = [str(bin_), "-m", model, "--rpc", ",".join(rpc_eps), "-p", str(p), "-n", str(n),
            "-r", "1", "-t", str(t), "-fa", "on", "-o", "json", *extra]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr[-600:]}")
    res = {}
    for row in json.loads(out.stdout):
        res["pp" if row["n_prompt"] else "tg"] = float(row["avg_ts"])
    return res


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def vs_llamacpp(a) -> None:
    import json
    them = "llama.cpp" if a.vs_tree is None else f"tree {a.vs_tree}"
    print(f"load average before: {_load()}", flush=True)
    servers = [RpcServer.start(threads=a.threads) for _ in range(2)]
    try:
        eps = [s.endpoint for s in servers]
        probe = LLM(a.model, n_ctx=64, n_threads=1)
        n_layer = probe.hparams.n_layer
        probe.close()
        half = n_layer // 2
        # (name, servers, our extra flags, llama-bench's extra flags)
        configs = [("1 server, -ngl 99", eps[:1], ["-ngl", "99"], ["-ngl", "99"]),
                   ("2 servers, -ngl 99 -ts 1,1", eps, ["-ngl", "99", "-ts", "1,1"],
                    ["-ngl", "99", "-ts", "1/1"]),
                   (f"CPU + 1 server, -ngl {half}", eps[:1], ["-ngl", str(half)],
                    ["-ngl", str(half)])]
        if a.configs:
            keep = [x.strip() for x in a.configs.split(",")]
            if not all(x.isdigit() and 1 <= int(x) <= len(configs) for x in keep):
                sys.exit(f"--configs {a.configs!r}: numbers 1..{len(configs)}, comma-separated")
            configs = [configs[int(k) - 1] for k in keep]
        rows = []
        for name, seps, ours_x, theirs_x in configs:
            def theirs(eps, p, n):
                if a.vs_tree is not None:       # our client from another tree: its flags
                    return _ours(a.model, eps, ours_x, p, n, a.threads, tree=a.vs_tree)
                return _theirs(a.llama_bench, a.model, eps, theirs_x, p, n, a.threads)
            runs = {"pyggml": {"pp": [], "tg": []}, them: {"pp": [], "tg": []}}
            for i in range(a.reps):
                order = [("pyggml", lambda: _ours(a.model, seps, ours_x, a.prompt, a.tokens,
                                                  a.threads)),
                         (them, lambda: theirs(seps, a.prompt, a.tokens))]
                for who, fn in order if i % 2 == 0 else order[::-1]:
                    r = fn()
                    for k in ("pp", "tg"):
                        runs[who][k].append(r[k])
                print(f"  {name} rep {i}: "
                      + ", ".join(f"{w} pp {v['pp'][-1]:.1f} tg {v['tg'][-1]:.2f}"
                                  for w, v in runs.items()), flush=True)
            traffic = {}
            for who in ("pyggml", them):
                per = []
                for n in (a.tokens, 2 * a.tokens):
                    proxies = [CountingProxy(e) for e in seps]
                    peps = [pr.endpoint for pr in proxies]
                    if who == "pyggml":
                        _ours(a.model, peps, ours_x, 0, n, a.threads)
                    else:
                        theirs(peps, 0, n)
                    time.sleep(0.5)
                    per.append((sum(pr.sent for pr in proxies),
                                sum(pr.received for pr in proxies),
                                sum(pr.server_s for pr in proxies),
                                sum(pr.client_s for pr in proxies)))
                    for pr in proxies:
                        pr.close()
                traffic[who] = {"sent_per_token": (per[1][0] - per[0][0]) / a.tokens,
                                "received_per_token": (per[1][1] - per[0][1]) / a.tokens,
                                "server_ms_per_token": 1e3 * (per[1][2] - per[0][2]) / a.tokens,
                                "client_ms_per_token": 1e3 * (per[1][3] - per[0][3]) / a.tokens}
            row = {"config": name}
            for who, v in runs.items():
                row[who] = {k: round(statistics.median(x), 2) for k, x in v.items()}
                row[who]["runs"] = {k: [round(y, 2) for y in x] for k, x in v.items()}
                row[who].update({k: round(x, 2) if k.endswith("_ms_per_token") else round(x)
                                 for k, x in traffic[who].items()})
            row["ratio_pp"] = round(row["pyggml"]["pp"] / row[them]["pp"], 2)
            row["ratio_tg"] = round(row["pyggml"]["tg"] / row[them]["tg"], 2)
            # each repetition's pair ran back to back: their ratio sees the same machine state
            for k in ("pp", "tg"):
                pairs = [o / t for o, t in zip(runs["pyggml"][k], runs[them][k])]
                row[f"pair_ratio_{k}"] = round(statistics.median(pairs), 2)
                row[f"ours_ahead_{k}"] = f"{sum(x >= 1 for x in pairs)}/{len(pairs)}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        print(f"\nmodel {Path(a.model).name}; pp{a.prompt} / tg{a.tokens}, {a.threads} thread(s) "
              f"per client and per server; medians of {a.reps}; load average after: {_load()}")
        print(f"| config | pp ours | pp {them} | ratio (pairs; ours ahead) | tg ours | "
              f"tg {them} | ratio (pairs; ours ahead) | sent B/token ours / {them} | "
              f"received B/token ours / {them} |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            o, t = r["pyggml"], r[them]
            print(f"| {r['config']} | {o['pp']} | {t['pp']} | {r['ratio_pp']} "
                  f"({r['pair_ratio_pp']}; {r['ours_ahead_pp']}) | {o['tg']} | {t['tg']} | "
                  f"{r['ratio_tg']} ({r['pair_ratio_tg']}; {r['ours_ahead_tg']}) | "
                  f"{o['sent_per_token']} / {t['sent_per_token']} | "
                  f"{o['received_per_token']} / {t['received_per_token']} |")
    finally:
        for s in servers:
            s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vs-llamacpp", action="store_true",
                    help="our RPC client next to llama-bench --rpc (see above)")
    ap.add_argument("--prompt", type=int, default=64, help="--vs-llamacpp: prompt tokens")
    ap.add_argument("--llama-bench", type=Path, default=LLAMA_BENCH)
    ap.add_argument("--vs-tree", type=Path, default=None,
                    help="--vs-llamacpp with our client from this source tree (e.g. a worktree "
                         "of an earlier commit) in llama.cpp's place: a before/after run")
    ap.add_argument("--configs", default="",
                    help="--vs-llamacpp: which configurations, by number (1 one server, "
                         "2 two servers, 3 CPU + one server), comma-separated; default all")
    a = ap.parse_args()
    if a.model is None:
        from pyggml.models_default import ensure_default_model
        a.model = ensure_default_model()
    a.model = str(a.model)
    if a.vs_tree is not None and not (a.vs_tree / "pyggml").is_dir():
        sys.exit(f"--vs-tree {a.vs_tree}: no pyggml package there")
    if a.vs_llamacpp:
        if a.vs_tree is None and not a.llama_bench.exists():
            sys.exit(f"{a.llama_bench} missing: run `make llamacpp-tools`")
        vs_llamacpp(a)
        return
    servers = [RpcServer.start(threads=a.threads) for _ in range(2)]
    try:
        eps = [s.endpoint for s in servers]
        regs = rpc.register_endpoints(eps, timeout_s=120)
        devs = [f"RPC[{e}]" for e in eps]
        configs = {
            "cpu": None,
            "1 server": {"devices": devs[:1], "gpu_layers": "all"},
            "2 servers": {"devices": devs, "gpu_layers": "all", "tensor_split": [1, 1]},
        }
        llms = {name: LLM(a.model, config=cfg, n_ctx=512, n_threads=a.threads)
                for name, cfg in configs.items()}
        speeds = {name: [] for name in configs}
        traffic = {}
        for _ in range(a.reps):
            for name, llm in llms.items():
                tps, per = decode_run(llm, a.tokens, regs)
                speeds[name].append(tps)
                traffic[name] = per
        base = statistics.median(speeds["cpu"])
        print(f"model {Path(a.model).name}, {a.tokens} decoded tokens x {a.reps} reps, "
              f"{a.threads} thread(s) per process")
        print(f"{'config':<10} {'tok/s':>7} {'x cpu':>6} {'sent B/tok':>11} {'recv B/tok':>11}"
              f"  commands per token")
        for name in configs:
            med = statistics.median(speeds[name])
            per = traffic[name]
            cmds = ", ".join(f"{c} {k:.1f}" for c, k in sorted(per["commands"].items()))
            print(f"{name:<10} {med:7.2f} {med / base:6.2f} {per['sent']:11.0f} "
                  f"{per['received']:11.0f}  {cmds or '-'}")
        for llm in llms.values():
            llm.close()
    finally:
        rpc.unregister_endpoints([s.endpoint for s in servers])
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
