"""Issue 33's benchmark: a hybrid (gated DeltaNet) model sized like a laptop model, pyggml next to
llama.cpp on the same file.

1. Writes (once) a random-weight qwen35 GGUF with Qwen 3.5 0.8B's layer shapes (E 1024, 24 layers
   of which every 4th full attention: 8 query heads of 256 over 2 K/V heads, rope on 64 of 256
   in sections 11/11/10; DeltaNet layers of 16 key and 16 value heads of 128, conv kernel 4;
   FFN 3584) in Q4_K_M-like types (Q4_K, with Q6_K for attn_v / ffn_down on llama.cpp's
   "more bits" layers and for output), through tools/make_hybrid_models.py's writer. Its
   vocabulary is the test models' (384 tokens): the output matmul of a real 248k vocabulary is
   not in these numbers, the layers are.
2. Prompt and decode tokens/s: pyggml.llm.bench (pp / tg) and llama.cpp's own llama-bench at its
   defaults (BENCHMARKS.md's protocol), same threads.
3. A 5-turn chat on one sequence with a `--system`-token system prompt: each turn's prompt is
   the conversation so far (fixed replies, as a template re-renders them) plus a new 64-token
   user message, then 32 greedy tokens. pyggml in process (LLM + Generation with prefix reuse:
   resumes from the state checkpoint at the end of the previous prompt); llama-server
   (~/.cache/pyggml/llamacpp-0.3.36/bin/llama-server) through /completion with token ids and
   cache_prompt, at its defaults (context checkpoints on), and with --ctx-checkpoints 0 (the
   full re-processing users of older builds report; only the last turn is run there, on a
   fresh server: re-processing makes it a cold evaluation of that prompt). Per turn: wall
   seconds and the prompt tokens evaluated.

    flock /tmp/pyggml-cpu.lock .venv/bin/python tools/bench_hybrid.py [--dir /tmp/bench_hybrid]
        [-t 2] [--system 4096] [--turns 5] [--skip-speed] [--skip-chat]
    .venv/bin/python tools/bench_hybrid.py --ops [-t 1]     (only the two recurrent ops, alone:
        µs per token and layer at the model's shapes, T = 1 and 512, best of several runs, on
        the current kernel path; PYGGML_CPU_PATH / PYGGML_LIB choose path and library)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO))
import bench_serve  # noqa: E402  (Server, free_port)
import make_hybrid_models as H  # noqa: E402

N_LAYER = 24
LAPTOP = H.Shapes(e=1024, d=256, h=8, hkv=2, f=3584, h_k=16, h_v=16, dk=128, n_rot=64,
                  sections=(11, 11, 10, 0), n_ctx_train=262144)
USER_TOKENS, REPLY_TOKENS = 64, 32


def q4_k_m_type(name: str) -> str:
    """llama.cpp's Q4_K_M choice, simplified: Q6_K for output and for attn_v / ffn_down on the
    first and last eighth of the layers and every third between; Q4_K otherwise."""
    if name == "output.weight":
        return "q6_k"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        il = int(name.split(".")[1])
        if il < N_LAYER // 8 or il >= 7 * N_LAYER // 8 or (il - N_LAYER // 8) % 3 == 2:
            return "q6_k"
    return "q4_k"


def write_laptop_model(path: Path) -> Path:
    spec = H.Hybrid("qwen35", "rrra" * (N_LAYER // 4), ("q4_k",), l_cache=4, seed=77,
                    shapes=LAPTOP, type_of=q4_k_m_type)
    return H.write_model(spec, path, "qwen35-0.8b-shapes")


def op_times(threads: int) -> dict[str, float]:
    """µs per token of GATED_DELTA_NET (16 heads of 128 × 128) and SSM_CONV (6144 channels,
    kernel 4) at T = 1 and 512 tokens of one sequence."""
    from pyggml import Context, Graph, ops
    from pyggml.backend.cpu import CpuBackend, set_host_data
    rng = np.random.default_rng(1)

    def t_(ctx, a, ty="f32"):
        t = ctx.new_tensor(ty, list(reversed(a.shape)))
        set_host_data(t, a.astype(np.float32 if ty == "f32" else np.int32))
        return t
    cpu, res = CpuBackend(n_threads=threads), {}
    H, Dk, C = LAPTOP.h_v, LAPTOP.dk, 2 * LAPTOP.h_k * LAPTOP.dk + LAPTOP.h_v * LAPTOP.dk
    for T in (1, 512):
        ctx = Context(mem_size=256 << 20, no_alloc=False)
        k = rng.standard_normal((T, H, Dk))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        delta = ops.gated_delta(ctx, t_(ctx, rng.standard_normal((T, H, Dk))), t_(ctx, k),
                                t_(ctx, rng.standard_normal((T, H, Dk))),
                                t_(ctx, -np.abs(rng.standard_normal((T, H)))),
                                t_(ctx, np.full((T, H), 0.5)),
                                t_(ctx, rng.standard_normal((1, H * Dk * Dk)) * 0.1),
                                t_(ctx, np.zeros(T), "i32"), Dk ** -0.5)
        conv = ops.ssm_conv(ctx, t_(ctx, rng.standard_normal((T, C))),
                            t_(ctx, rng.standard_normal((C, 4))),
                            t_(ctx, rng.standard_normal((1, 3 * C))), t_(ctx, np.zeros(T), "i32"))
        for name, out in (("gated_delta", delta), ("ssm_conv", conv)):
            g = Graph()
            g.build_forward_expand(out)
            cpu.graph_compute(g)
            best = 1e9
            for _ in range(max(3, 200 // T)):
                t0 = time.perf_counter()
                cpu.graph_compute(g)
                best = min(best, time.perf_counter() - t0)
            res[f"{name} T={T}"] = best / T * 1e6
    return res


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def speed_rows(model: Path, threads: int, reps: int) -> list[str]:
    from pyggml.llm import bench
    ours = bench.bench_pyggml(str(model), [512], [128], [threads], reps)
    theirs = bench.bench_llama_bench(str(model), bench.tests_of([512], [128]), [0],
                                     bench.settings_of([threads]), reps)
    out = []
    for r in ours:
        ref = next((x for x in theirs if x.test == r.test), None)
        ratio = f"{r.mean / ref.mean:.2f}" if ref else "-"
        out.append(f"| {r.test} | {r.mean:.1f} ± {r.std:.1f} | "
                   f"{ref.mean:.1f} ± {ref.std:.1f} | {ratio} | {load_average()} |"
                   if ref else f"| {r.test} | {r.mean:.1f} | - | - | {load_average()} |")
    return out


def conversation(n_system: int, turns: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Token ids (the test vocabulary's ordinary tokens): a system prompt, per turn a user
    message and the reply the history keeps."""
    rng = np.random.default_rng(33)

    def ids(n):
        return [int(t) for t in rng.integers(260, H.M.N_VOCAB, n)]
    return ids(n_system), [ids(USER_TOKENS) for _ in range(turns)], \
        [ids(REPLY_TOKENS) for _ in range(turns)]


