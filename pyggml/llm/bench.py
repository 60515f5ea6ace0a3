"""`pyggml bench`: llama-bench's table (pp = prompt processing of N tokens, tg = generating N
tokens one by one; tokens/s as mean ± stddev over repetitions), optionally with llama.cpp run on
the same model and settings in the same invocation (`--compare-llamacpp`) through
llama-cpp-python, in this interpreter or another one (`--llamacpp-python`), for a ratio per row.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml import settings
from pyggml.errors import PyggmlError

WORKER = Path(__file__).resolve().parent.parent.parent / "tools" / "llamacpp_bench_worker.py"


@dataclass
class BenchRow:
    test: str           # "pp512" / "tg128"
    n_threads: int
    tps: list[float]    # tokens/s per repetition

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tps)

    @property
    def std(self) -> float:
        return statistics.stdev(self.tps) if len(self.tps) > 1 else 0.0


def _tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(100, min(n_vocab, 30000), n)]


def bench_pyggml(model_path, prompts, gens, threads, reps, n_ctx=None, n_ubatch=512,
                 flash_attn=True, n_gpu_layers=0, config=None,
                 progress: bool = False) -> list[BenchRow]:
    """config: an offload Config (pyggml.offload.config); each row's threads and the bench's
    context size replace its own. progress: a bar on stderr (one step per run)."""
    from tqdm import tqdm

    from pyggml.llm.runtime import LLM
    prompts, gens = [n for n in prompts if n > 0], [n for n in gens if n > 0]   # 0: skipped
    rows = []
    bar = tqdm(total=len(threads) * (len(prompts) + len(gens)) * reps, unit="run",
               desc="bench", disable=not progress, leave=False)
    need_ctx = n_ctx or max([*prompts, *gens, 1]) + 8
    for t in threads:
        cfg = None if config is None else config.with_values(
            {"threads": {"decode": t, "batch": t},
             "context": {"n_ctx": need_ctx, "n_ubatch": n_ubatch}}, f"pyggml bench -t {t}")
        with LLM(model_path, config=cfg, n_ctx=need_ctx, n_ubatch=n_ubatch, n_threads=t,
                 n_threads_batch=t, flash_attn=flash_attn, n_gpu_layers=n_gpu_layers) as llm:
            V = llm.hparams.n_vocab
            llm.eval(_tokens(min(8, need_ctx), V, 0))          # warm-up (graphs, pages)
            # and, as llama-bench does, one untimed run of each test before its repetitions
            # (a prompt of n tokens; a generated token): the runs measure graphs that exist,
            # not the first build of a graph of that shape (its split, allocation and, on a
            # remote device, the graph upload)
            for n in prompts:
                llm.reset()
                llm.eval(_tokens(n, V, reps))
                tps = []
                for r in range(reps):
                    llm.reset()
                    toks = _tokens(n, V, r)
                    t0 = time.perf_counter()
                    llm.eval(toks)
                    tps.append(n / (time.perf_counter() - t0))
                    bar.update()
                rows.append(BenchRow(f"pp{n}", t, tps))
            for n in gens:
                llm.reset()
                llm.eval(_tokens(1, V, reps))
                tps = []
                for r in range(reps):
                    llm.reset()
                    # as llama-bench: the tokens are drawn, not sampled (each one's logits are
                    # computed and read back; an argmax would add work llama-bench does not do)
                    toks = _tokens(n, V, r)
                    t0 = time.perf_counter()
                    for tok in toks:
                        llm.eval([tok])
                    tps.append(n / (time.perf_counter() - t0))
                    bar.update()
                rows.append(BenchRow(f"tg{n}", t, tps))
    bar.close()
    return rows


# environment variables that change how llama.cpp's threads wait (OpenMP); llama.cpp's users run
# it without them (BENCHMARKS.md, "Decode on AMD Zen 4": the comparison protocol)
LLAMACPP_WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def llamacpp_nondefaults(no_extra_bufts: bool = False, no_repack: bool = False,
                         poll: int | None = None, env=None) -> list[str]:
    """How a llama.cpp run differs from llama.cpp at its defaults, one phrase each ([]: at its
    defaults): a waiting policy in the environment (inherited by every llama.cpp child
    process), its extra buffer types (repacked and AMX weights) or repacking off, --poll set.
    Every benchmark tool that prints a number of llama.cpp prints these (`announce_llamacpp`);
    tests/test_bench_protocol.py checks it."""
    env = settings.child_environment() if env is None else env
    notes = [f"{k}={env[k]} in the environment" for k in LLAMACPP_WAIT_ENV if k in env]
    if no_extra_bufts:
        notes.append("extra buffer types off (no repacked or AMX weights)")
    if no_repack:
        notes.append("repacking off (-nr)")
    if poll is not None:
        notes.append(f"--poll {poll}")
    return notes


def announce_llamacpp(notes: list[str], file=None) -> str:
    """The line that says llama.cpp is not at its defaults (printed to `file`, default stderr);
    '' and nothing printed when it is."""
    if not notes:
        return ""
    line = "llama.cpp NOT at its defaults: " + "; ".join(notes)
    print(line, file=sys.stderr if file is None else file, flush=True)
    return line


def bench_llamacpp(model_path, prompts, gens, threads, reps, python: str | None,
                   flash_attn=True, n_gpu_layers=0,
                   no_extra_bufts: bool = False) -> list[BenchRow]:
    """The same measurements through llama-cpp-python (WORKER script), in `python` or here.
    no_extra_bufts: load without llama.cpp's repacked/AMX buffer types."""
    announce_llamacpp(llamacpp_nondefaults(no_extra_bufts=no_extra_bufts))
    args = {"model": str(model_path), "prompts": prompts, "gens": gens, "threads": threads,
            "reps": reps, "flash_attn": flash_attn, "n_gpu_layers": n_gpu_layers,
            "no_extra_bufts": no_extra_bufts}
    if not WORKER.is_file():
        raise PyggmlError(f"{WORKER} not found: --compare-llamacpp runs llama.cpp through a "
                          f"helper of the source checkout (tools/); run it from a clone of "
                          f"pyggml (`pyggml bench` without it works from the installed package)")
    exe = python or sys.executable
    out = subprocess.run([exe, str(WORKER), json.dumps(args)], capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        why = out.stderr.strip()[-300:] or f"exit status {out.returncode}"
        if out.returncode == -4:
            why += " (SIGILL: try --llamacpp-no-extra-bufts on CPUs/VMs without AMX)"
        raise PyggmlError(f"llama.cpp benchmark failed ({exe}): {why}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return [BenchRow(r["test"], r["n_threads"], r["tps"]) for r in data]


def format_table(rows: list[BenchRow], ref: list[BenchRow] | None = None,
                 model_name: str = "", ref_notes: list[str] | None = None) -> str:
    """llama-bench's table; with `ref` (llama.cpp's rows) a ratio per row, and under the table
    what made llama.cpp's run differ from its defaults (`ref_notes`, llamacpp_nondefaults)."""
    head = f"| model | test | t | pyggml t/s |" + (" llama.cpp t/s | ratio |" if ref else "")
    sep = "|---|---|---|---|" + ("---|---|" if ref else "")
    lines = [head, sep]
    by_key = {(r.test, r.n_threads): r for r in (ref or [])}
    for r in rows:
        line = f"| {model_name} | {r.test} | {r.n_threads} | {r.mean:.2f} ± {r.std:.2f} |"
        if ref:
            o = by_key.get((r.test, r.n_threads))
            line += (f" {o.mean:.2f} ± {o.std:.2f} | {r.mean / o.mean:.2f} |" if o else " - | - |")
        lines.append(line)
    if ref and ref_notes:
        lines.append("")
        lines.append("llama.cpp NOT at its defaults: " + "; ".join(ref_notes))
    return "\n".join(lines)
