"""`pyggml run`: generate text with a GGUF model, llama-cli style."""

from __future__ import annotations

import sys
import time

from pyggml.cli.args import (add_draft_args, add_grammar_args, add_model_args, add_offload_args,
                             add_sampling_args, config_from_cli, draft_from_args,
                             grammar_from_args, positive_int, run_options, sampling_from_args,
                             spec_stats_line)
from pyggml.cmdline import add_lora_args, lora_from_args
from pyggml.errors import PyggmlError, UsageError

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0"}


def process_escapes(text: str) -> str:
    """llama.cpp's prompt escapes (on by default, -e): \\n \\t \\r \\\\ \\' \\" \\0; any other
    backslash stays as typed."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _prompt(args) -> str:
    if args.file == "-":                              # llama.cpp: -f - reads stdin
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    if args.file is not None:
        try:
            with open(args.file, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise PyggmlError(f"cannot read the prompt file {args.file}: "
                              f"{e.strerror or e}") from None
        return raw.decode("utf-8", errors="replace")
    text = args.prompt
    return process_escapes(text) if args.escape else text


def _prompt_bar(llm):
    """A progress bar on a terminal for prompts of more than one ubatch (None otherwise)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    bar = tqdm(unit="tok", desc="prompt", leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
    llm.on_ubatch = update
    return bar


def cmd_run(args) -> int:
    from pyggml import _native
    from pyggml.llm.runtime import LLM
    if args.conversation is False and args.system_prompt is not None:
        raise UsageError("-sys (a system prompt) needs a conversation: drop -no-cnv")
    if args.conversation or args.system_prompt is not None:   # llama-cli: -sys turns -cnv on
        from pyggml.cli.chat import cmd_chat
        return cmd_chat(args)
    sampling = sampling_from_args(args)                    # checked before the model loads
    seed = sampling.pop("seed")
    grammar = grammar_from_args(args)                      # checked before the model loads
    prompt = _prompt(args)
    if args.n_predict < -1:
        raise UsageError(f"-n {args.n_predict}: expected a number of tokens >= 0, or -1 "
                         f"(until the end of generation)")
    t0 = time.perf_counter()
    lora = lora_from_args(args)                            # checked before the model loads
    llm = LLM(args.model, config=config_from_cli(args), n_gpu_layers=args.n_gpu_layers or 0,
              verbose=args.verbose, draft_model=draft_from_args(args), **lora,
              **run_options(args))
    with llm:
        for w in llm.offload.warnings:
            print(f"pyggml: warning: {w}", file=sys.stderr)
        t_load = time.perf_counter() - t0
        if args.verbose:
            hp = llm.hparams
            print(f"model: {llm.path} ({hp.arch}, {hp.n_layer} layers, E={hp.n_embd}, "
                  f"V={hp.n_vocab}); threads {llm.backend.n_threads}/"
                  f"{llm.backend.n_threads_batch}; kernel path {_native.cpu_path()}",
                  file=sys.stderr)
        if not args.no_warmup:
            llm.eval([llm.tokenizer.bos_id if llm.tokenizer.bos_id is not None else 0])
            llm.reset()
        llm.stats.t_prompt_s = 0.0
        llm.stats.n_prompt_tokens = 0
        out = sys.stdout
        if args.display_prompt:
            out.write(prompt)
        out.flush()
        bar = _prompt_bar(llm)
        gen = llm.generate(prompt, args.n_predict, seed=-1 if seed is None else seed,
                           **sampling,
                           stop_at_eog=not args.ignore_eos, grammar=grammar)
        text = ""
        for tok in gen:
            if bar is not None:
                bar.close()
                bar = llm.on_ubatch = None
            out.write(tok.text)
            out.flush()
            text += tok.text
            if any(r and r in text for r in args.reverse_prompt):
                break
        gen.close()             # a stop by -r leaves the loop early: its time is counted now
        out.write("\n")
        if gen.finish_reason == "context":
            print(f"\npyggml: the context is full ({llm.n_ctx} tokens): generation stopped; a "
                  f"larger -c holds more", file=sys.stderr)
        s = llm.stats
        pp = s.n_prompt_tokens / s.t_prompt_s if s.t_prompt_s else 0.0
        # the first token comes from the prompt's logits: generation time covers the other n-1
        # decode steps (llama.cpp's "eval time ... n-1 runs")
        tg = (f"{(s.n_gen_tokens - 1) / s.t_gen_s:.1f} t/s" if s.n_gen_tokens > 1 and s.t_gen_s
              else "n/a t/s")
        print(f"\nload time {t_load * 1000:.0f} ms | prompt {s.n_prompt_tokens} tokens, "
              f"{pp:.1f} t/s | generation {s.n_gen_tokens} tokens, {tg} | graphs "
              f"built {s.graphs_built}, reused {s.graphs_reused}"
              + (f" | {spec}" if (spec := spec_stats_line(llm)) else ""), file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    r = sub.add_parser("run", help="generate text with a GGUF model")
    add_model_args(r)
    add_offload_args(r)
    add_lora_args(r)
    add_draft_args(r)
    add_grammar_args(r)
    r.add_argument("-p", "--prompt", default="The capital of France is")
    r.add_argument("-f", "--file", default=None,
                   help="read the prompt from this file ('-': standard input)")
    r.add_argument("-e", "--escape", action="store_true", default=True,
                   help="process \\n, \\t, ... in the prompt (the default, as llama.cpp)")
    r.add_argument("--no-escape", dest="escape", action="store_false")
    r.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate (-1: until end of generation or a full context)")
    r.add_argument("-r", "--reverse-prompt", "--stop", action="append", default=[],
                   metavar="TEXT", help="stop when the generated text contains TEXT")
    r.add_argument("-np", "--parallel", type=positive_int, default=None, help="sequences (n_seq_max)")
    r.add_argument("-cnv", "--conversation", action="store_true", default=None,
                   help="chat with an instruct model (as `pyggml chat`; -sys turns it on)")
    r.add_argument("-no-cnv", "--no-conversation", dest="conversation", action="store_false")
    r.add_argument("-sys", "--system-prompt", default=None, help="with -cnv: a system prompt")
    r.add_argument("--chat-template", default=None,
                   help="with -cnv: a Jinja file or a built-in name; default: the model's own")
    add_sampling_args(r)
    r.add_argument("--ignore-eos", action="store_true")
    r.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print the generated text only, not the prompt before it")
    r.add_argument("--no-warmup", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true")
    r.set_defaults(func=cmd_run)