def prompts_of(system, users, replies) -> list[list[int]]:
    out, hist = [], list(system)
    for u, r in zip(users, replies):
        out.append(hist + u)
        hist = hist + u + r
    return out


def chat_pyggml(model: Path, prompts, threads: int, n_ctx: int) -> list[tuple[float, int]]:
    from pyggml.llm.generate import Generation, run
    from pyggml.llm.runtime import LLM
    from pyggml.llm.sampler import SamplingParams
    out = []
    with LLM(str(model), n_ctx=n_ctx, n_threads=threads) as m:
        for ids in prompts:
            t0 = time.perf_counter()
            g = Generation(m.tokenizer, ids, REPLY_TOKENS, SamplingParams(temperature=0.0),
                           stop_at_eog=False, seq_id=0, reuse_prefix=True)
            for _ in run(m.context, g):
                pass
            out.append((time.perf_counter() - t0, len(ids) - g.n_reused))
    return out


def chat_llama_server(model: Path, prompts, threads: int, n_ctx: int, extra: list[str],
                      log: Path) -> list[tuple[float, int]]:
    import httpx
    port = bench_serve.free_port()
    srv = bench_serve.Server("llama.cpp", [str(bench_serve.LLAMA_SERVER), "-m", str(model),
                                           "--host", "127.0.0.1", "--port", str(port),
                                           "-np", "1", "-c", str(n_ctx), "-t", str(threads),
                                           "-tb", str(threads), "--no-webui"] + extra,
                             port, log)
    out = []
    try:
        for ids in prompts:
            t0 = time.perf_counter()
            r = httpx.post(f"{srv.base}/completion", timeout=3600, json={
                "prompt": ids, "n_predict": REPLY_TOKENS, "cache_prompt": True,
                "temperature": 0.0, "ignore_eos": True})
            r.raise_for_status()
            out.append((time.perf_counter() - t0, int(r.json()["timings"]["prompt_n"])))
    finally:
        srv.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_hybrid"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--system", type=int, default=4096)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-chat", action="store_true")
    ap.add_argument("--ops", action="store_true")
    a = ap.parse_args(argv)
    if a.ops:
        from pyggml import _native
        print(f"path {_native.cpu_path()}, {a.threads} threads, load {load_average()}: " +
              json.dumps({k: round(v, 1) for k, v in op_times(a.threads).items()}))
        return 0
    a.dir.mkdir(parents=True, exist_ok=True)
    model = a.dir / "qwen35-0.8b-shapes-q4_k_m.gguf"
    if not model.exists():
        t0 = time.perf_counter()
        write_laptop_model(model)
        print(f"wrote {model} ({model.stat().st_size / 2**20:.0f} MiB, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"load average before: {load_average()}", flush=True)
    if not a.skip_speed:
        print("| test | pyggml t/s | llama-bench t/s | ours / theirs | load |")
        print("|---|---|---|---|---|")
        for row in speed_rows(model, a.threads, a.reps):
            print(row, flush=True)
    if not a.skip_chat:
        system, users, replies = conversation(a.system, a.turns)
        prompts = prompts_of(system, users, replies)
        n_ctx = len(prompts[-1]) + REPLY_TOKENS + 64
        runs = {"pyggml": chat_pyggml(model, prompts, a.threads, n_ctx)}
        print(f"pyggml done (load {load_average()})", flush=True)
        runs["llama-server"] = chat_llama_server(model, prompts, a.threads, n_ctx, [],
                                                 a.dir / "llama-server.log")
        print(f"llama-server done (load {load_average()})", flush=True)
        # without checkpoints every turn re-processes its whole prompt: turn N costs a cold
        # evaluation of prompt N, so only the last turn is run (on a fresh server)
        runs["llama-server --ctx-checkpoints 0"] = chat_llama_server(
            model, prompts[-1:], a.threads, n_ctx, ["--ctx-checkpoints", "0"],
            a.dir / "llama-server-nocp.log")
        print(f"llama-server --ctx-checkpoints 0 done (load {load_average()})", flush=True)
        print("| engine | " + " | ".join(f"turn {i + 1} s (tokens evaluated)"
                                         for i in range(a.turns)) + " |")
        print("|---|" + "---|" * a.turns)
        for name, r in runs.items():
            cells = ["-"] * (a.turns - len(r)) + [f"{s:.2f} ({n})" for s, n in r]
            print(f"| {name} | " + " | ".join(cells) + " |")
        last = {name: r[-1][0] for name, r in runs.items()}
        for name in list(last)[1:]:
            print(f"turn {a.turns}: {name} {last[name]:.2f} s / pyggml {last['pyggml']:.2f} s "
                  f"= {last[name] / last['pyggml']:.2f}x")
        (a.dir / "chat.json").write_text(json.dumps(runs))
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
