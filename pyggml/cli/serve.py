"""`pyggml serve -m MODEL [--host 127.0.0.1] [--port 8080] [-np N] [-c N_CTX] [--api-key KEY]`:
the OpenAI-compatible server (pyggml/server/)."""

from __future__ import annotations

import os
import sys


def add_model_arguments(p, n_ctx_default: int) -> None:
    """The model and run-size flags shared by `serve` and `chat` (llama.cpp's spellings)."""
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: Gemma 3 270M)")
    p.add_argument("-c", "--ctx-size", type=int, default=n_ctx_default,
                   help=f"KV cells in all (default {n_ctx_default})")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-tb", "--threads-batch", type=int, default=None)
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    p.add_argument("--chat-template", default=None,
                   help="a Jinja file or a built-in name (chatml, gemma, llama3, ...); default: "
                        "the model's own")


def load_llm(args, n_seq_max: int = 1):
    from pyggml.llm.runtime import LLM
    return LLM(args.model, n_ctx=args.ctx_size, n_batch=args.batch_size,
               n_ubatch=args.ubatch_size, n_threads=args.threads,
               n_threads_batch=args.threads_batch, n_seq_max=n_seq_max,
               flash_attn=args.flash_attn != "off", n_gpu_layers=args.n_gpu_layers)


def cmd_serve(args) -> int:
    import uvicorn

    from pyggml.server import bind_warning, make_server
    warn = bind_warning(args.host, args.api_key)
    if warn:
        print(f"pyggml: warning: {warn}", file=sys.stderr)
    llm = load_llm(args, n_seq_max=args.parallel)
    name = args.alias or os.path.basename(llm.path)
    server = make_server(llm, args.parallel, name, args.chat_template, args.api_key,
                         args.queue_size)
    print(f"pyggml: serving {name} on http://{args.host}:{args.port} ({args.parallel} slots, "
          f"{server.engine.n_ctx_slot} tokens each)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(server.app, host=args.host, port=args.port, log_level="warning",
                    lifespan="off", timeout_graceful_shutdown=2)
    finally:
        server.engine.stop()
        llm.close()
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching")
    add_model_arguments(s, 4096)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("-np", "--parallel", type=int, default=4,
                   help="slots: requests decoded together (each gets n_ctx / N tokens)")
    s.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    s.add_argument("--queue-size", type=int, default=64,
                   help="requests that may wait for a slot (beyond: 503)")
    s.add_argument("-a", "--alias", default=None, help="model name in the API")
    s.set_defaults(func=cmd_serve)
