"""Speculative decoding benchmark: Qwen2.5-Coder-1.5B-Instruct with the 0.5B as draft, and
prompt lookup, against plain decoding, on code prompts (greedy, 2 threads by default).

    .venv/bin/python tools/bench_speculative.py                 # make models fetches the pair
    .venv/bin/python tools/bench_speculative.py --reps 3 -n 128 --llamacpp-bin DIR

Modes per prompt: plain (one token per graph), draft (-md 0.5B), lookup (prompt lookup); runs
are interleaved (rep → prompt → mode) because the machine is shared and noisy; the table shows
the median generation tokens/s over the repetitions, the ratio to plain in the same run, the
acceptance rate, and whether the text equals plain greedy's. With `--llamacpp-bin` (a folder
holding llama.cpp's llama-speculative), llama.cpp's speculative decoding of the same pair and
prompts runs interleaved with ours (its "decoded N tokens ... speed" line), at its defaults;
`--llamacpp-no-repack` (-nr: no weight repacking, whose AMX path faults on some VMs) and
`--llamacpp-poll 0` (its threads sleep instead of spinning while they wait) depart from them,
and the run prints that it did (BENCHMARKS.md, "Decode on AMD Zen 4": the protocol).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyggml.llm.runtime import LLM
from pyggml.llm.speculative import DraftModel, PromptLookup
from pyggml.models_pypi import ensure_qwen_coder, ensure_qwen_coder_draft

FILE = '''import json
import os


class Inventory:
    """Items in stock, by name."""

    def __init__(self, path):
        self.path = path
        self.items = {}
        if os.path.exists(path):
            with open(path) as f:
                self.items = json.load(f)

    def add(self, name, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError(f"only {have} of {name} in stock")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.items, f, indent=2)
'''


def chat(user: str) -> str:
    """Qwen2.5's chat format, written out (both engines tokenize the special tokens)."""
    return (f"<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


PROMPTS = {
    "complete": chat("Complete this Python function; answer with the code only.\n\n"
                     "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
                     "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"),
    "edit": chat("In this file, rename the method `total` to `count_all` and add a method "
                 "`has(name)` that says whether an item is in stock. Answer with the whole "
                 "file.\n\n```python\n" + FILE + "```"),
    "rewrite": chat("Rewrite this file with type hints on every method. Answer with the whole "
                    "file only.\n\n```python\n" + FILE + "```"),
}
MODES = ("plain", "draft", "lookup")


def run_pyggml(llm, prompt: str, n: int, draft) -> dict:
    st = llm.stats
    g0, t0, d0, a0, r0 = (st.n_gen_tokens, st.t_gen_s, st.spec.drafted, st.spec.accepted,
                          st.spec.rounds)
    out = llm.create_completion(prompt, max_tokens=n, temperature=0, draft=draft)
    ng, tg = st.n_gen_tokens - g0, st.t_gen_s - t0
    drafted, acc, rounds = st.spec.drafted - d0, st.spec.accepted - a0, st.spec.rounds - r0
    return {"tps": ng / tg if tg else 0.0, "n": ng, "text": out["choices"][0]["text"],
            "accept": acc / drafted if drafted else None,
            "k": drafted / rounds if rounds else None}


def run_llamacpp(bindir: Path, target: str, draft: str, prompt: str, n: int, threads: int,
                 draft_max: int, no_repack: bool = False, poll: int | None = None) -> dict | None:
    exe = next((bindir / x for x in ("llama-speculative", "llama-speculative-simple")
                if (bindir / x).exists()), None)
    if exe is None:
        return None
    cmd = [str(exe), "-m", target, "-md", draft, "-p", prompt, "-n", str(n), "--temp", "0",
           "-t", str(threads), "-td", str(threads), "-c", "4096", "--spec-draft-n-max",
           str(draft_max), "-s", "1"]
    if no_repack:
        cmd.append("-nr")
    if poll is not None:
        cmd += ["--poll", str(poll), "--poll-draft", str(poll)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    a = re.search(r"accept\s+=\s+([\d.]+)%", log)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"{exe.name} failed (exit {r.returncode}): {log[-800:]}")
    return {"tps": float(m.group(3)), "n": int(m.group(1)),
            "accept": float(a.group(1)) / 100 if a else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=128, help="tokens to generate per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--prompts", default=",".join(PROMPTS), help="some of " + ",".join(PROMPTS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--llamacpp-bin", type=Path, default=None,
                    help="folder with llama.cpp's llama-speculative (side by side)")
    ap.add_argument("--llamacpp-no-repack", action="store_true",
                    help="llama.cpp with -nr (no repacked weights; printed)")
    ap.add_argument("--llamacpp-poll", type=int, default=None,
                    help="llama.cpp's --poll/--poll-draft level (default: its own; printed)")
    args = ap.parse_args()
    if args.llamacpp_bin is not None:
        from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
        announce_llamacpp(llamacpp_nondefaults(no_repack=args.llamacpp_no_repack,
                                               poll=args.llamacpp_poll), file=sys.stdout)
    target, draft_path = str(ensure_qwen_coder()), str(ensure_qwen_coder_draft())
    prompts = [p for p in args.prompts.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    print(f"target {Path(target).name}, draft {Path(draft_path).name}, {args.threads} threads, "
          f"n={args.n}, draft_max={args.draft_max}, {args.reps} reps interleaved", flush=True)
    t0 = time.perf_counter()
    llm = LLM(target, n_ctx=4096, n_threads=args.threads)
    dm = DraftModel(draft_path, n_max=args.draft_max, n_threads=args.threads)
    drafts = {"plain": False, "draft": dm, "lookup": PromptLookup(n_max=args.draft_max)}
    llm.create_completion("hi", max_tokens=2, temperature=0, draft=dm)      # warm up both
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    res: dict = {}
    for rep in range(args.reps):
        for p in prompts:
            for mode in modes:
                r = run_pyggml(llm, PROMPTS[p], args.n, drafts[mode])
                res.setdefault((p, mode), []).append(r)
                acc = "-" if r["accept"] is None else f"{100 * r['accept']:.0f}%"
                k = "-" if r["k"] is None else f"{r['k']:.1f}"
                print(f"rep {rep} {p:8s} {mode:6s} {r['tps']:6.2f} t/s  n={r['n']}  "
                      f"accept={acc}  drafted/round={k}", flush=True)
            if args.llamacpp_bin is not None and "draft" in modes:
                r = run_llamacpp(args.llamacpp_bin, target, draft_path, PROMPTS[p], args.n,
                                 args.threads, args.draft_max, args.llamacpp_no_repack,
                                 args.llamacpp_poll)
                if r is not None:
                    res.setdefault((p, "llama.cpp draft"), []).append(r)
                    print(f"rep {rep} {p:8s} llama.cpp draft {r['tps']:6.2f} t/s  n={r['n']}  "
                          f"accept={100 * (r['accept'] or 0):.0f}%", flush=True)
        print_table(res, prompts, modes)
    dm.close()
    llm.close()
    return 0


def print_table(res: dict, prompts: list[str], modes: list[str]) -> None:
    """Medians so far (printed after every repetition: an interrupted run still has one)."""
    print()
    print("| prompt | mode | gen t/s (median) | × plain | acceptance | text = plain greedy |")
    print("|---|---|---|---|---|---|")
    for p in prompts:
        base = statistics.median(r["tps"] for r in res[(p, "plain")]) if (p, "plain") in res \
            else None
        for mode in modes + ["llama.cpp draft"]:
            rs = res.get((p, mode))
            if not rs:
                continue
            tps = statistics.median(r["tps"] for r in rs)
            accs = [r["accept"] for r in rs if r["accept"] is not None]
            acc = f"{100 * statistics.median(accs):.0f}%" if accs else "-"
            same = "-"
            if "text" in rs[0] and (p, "plain") in res:
                same = "yes" if rs[0]["text"] == res[(p, "plain")][0]["text"] else "no"
            ratio = f"{tps / base:.2f}" if base else "-"
            print(f"| {p} | {mode} | {tps:.2f} | {ratio} | {acc} | {same} |")

if __name__ == "__main__":
    sys.exit(main())
