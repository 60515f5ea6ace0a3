"""Where a decoded token's time goes over RPC: the rpc-servers' CPU time against the client's
wall time, for our client and llama.cpp's, alternating.

    .venv/bin/python tools/rpc_server_time.py [--servers 1|2] [--reps 6] [--n1 32] [--n2 160]
        [--model PATH] [--llama-bench PATH]

Per client and repetition: `pyggml bench` / `llama-bench` with -p 0 -n N1, then -n N2 (1
thread, flash attention, -ngl 99, two servers split -ts 1,1), against the same unmodified
rpc-servers (1 thread each, started here). Per decoded token, (N2 run - N1 run) / (N2 - N1), so
loading, upload and warm-up cancel out: the servers' CPU time (utime + stime from /proc, all
servers together) and the wall time (from the N2 run's tokens/s). wall - server is what the
client adds: its own work, the wire, and waking up. Both clients drive the same server binary
through the same graph, so the difference of that remainder compares the clients; the servers'
own time moves by ±15% between connections on a noisy VM, which is why it is shown apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.rpc_server import RpcServer  # noqa: E402

LLAMA_BENCH = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-bench"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def tg_rate(who: str, a, eps: list[str], n: int) -> float:
    """Decode tokens/s of one `-n n` run of our client ("ours") or llama-bench ("llama.cpp")."""
    split = ([] if len(eps) == 1 else ["-ts", "1,1" if who == "ours" else "1/1"])
    head = [str(REPO / ".venv/bin/pyggml"), "bench"] if who == "ours" else [str(a.llama_bench)]
    args = head + ["-m", a.model, "--rpc", ",".join(eps), "-p", "0", "-n", str(n), "-r", "1",
                   "-t", "1", "-fa", "on", "-ngl", "99", *split]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr[-600:]}")
    for line in out.stdout.splitlines():
        if f"tg{n}" in line:
            return float(line.split("|")[-2].split("±")[0])
    raise RuntimeError(f"{' '.join(args)}: no tg{n} row in its output")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", type=int, choices=(1, 2), default=1)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--n1", type=int, default=32)
    ap.add_argument("--n2", type=int, default=160)
    ap.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--llama-bench", type=Path, default=LLAMA_BENCH)
    a = ap.parse_args()
    if a.n2 <= a.n1 or a.n1 < 1 or a.reps < 1:
        sys.exit("need 1 <= --n1 < --n2 and --reps >= 1")
    if not a.llama_bench.exists():
        sys.exit(f"{a.llama_bench} missing: run `make llamacpp-tools`")
    if a.model is None:
        from pyggml.models_default import ensure_default_model
        a.model = str(ensure_default_model())
    servers = [RpcServer.start(threads=1) for _ in range(a.servers)]
    eps = [s.endpoint for s in servers]
    rows: dict[str, list[tuple[float, float]]] = {"ours": [], "llama.cpp": []}
    try:
        for rep in range(a.reps):
            order = ("ours", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "ours")
            for who in order:
                cpu, rate = [], 0.0
                for n in (a.n1, a.n2):
                    c0 = sum(cpu_s(s.proc.pid) for s in servers)
                    rate = tg_rate(who, a, eps, n)
                    cpu.append(sum(cpu_s(s.proc.pid) for s in servers) - c0)
                server_ms = (cpu[1] - cpu[0]) / (a.n2 - a.n1) * 1e3
                wall_ms = 1e3 / rate
                rows[who].append((wall_ms, server_ms))
                print(f"{who:9s} rep {rep}: {wall_ms:6.2f} ms/token, servers {server_ms:6.2f} ms, "
                      f"rest {wall_ms - server_ms:5.2f} ms", flush=True)
    finally:
        for s in servers:
            s.stop()
    print(f"\n{a.servers} server(s), tg{a.n2} - tg{a.n1}, medians of {a.reps}:")
    print("| client | wall ms/token | servers' CPU ms/token | rest (client, wire) ms/token |")
    print("|---|---:|---:|---:|")
    for who, v in rows.items():
        print(f"| {who} | {statistics.median(x[0] for x in v):.2f} | "
              f"{statistics.median(x[1] for x in v):.2f} | "
              f"{statistics.median(x[0] - x[1] for x in v):.2f} |")


if __name__ == "__main__":
    main()
