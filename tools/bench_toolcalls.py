"""How often a model's tool calls are parsed with tool_choice "auto": pyggml serve against
llama-server, the same model, prompts and settings, through the official openai client.

    .venv/bin/python tools/bench_toolcalls.py MODEL.gguf [--llama-server PATH] [-t 2]
        [--seeds 0,1,2] [--json out.json]

Every prompt obviously needs one of three tools. Per server and run (temperature 0, then 0.7 with
each seed) it counts: replies with a parsed call (`message.tool_calls`), calls whose name is a
given tool and whose arguments parse as JSON, and replies whose `content` still holds tool markup
(`<tool_call>`, `"name":`, `[TOOL_CALLS]`, ...: a call that was not parsed and leaked). Both
servers listen on loopback ports of this machine only; llama-server runs as its users run it:
`--jinja` (its tool-call parsing), its default sampling and threads given with -t.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers exactly",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from_currency": {"type": "string"},
            "to_currency": {"type": "string"}},
            "required": ["amount", "from_currency", "to_currency"]}}},
]
PROMPTS = [
    "What is the weather in Paris right now?", "Is it raining in Tokyo today?",
    "How warm is it in Cairo at the moment?", "Tell me the current weather in Oslo.",
    "Use the tool to add 1234 and 4321.", "What is 98765 + 12345? Compute it exactly.",
    "Add 7 and 35.", "Please sum 1000000 and 2345678.",
    "Convert 100 US dollars to euros.", "How many yen is 50 pounds sterling?",
    "Convert 12.5 EUR to CHF.", "What are 2000 Swedish kronor in dollars?",
]
MARKUP = ("<tool_call>", "</tool_call>", '"name":', "[TOOL_CALLS]", "<function=",
          "<|python_tag|>", "to=functions.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc, timeout_s: float = 300.0) -> None:
    import httpx
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout_s} s")


def measure(base: str, seeds: list[int]) -> dict:
    import openai
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=300, max_retries=0)
    runs = [(0.0, 0)] + [(0.7, s) for s in seeds]
    parsed = valid = leaked = total = 0
    for temp, seed in runs:
        for p in PROMPTS:
            r = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": p}], tools=TOOLS,
                tool_choice="auto", max_tokens=128, temperature=temp, seed=seed)
            m = r.choices[0].message
            total += 1
            calls = m.tool_calls or []
            parsed += bool(calls)
            names = {t["function"]["name"] for t in TOOLS}
            ok = bool(calls)
            for c in calls:
                try:
                    json.loads(c.function.arguments)
                except (TypeError, ValueError):
                    ok = False
                ok = ok and c.function.name in names
            valid += ok
            leaked += any(k in (m.content or "") for k in MARKUP)
    return {"replies": total, "parsed_calls": parsed, "valid_calls": valid,
            "markup_in_content": leaked}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-server", default=str(Path.home() / ".cache/pyggml/llamacpp-0.3.36"
                                                  "/bin/llama-server"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = {"model": os.path.basename(args.model), "prompts": len(PROMPTS),
           "runs": 1 + len(seeds)}
    servers = {"pyggml": [sys.executable, "-m", "pyggml.cli", "serve", "-m", args.model,
                          "-np", "1", "-c", "4096", "-t", str(args.threads)]}
    if Path(args.llama_server).exists():
        servers["llama.cpp"] = [args.llama_server, "-m", args.model, "--jinja", "-np", "1",
                                "-c", "4096", "-t", str(args.threads)]
    else:
        print(f"llama-server not found at {args.llama_server} (make llamacpp-tools)",
              file=sys.stderr)
    for name, cmd in servers.items():
        port = free_port()
        proc = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, proc)
            out[name] = measure(base, seeds)
            print(name, out[name], file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
