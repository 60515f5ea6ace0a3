"""`pyggml bench`: llama-bench's measurements and outputs.

A test is pp N (a prompt of N tokens in one eval, chunked by n_batch and n_ubatch), tg N (N
tokens one by one) or pp N + tg M (both, timed together: `-pg`), each after a KV prefill of
`n_depth` tokens that is not timed (`-d`: the speed at a context already that long). Every
comma list of llama-bench is a list here (tokens, depths, batch sizes, KV types, threads) and
the runs are their product, in llama-bench's order. tokens/s as mean ± stddev over repetitions.
Outputs as llama-bench's: a markdown table (model, size, params, backend, threads, the settings
that are not at their defaults, test, t/s), CSV, JSON and JSON lines with llama-bench's fields.

With `--compare-llamacpp`, llama.cpp measures the same tests in the same invocation: its own
`llama-bench` binary (BENCHMARKS.md's protocol; `make llamacpp-tools`), or through
llama-cpp-python (`--llamacpp-python`, pp and tg without depth only), for a ratio per row.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyggml import settings
from pyggml.errors import PyggmlError

WORKER = Path(__file__).resolve().parent.parent.parent / "tools" / "llamacpp_bench_worker.py"
LLAMA_BENCH = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin/llama-bench"

#: llama-bench's defaults (tools/llama-bench/llama-bench.cpp, cmd_params_defaults); threads: the
#: physical cores (pyggml.backend.cpu.default_n_threads, as llama.cpp's cpu_get_num_math)
DEFAULTS = {"n_prompt": [512], "n_gen": [128], "n_pg": [], "n_depth": [0], "n_batch": [2048],
            "n_ubatch": [512], "type_k": ["f16"], "type_v": ["f16"], "flash_attn": ["on"],
            "reps": 5}


@dataclass(frozen=True)
class Setting:
    """What one LLM is opened with: the part of a test that needs a new context."""
    n_batch: int = 2048
    n_ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    n_threads: int = 1
    flash_attn: bool = True


@dataclass
class BenchRow:
    test: str           # llama-bench's name: "pp512", "tg128", "pp512+tg128", "... @ d4096"
    n_threads: int
    tps: list[float]    # tokens/s per repetition
    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0
    setting: Setting | None = None
    samples_ns: list[int] = field(default_factory=list)
    backend: str = "CPU"   # llama-bench's column: the devices other than the CPU, or CPU

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tps)

    @property
    def std(self) -> float:
        return statistics.stdev(self.tps) if len(self.tps) > 1 else 0.0

    def key(self) -> tuple:
        """What identifies the test across engines (compare_rows)."""
        s = self.setting or Setting(n_threads=self.n_threads)
        return (self.test, self.n_threads, s.n_batch, s.n_ubatch, s.type_k, s.type_v)


def test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's name of a test."""
    name = (f"pp{n_prompt}" if not n_gen else f"tg{n_gen}" if not n_prompt
            else f"pp{n_prompt}+tg{n_gen}")
    return name + (f" @ d{n_depth}" if n_depth > 0 else "")


def _tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(100, min(n_vocab, 30000), n)]


def tests_of(prompts, gens, pgs=()) -> list[tuple[int, int]]:
    """(n_prompt, n_gen) of each test in llama-bench's order; 0 skips a -p / -n entry."""
    return ([(n, 0) for n in prompts if n > 0] + [(0, n) for n in gens if n > 0]
            + [(p, g) for p, g in pgs if p > 0 or g > 0])


def settings_of(threads, n_batch=(2048,), n_ubatch=(512,), type_k=("f16",), type_v=("f16",),
                flash_attn=(True,)) -> list[Setting]:
    """The product of the lists, in llama-bench's nesting order (batch, ubatch, type_k, type_v,
    flash attention, threads)."""
    return [Setting(b, ub, tk, tv, t, fa) for b in n_batch for ub in n_ubatch for tk in type_k
            for tv in type_v for fa in flash_attn for t in threads]


