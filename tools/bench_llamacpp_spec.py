"""llama.cpp's speculative decoding baseline for issue 21 (BENCHMARKS.md, "Speculative decoding:
llama.cpp's baseline"): Qwen2.5-Coder-1.5B-Instruct Q4_K_M with the 0.5B Q4_K_M draft, greedy,
on two code prompts, next to llama.cpp's plain decode of the same model in the same run.

    .venv/bin/python tools/bench_llamacpp_spec.py [-t 2] [-n 128]
        [-r 3] [--draft-max 16] [--json FILE]

Per repetition, alternating: `llama-speculative-simple -m 1.5B -md 0.5B -f PROMPT -n N
--temp 0 -t T -tb T -c 4096 --spec-type draft-simple --spec-draft-n-max K` for each prompt
(its "decoded N tokens ... speed" line, n_drafted, n_accept; it may decode a few tokens past
N), and `llama-bench -m 1.5B -p 0 -n N -t T` (plain decode tokens/s at
an empty context; the prompts here are ~100-250 tokens, which barely changes decode speed).
Binaries: ~/.cache/pyggml/llamacpp-0.3.36/bin (`make llamacpp-tools`). Medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path.home() / ".cache/pyggml/llamacpp-0.3.36/bin"
MODELS = Path.home() / ".cache/pyggml/models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

_FILE = '''import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def total(items):
    s = 0
    for it in items:
        s += it["price"] * it["qty"]
    return s


def main():
    items = load(sys.argv[1])
    print("total:", total(items))


if __name__ == "__main__":
    main()
'''

PROMPTS = {
    # complete a function: the model writes the body
    "complete": ("<|im_start|>system\nYou are Qwen, a helpful coding assistant.<|im_end|>\n"
                 "<|im_start|>user\nComplete this Python function. Reply with code only.\n\n"
                 "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
                 "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
                 "<|im_end|>\n<|im_start|>assistant\n"),
    # edit a given file: most of the answer repeats the file
    "edit": ("<|im_start|>system\nYou are Qwen, a helpful coding assistant.<|im_end|>\n"
             "<|im_start|>user\nAdd type hints to every function of this file and rename "
             "`items` to `orders`. Reply with the whole file only.\n\n```python\n" + _FILE
             + "```<|im_end|>\n<|im_start|>assistant\n"),
}


def spec_run(prompt_file: str, a) -> dict:
    args = [str(BIN / "llama-speculative-simple"), "-m", str(TARGET), "-md", str(DRAFT),
            "-f", prompt_file, "-n", str(a.n), "--temp", "0", "-t", str(a.threads),
            "-tb", str(a.threads), "-c", "4096", "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(a.draft_max)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    if out.returncode or not m:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {log[-800:]}")
    drafted = int(re.search(r"n_drafted = (\d+)", log).group(1))
    accepted = int(re.search(r"n_accept  = (\d+)", log).group(1))
    return {"tps": float(m.group(3)), "n": int(m.group(1)), "drafted": drafted,
            "accepted": accepted}


def plain_run(a) -> float:
    args = [str(BIN / "llama-bench"), "-m", str(TARGET), "-p", "0", "-n", str(a.n), "-t",
            str(a.threads), "-r", "1", "-o", "json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    for p in (TARGET, DRAFT, BIN / "llama-speculative-simple", BIN / "llama-bench"):
        if not p.exists():
            sys.exit(f"{p} missing (make models / make llamacpp-tools)")
    res = {"threads": a.threads, "n": a.n, "draft_max": a.draft_max, "load_before": load()}
    from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
    res["llamacpp_nondefaults"] = llamacpp_nondefaults()    # e.g. OMP_WAIT_POLICY inherited
    announce_llamacpp(res["llamacpp_nondefaults"], file=sys.stdout)
    print(f"load average before: {res['load_before']}", flush=True)
    runs = {"plain": []} | {k: [] for k in PROMPTS}
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for k, text in PROMPTS.items():
            files[k] = str(Path(d) / f"{k}.txt")
            Path(files[k]).write_text(text)
        for i in range(a.repetitions):
            runs["plain"].append(plain_run(a))
            print(f"  plain {runs['plain'][-1]:.2f} t/s", flush=True)
            for k in PROMPTS:
                runs[k].append(spec_run(files[k], a))
                r = runs[k][-1]
                print(f"  {k}: {r['tps']:.2f} t/s, accepted {r['accepted']}/{r['drafted']}",
                      flush=True)
    plain = statistics.median(runs["plain"])
    res["plain_tps"] = {"median": round(plain, 2), "runs": [round(x, 2) for x in runs["plain"]]}
    for k in PROMPTS:
        tps = statistics.median(r["tps"] for r in runs[k])
        acc = sum(r["accepted"] for r in runs[k]) / max(1, sum(r["drafted"] for r in runs[k]))
        res[k] = {"tps": round(tps, 2), "runs": [round(r["tps"], 2) for r in runs[k]],
                  "acceptance": round(acc, 3), "vs_plain": round(tps / plain, 2)}
    res["load_after"] = load()
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
