"""`pyggml chat -m MODEL [-sys TEXT] [--chat-template FILE|NAME]`: a conversation, as
`llama-cli -cnv`. Replies stream as they are generated (a thinking model's reasoning dimmed on a terminal, left
out when the output is piped); the history stays in the KV cache (each
turn re-renders the chat and keeps the cells of the common prefix, so only the new messages are
evaluated). Commands: /help, /regen (a new answer to the last message), /clear (start over),
/exit; a line that is one unknown /word gets a one-line answer, not the model. Ctrl-C stops the current reply (the part
already shown stays in the history), Ctrl-D exits. When the context is full it says so and
offers /clear. Lines come from stdin when it is not a terminal, so a chat can be scripted.
"""

from __future__ import annotations

import re
import sys

from pyggml.cli.args import (add_sampling_args, grammar_from_args, sampling_from_args,
                             spec_stats_line)
from pyggml.cli.serve import add_model_arguments, load_llm
from pyggml.errors import ModelError

HELP = ("commands: /help, /regen (answer the last message again), /clear (forget the "
        "conversation), /exit (or Ctrl-D); Ctrl-C stops a reply")
COMMAND = re.compile(r"/[A-Za-z][\w-]*")   # a line that is one /word is a command, not a message
DIM, PLAIN = "\x1b[2m", "\x1b[0m"     # a thinking model's reasoning, on a terminal


def _lines(interactive: bool):
    """User lines: input() with line editing on a terminal, else stdin lines. Ctrl-C at the
    prompt does not end the chat (Ctrl-D does)."""
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
        while True:
            try:
                yield input("> ")
            except KeyboardInterrupt:
                print("\n(" + HELP + ")", flush=True)
            except EOFError:
                print(flush=True)
                return
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")


def cmd_chat(args) -> int:
    interactive = sys.stdin.isatty()
    dim = sys.stdout.isatty()          # reasoning shown dimmed on a terminal, left out in a pipe
    grammar = grammar_from_args(args)      # a bad grammar fails before the model loads
    sampling = sampling_from_args(args)    # and so do bad sampling flags
    llm = load_llm(args)
    try:
        llm.get_chat_template(args.chat_template)      # no template: the error names the option
        system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        history = list(system)
        if interactive:
            print(f"pyggml chat: {llm.path} ({llm.n_ctx} tokens of context). {HELP}",
                  flush=True)
        for line in _lines(interactive):
            text = line.strip()
            if not text:
                continue
            if text == "/exit":
                break
            if text == "/clear":
                history = list(system)
                llm.reset()
                print("(conversation cleared)", flush=True)
                continue
            if text == "/help":
                print(f"({HELP})", flush=True)
                continue
            if text == "/regen":
                if len(history) < 2 or history[-1]["role"] != "assistant":
                    print("(nothing to regenerate yet)", flush=True)
                    continue
                line = history[-2]["content"]
                del history[-2:]
            elif COMMAND.fullmatch(text):
                print(f"(unknown command {text}; /help lists the commands)", flush=True)
                continue
            history.append({"role": "user", "content": line})
            reply, finish = [], None
            try:
                for chunk in llm.create_chat_completion(
                        history, chat_template=args.chat_template, stream=True,
                        max_tokens=args.n_predict if args.n_predict > 0 else None,
                        grammar=grammar, **sampling):
                    ch = chunk["choices"][0]
                    thought = ch["delta"].get("reasoning_content")
                    if thought and dim:
                        print(f"{DIM}{thought}{PLAIN}", end="", flush=True)
                    piece = ch["delta"].get("content")
                    if piece:
                        reply.append(piece)
                        print(piece, end="", flush=True)
                    finish = ch["finish_reason"] or finish
            except KeyboardInterrupt:
                finish = "interrupted"
                print(" [stopped]", end="", flush=True)
            except ModelError as e:
                if "context" not in str(e):
                    raise
                history.pop()
                print(f"[context full: {e}. /clear starts a new conversation]", flush=True)
                continue
            print(flush=True)
            history.append({"role": "assistant", "content": "".join(reply)})
            if finish == "length" and args.n_predict <= 0:
                print(f"[context full: the reply stopped at the end of the {llm.n_ctx}-token "
                      f"context. /clear starts a new conversation]", flush=True)
            if args.verbose:
                s = llm.stats
                spec = spec_stats_line(llm)
                print(f"[prompt tokens evaluated {s.n_prompt_tokens}, reused "
                      f"{s.n_prompt_reused}; generated {s.n_gen_tokens}"
                      + (f"; {spec}" if spec else "") + "]", file=sys.stderr, flush=True)
    finally:
        llm.close()
    return 0


def add_commands(sub) -> None:
    c = sub.add_parser("chat", help="interactive conversation with an instruct model")
    add_model_arguments(c)
    c.add_argument("-sys", "--system-prompt", default=None)
    c.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens per reply at most (-1: until the model stops or the context "
                        "is full)")
    add_sampling_args(c, seed_default=-1)
    c.add_argument("-v", "--verbose", action="store_true")
    c.set_defaults(func=cmd_chat)