def bench_pyggml(model_path, prompts, gens, threads, reps, n_ctx=None, n_ubatch=512,
                 flash_attn=True, n_gpu_layers=0, config=None, progress: bool = False, *,
                 pgs=(), depths=(0,), setting_list: list[Setting] | None = None
                 ) -> list[BenchRow]:
    """Every test (tests_of) at every depth under every setting (default: settings_of(threads)
    with n_ubatch and flash_attn), `reps` timed runs each after one untimed run, as llama-bench.
    config: an offload Config (pyggml.offload.config); each setting's threads and sizes
    replace its own. progress: a bar on stderr (one step per run).

    Depth: the prefill of `d` tokens is evaluated once per setting and depth (untimed); before
    each run the sequence is cut back to it (llama-bench restores a saved state: the same
    cells)."""
    from tqdm import tqdm

    from pyggml.llm.runtime import LLM
    tests = tests_of(prompts, gens, pgs)
    depths = list(depths) or [0]
    if setting_list is None:
        setting_list = settings_of(threads, n_ubatch=(n_ubatch,), flash_attn=(flash_attn,))
    rows = []
    bar = tqdm(total=len(setting_list) * len(depths) * len(tests) * reps, unit="run",
               desc="bench", disable=not progress, leave=False)
    need_ctx = n_ctx or max(d + p + g for d in depths for p, g in tests or [(1, 0)]) + 8
    for s in setting_list:
        cfg = None if config is None else config.with_values(
            {"threads": {"decode": s.n_threads, "batch": s.n_threads},
             "context": {"n_ctx": need_ctx, "n_ubatch": s.n_ubatch, "n_batch": s.n_batch},
             "kv": {"type_k": s.type_k, "type_v": s.type_v}},
            f"pyggml bench -t {s.n_threads}")
        with LLM(model_path, config=cfg, n_ctx=need_ctx, n_batch=s.n_batch,
                 n_ubatch=s.n_ubatch, n_threads=s.n_threads, n_threads_batch=s.n_threads,
                 flash_attn=s.flash_attn, n_gpu_layers=n_gpu_layers, type_k=s.type_k,
                 type_v=s.type_v) as llm:
            V = llm.hparams.n_vocab
            backend = ",".join(dict.fromkeys(b.device.name.rstrip("0123456789")
                                             for b in llm.backends
                                             if b.device.name != "CPU")) or "CPU"
            llm.eval(_tokens(min(8, need_ctx), V, 0))          # warm-up (graphs, pages)
            for d in depths:
                llm.reset()
                if d:
                    llm.eval(_tokens(d, V, 1000 + d))
                for n_p, n_g in tests:
                    # as llama-bench, one untimed run of each test before its repetitions (a
                    # prompt of n tokens; a generated token): the runs measure graphs that
                    # exist, not the first build of a graph of that shape (its split,
                    # allocation and, on a remote device, the graph upload)
                    llm.truncate(0, d)
                    if n_p:
                        llm.eval(_tokens(n_p, V, reps))
                    if n_g:
                        llm.eval(_tokens(1, V, reps))
                    ns = []
                    for r in range(reps):
                        llm.truncate(0, d)
                        prompt, gen = _tokens(n_p, V, r), _tokens(n_g, V, r + 7919)
                        t0 = time.perf_counter()
                        if prompt:
                            llm.eval(prompt)
                        # as llama-bench: the tokens are drawn, not sampled (each one's logits
                        # are computed and read back; an argmax would add work llama-bench
                        # does not do)
                        for tok in gen:
                            llm.eval([tok])
                        ns.append(max(1, int((time.perf_counter() - t0) * 1e9)))
                        bar.update()
                    rows.append(BenchRow(test_name(n_p, n_g, d), s.n_threads,
                                         [1e9 * (n_p + n_g) / t for t in ns], n_p, n_g, d, s,
                                         ns, backend))
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


def llama_bench_argv(exe, model_path, tests, depths, setting_list, reps) -> list[str]:
    """llama-bench's command line for the same tests (-o json); one -pg per pp+tg test."""
    def csv(xs):
        return ",".join(str(x) for x in dict.fromkeys(xs))
    ss = setting_list
    argv = [str(exe), "-m", str(model_path), "-r", str(reps), "-o", "json",
            "-p", csv([p for p, g in tests if not g]) or "0",
            "-n", csv([g for p, g in tests if not p]) or "0",
            "-d", csv(depths), "-b", csv(s.n_batch for s in ss), "-ub", csv(s.n_ubatch for s in ss),
            "-ctk", csv(s.type_k for s in ss), "-ctv", csv(s.type_v for s in ss),
            "-t", csv(s.n_threads for s in ss),
            "-fa", csv("on" if s.flash_attn else "off" for s in ss)]
    for p, g in tests:
        if p and g:
            argv += ["-pg", f"{p},{g}"]
    return argv


