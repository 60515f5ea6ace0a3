"""`pyggml serve -m MODEL [--host 127.0.0.1] [--port 8080] [-np N] [-c N_CTX] [--api-key KEY]`:
the OpenAI-compatible server (pyggml/server/)."""

from __future__ import annotations

import errno
import os
import sys

from pyggml.cli.args import (add_draft_args, add_grammar_args, bounded, draft_from_args,
                             grammar_from_args, positive_int)
from pyggml.cmdline import (add_lora_args, add_model_args, add_offload_args, lora_from_args,
                             run_options)
from pyggml.errors import PyggmlError
from pyggml.offload.flags import config_from_cli


port_number = bounded(int, 1, 65535, what="a port number 1..65535")
nonnegative_ms = bounded(float, 0.0, what="milliseconds >= 0")


def add_model_arguments(p) -> None:
    """The model, run-size, offload, LoRA, speculative-decoding and constrained-output flags
    (pyggml.cmdline, cli/args.py) and the chat template: what `serve` and `chat` share."""
    add_model_args(p)
    add_offload_args(p)
    add_lora_args(p)
    add_draft_args(p)
    add_grammar_args(p)
    p.add_argument("--chat-template", default=None,
                   help="a Jinja file or a built-in name (chatml, gemma, llama3, ...); default: "
                        "the model's own")


def load_llm(args, n_seq_max: int = 1):
    from pyggml.llm.runtime import LLM
    opts = dict(run_options(args), n_seq_max=n_seq_max)
    return LLM(args.model, config=config_from_cli(args), n_gpu_layers=args.n_gpu_layers or 0,
               draft_model=draft_from_args(args), **lora_from_args(args), **opts)


def listen_socket(host: str, port: int):
    """A socket bound to host:port and listening, handed to the HTTP server once the model is
    loaded (nothing can take the port in between). PyggmlError naming the address when it is
    taken or cannot be bound."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise PyggmlError(f"--host {host}: not an address to listen on ({e.strerror or e})")
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        why = "the address is already in use" if e.errno == errno.EADDRINUSE else \
            (e.strerror or str(e))
        raise PyggmlError(f"cannot listen on {host}:{port}: {why} (--port chooses another)")
    return sock


def cmd_serve(args) -> int:
    from pyggml.server import bind_warning, make_server, serve
    from pyggml.server.guard import Limits
    warn = bind_warning(args.host, args.api_key)
    if warn:
        print(f"pyggml: warning: {warn}", file=sys.stderr)
    grammar = grammar_from_args(args)          # a bad grammar fails before the model loads
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise PyggmlError(f"--slot-save-path {args.slot_save_path}: not a folder")
    sock = listen_socket(args.host, args.port)  # a busy port fails before the model loads
    try:
        llm = load_llm(args, n_seq_max=args.parallel)
    except BaseException:
        sock.close()
        raise
    if args.reranking:          # llama-server's --reranking: the model must be a reranker
        from pyggml.llm.embedding import rank_head
        try:
            rank_head(llm)
        except BaseException:
            sock.close()
            llm.close()
            raise
    for w in llm.offload.warnings:
        print(f"pyggml: warning: {w}", file=sys.stderr)
    name = args.alias or os.path.basename(llm.path)
    limits = Limits(max_body_bytes=args.max_body_bytes,
                    allowed_hosts=tuple(h.strip() for h in (args.allowed_hosts or "").split(",")
                                        if h.strip()))
    server = make_server(llm, args.parallel, name, args.chat_template, args.api_key,
                         args.queue_size, args.step_ms / 1000, limits, args.host)
    server.slot_save_path = args.slot_save_path
    server.default_grammar = grammar       # llama-server's --grammar / -j: for every request
    #                                        that brings no constraint or tools of its own
    print(f"pyggml: serving {name} on http://{args.host}:{args.port} ({args.parallel} slots, "
          f"{server.engine.n_ctx_slot} tokens each; devices: "
          f"{', '.join(llm.offload.devices_used())})", file=sys.stderr, flush=True)
    try:
        serve(server, args.host, args.port, sock)
    finally:
        server.engine.stop()
        llm.close()
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching")
    add_model_arguments(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port_number, default=8080)
    s.add_argument("-np", "--parallel", type=positive_int, default=4,
                   help="slots: requests decoded together (they share the -c cells)")
    s.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    s.add_argument("--queue-size", type=int, default=64,
                   help="requests that may wait for a slot (beyond: 503)")
    s.add_argument("--step-ms", type=nonnegative_ms, default=250, metavar="MS",
                   help="prompt tokens per decode step are cut so that a step takes about MS "
                        "milliseconds: a new request waits at most about that long behind "
                        "another's long prompt (0: n_ubatch tokens per step; default 250)")
    s.add_argument("-a", "--alias", default=None, help="model name in the API")
    s.add_argument("--reranking", "--rerank", action="store_true",
                   help="check that the model is a reranker (pooling type rank, a classifier "
                        "head); /v1/rerank answers for one either way")
    s.add_argument("--slot-save-path", default=None, metavar="DIR",
                   help="folder for POST /slots/ID?action=save|restore files (none: refused)")
    s.add_argument("--max-body-bytes", type=positive_int, default=32 << 20, metavar="N",
                   help="largest request body taken (beyond: 413; default 32 MiB)")
    s.add_argument("--allowed-hosts", default=None, metavar="NAME[,NAME]",
                   help="Host header names served without --api-key besides IP addresses, "
                        "localhost and --host ('.example.com': its subdomains too; '*': any)")
    s.set_defaults(func=cmd_serve)