def rows_from_llama_bench_json(data: list[dict]) -> list[BenchRow]:
    """llama-bench's `-o json` records as rows."""
    rows = []
    for r in data:
        s = Setting(int(r["n_batch"]), int(r["n_ubatch"]), str(r["type_k"]), str(r["type_v"]),
                    int(r["n_threads"]), int(r.get("flash_attn", 1)) != 0)
        rows.append(BenchRow(test_name(int(r["n_prompt"]), int(r["n_gen"]), int(r["n_depth"])),
                             s.n_threads, [float(x) for x in r["samples_ts"]], int(r["n_prompt"]),
                             int(r["n_gen"]), int(r["n_depth"]), s,
                             [int(x) for x in r["samples_ns"]]))
    return rows


def bench_llama_bench(model_path, tests, depths, setting_list, reps, exe=LLAMA_BENCH
                      ) -> list[BenchRow]:
    """The same tests through llama.cpp's own llama-bench binary, at its defaults otherwise
    (BENCHMARKS.md's protocol), in the environment llama.cpp's tools inherit."""
    announce_llamacpp(llamacpp_nondefaults())
    exe = Path(exe)
    if not exe.is_file():
        raise PyggmlError(f"{exe} not found: `make llamacpp-tools` builds llama.cpp's "
                          f"llama-bench (or compare through llama-cpp-python: "
                          f"--llamacpp-python PYTHON, pp and tg without depth only)")
    argv = llama_bench_argv(exe, model_path, tests, depths, setting_list, reps)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=6 * 3600,
                         env=settings.child_environment())
    if out.returncode != 0:
        why = out.stderr.strip()[-300:] or f"exit status {out.returncode}"
        raise PyggmlError(f"llama-bench failed ({' '.join(argv[:3])} ...): {why}")
    try:
        return rows_from_llama_bench_json(json.loads(out.stdout))
    except (ValueError, KeyError, TypeError) as e:
        raise PyggmlError(f"llama-bench's JSON could not be read ({e}): "
                          f"{out.stdout[:200]!r}") from None


def bench_llamacpp(model_path, prompts, gens, threads, reps, python: str | None,
                   flash_attn=True, n_gpu_layers=0,
                   no_extra_bufts: bool = False) -> list[BenchRow]:
    """The same measurements through llama-cpp-python (WORKER script), in `python` or here:
    pp and tg at depth 0 with llama-bench's batch sizes and f16 KV only.
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


# ---- outputs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFacts:
    """What llama-bench's model columns show: its description, size in bytes, parameters."""
    desc: str
    filename: str
    size: int
    n_params: int

    @classmethod
    def of(cls, path) -> "ModelFacts":
        from pyggml.gguf import open_gguf
        with open_gguf(path) as g:
            n_params = sum(int(np.prod(t.ne)) for t in g.tensors.values())
            size = g.n_bytes
            ft = g.get_int("general.file_type", None)
            arch = g.arch
        try:
            from gguf import LlamaFileType
            ftype = LlamaFileType(ft).name.removeprefix("MOSTLY_") if ft is not None else "?"
        except ValueError:
            ftype = "?"
        label = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
        return cls(f"{arch} {label} {ftype}", Path(path).name, size, n_params)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


#: llama-bench's record fields this engine has (its `-o csv/json/jsonl`)
FIELDS = ("model_filename", "model_type", "model_size", "model_n_params", "backends",
          "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "n_gpu_layers", "flash_attn",
          "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts",
          "stddev_ts")


def record(row: BenchRow, model: ModelFacts, backend: str = "CPU", n_gpu_layers: int = 0,
           test_time: str = "") -> dict:
    """One llama-bench JSON record of a row."""
    s = row.setting or Setting(n_threads=row.n_threads)
    ns = row.samples_ns or [int(1e9 * (row.n_prompt + row.n_gen) / t) for t in row.tps if t]
    return {"model_filename": model.filename, "model_type": model.desc,
            "model_size": model.size, "model_n_params": model.n_params, "backends": backend,
            "n_batch": s.n_batch, "n_ubatch": s.n_ubatch, "n_threads": s.n_threads,
            "type_k": s.type_k, "type_v": s.type_v, "n_gpu_layers": n_gpu_layers,
            "flash_attn": int(s.flash_attn), "n_prompt": row.n_prompt, "n_gen": row.n_gen,
            "n_depth": row.n_depth, "test_time": test_time,
            "avg_ns": int(statistics.fmean(ns)) if ns else 0,
            "stddev_ns": int(statistics.stdev(ns)) if len(ns) > 1 else 0,
            "avg_ts": row.mean, "stddev_ts": row.std,
            "samples_ns": ns, "samples_ts": list(row.tps)}


def _varying_columns(rows: list[BenchRow]) -> list[str]:
    """The setting columns llama-bench shows: those not at its defaults or not all equal."""
    out = []
    d = Setting()
    for name, disp in (("n_batch", "n_batch"), ("n_ubatch", "n_ubatch"), ("type_k", "type_k"),
                       ("type_v", "type_v"), ("flash_attn", "fa")):
        vals = {getattr(r.setting or d, name) for r in rows}
        if vals != {getattr(d, name)}:
            out.append(name)
    return out


def compare_rows(rows: list[BenchRow], ref: list[BenchRow] | None) -> dict:
    """{row key: llama.cpp's row} for the rows both engines measured."""
    by_key = {r.key(): r for r in ref or []}
    # rows without a setting (llama-cpp-python's worker) are matched by test and threads
    loose = {(r.test, r.n_threads): r for r in ref or [] if r.setting is None}
    return {r.key(): by_key.get(r.key()) or loose.get((r.test, r.n_threads)) for r in rows}


def format_table(rows: list[BenchRow], ref: list[BenchRow] | None = None,
                 model_name: str = "", ref_notes: list[str] | None = None,
                 model: ModelFacts | None = None) -> str:
    """llama-bench's markdown table: model, size, params, backend, threads, the settings not at
    llama-bench's defaults, test, t/s; with `ref` (llama.cpp's rows) its t/s and a ratio per
    row, and under the table what made llama.cpp's run differ from its defaults (`ref_notes`,
    llamacpp_nondefaults)."""
    model = model or ModelFacts(model_name, model_name, 0, 0)
    extra = _varying_columns(rows)
    head = ["model", "size", "params", "backend", "threads", *extra, "test",
            "pyggml t/s" if ref else "t/s"] + (["llama.cpp t/s", "ratio"] if ref else [])
    lines = ["| " + " | ".join("fa" if h == "flash_attn" else h for h in head) + " |",
             "|" + "|".join("---:" if h.endswith("t/s") or h in ("ratio", "threads", "size",
                                                                   "params") else "---"
                            for h in head) + "|"]
    match = compare_rows(rows, ref) if ref else {}
    for r in rows:
        s = r.setting or Setting(n_threads=r.n_threads)
        cells = [model.desc, _size(model.size) if model.size else "-",
                 _params(model.n_params) if model.n_params else "-", r.backend,
                 str(r.n_threads)]
        cells += [str(int(getattr(s, c)) if c == "flash_attn" else getattr(s, c)) for c in extra]
        cells += [r.test, f"{r.mean:.2f} ± {r.std:.2f}"]
        if ref:
            o = match.get(r.key())
            cells += [f"{o.mean:.2f} ± {o.std:.2f}", f"{r.mean / o.mean:.2f}"] if o else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if ref and ref_notes:
        lines.append("")
        lines.append("llama.cpp NOT at its defaults: " + "; ".join(ref_notes))
    return "\n".join(lines)


def format_output(fmt: str, rows: list[BenchRow], model: ModelFacts, *,
                  ref: list[BenchRow] | None = None, ref_notes=None,
                  n_gpu_layers: int = 0) -> str:
    """`-o md|csv|json|jsonl` as llama-bench's printers (csv/json/jsonl: its field names; with
    `ref`, llama.cpp's records follow; `engine` says whose a record is)."""
    if fmt == "md":
        return format_table(rows, ref, model.desc, ref_notes=ref_notes, model=model)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    recs = [record(r, model, r.backend, n_gpu_layers, stamp) for r in rows]
    recs += [dict(record(r, model, "CPU", n_gpu_layers, stamp), engine="llama.cpp")
             for r in ref or []]
    for rec in recs[:len(rows)]:
        rec["engine"] = "pyggml"
    if fmt == "json":
        return json.dumps(recs, indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in recs)
    if fmt == "csv":
        import csv
        import io
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        cols = ["engine", *FIELDS]
        w.writerow(cols)
        for rec in recs:
            w.writerow([rec[c] for c in cols])
        return buf.getvalue().rstrip("\n")
    raise PyggmlError(f"output format {fmt!r}: expected md, csv, json or jsonl")

