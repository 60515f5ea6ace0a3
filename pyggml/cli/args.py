"""Flags only `pyggml`'s commands take: lists of counts (bench, mem sweeps), bounded numbers,
speculative decoding. The model and offload flags the HTTP server shares are declared in
pyggml.cmdline and read into a Config by pyggml.offload.flags; they are re-exported here, where
the commands import them from.
"""

from __future__ import annotations

import argparse

from pyggml.cmdline import (UNSUPPORTED, Parser, add_model_args, add_offload_args,  # noqa: F401
                            run_options)
from pyggml.errors import PyggmlError, UsageError
from pyggml.offload.flags import (config_from_cli, parse_ot, planning_config,  # noqa: F401
                                  split_ctx, virtual_specs)


def int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")


def thread_list(s: str) -> list[int]:
    """Comma-separated thread counts (each >= 1)."""
    out = int_list(s)
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"expected thread counts >= 1, got {s!r}")
    return out


def count_list(s: str) -> list[int]:
    """Comma-separated token counts (>= 0; llama-bench's 0 skips that test)."""
    out = int_list(s)
    if any(n < 0 for n in out):
        raise argparse.ArgumentTypeError(f"expected token counts >= 0, got {s!r}")
    return out


def bounded(cast, lo=None, hi=None, *, what: str):
    """An argparse type: `cast(text)` within [lo, hi], else an error saying `what` was
    expected (-np, --port, --draft-max, ...)."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    parse.__name__ = what                   # argparse names the type in some messages
    return parse


positive_int = bounded(int, 1, what="an integer >= 1")
nonnegative_int = bounded(int, 0, what="an integer >= 0")
probability = bounded(float, 0.0, 1.0, what="a probability 0..1")


def add_draft_args(p) -> None:
    """Speculative decoding (pyggml/llm/speculative.py), llama.cpp's spellings: -md (a draft
    model), --draft-max, --draft-min, --draft-p-min; --lookup (prompt lookup decoding: an
    n-gram draft from the prompt and the text so far, llama.cpp's `--spec-type ngram-simple` /
    llama-lookup)."""
    from pyggml.llm.speculative import LOOKUP_NGRAM_MAX
    g = p.add_argument_group("speculative decoding")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft",
                   default=None, metavar="FILE",
                   help="a draft model with the model's vocabulary (e.g. a smaller sibling)")
    g.add_argument("--lookup", action="store_true",
                   help="prompt lookup decoding: draft from n-grams of the prompt and the text "
                        "so far (no second model)")
    g.add_argument("--lookup-ngram", type=positive_int, default=None, metavar="N",
                   help=f"with --lookup: the longest n-gram compared (default "
                        f"{LOOKUP_NGRAM_MAX})")
    g.add_argument("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", dest="draft_max",
                   type=positive_int, default=None, metavar="N",
                   help="tokens to draft per round at most (default 16; adapts below it)")
    g.add_argument("--draft-min", "--draft-n-min", "--spec-draft-n-min", dest="draft_min",
                   type=nonnegative_int, default=None, metavar="N",
                   help="fewer drafted tokens than this are not used (default 0)")
    g.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=probability,
                   default=0.0, metavar="P",
                   help="with -md: stop drafting below this draft probability (default 0)")


def draft_from_args(args):
    """The draft the speculative-decoding flags ask for (None: none)."""
    from pyggml.llm.speculative import (DRAFT_MAX, DRAFT_MIN, LOOKUP_NGRAM_MAX, DraftModel,
                                        PromptLookup)
    md, lookup = getattr(args, "model_draft", None), getattr(args, "lookup", False)
    if md and lookup:
        raise UsageError("-md (a draft model) and --lookup (prompt lookup) exclude each other: "
                         "choose one draft")
    n_max = getattr(args, "draft_max", None)
    n_min = getattr(args, "draft_min", None)
    n_max = DRAFT_MAX if n_max is None else n_max
    n_min = DRAFT_MIN if n_min is None else n_min
    if md:
        return DraftModel(md, n_max, n_min, args.draft_p_min)
    if lookup:
        return PromptLookup(n_max, n_min,
                            ngram_max=getattr(args, "lookup_ngram", None) or LOOKUP_NGRAM_MAX)
    if getattr(args, "draft_max", None) is not None or getattr(args, "draft_min", None) is not None:
        raise UsageError("--draft-max / --draft-min need a draft: -md FILE or --lookup")
    if getattr(args, "lookup_ngram", None) is not None:
        raise UsageError("--lookup-ngram sets prompt lookup's n-gram: it needs --lookup")
    return None


def add_grammar_args(p) -> None:
    """Constrained output (pyggml/llm/grammar.py), llama.cpp's spellings: --grammar (GBNF
    text), --grammar-file, -j / --json-schema (a JSON schema), --json-schema-file."""
    g = p.add_argument_group("constrained output")
    g.add_argument("--grammar", default=None, metavar="GBNF",
                   help="constrain the output to a GBNF grammar (llama.cpp's syntax)")
    g.add_argument("--grammar-file", default=None, metavar="FILE",
                   help="... read from a file")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="constrain the output to JSON matching this schema ('{}': any object)")
    g.add_argument("--json-schema-file", default=None, metavar="FILE",
                   help="... read from a file")


def grammar_from_args(args):
    """The GrammarSpec the constrained-output flags ask for (None: none), checked before the
    model loads: a bad grammar or schema is one line naming where."""
    from pyggml.llm.grammar import GrammarSpec
    given = {k: getattr(args, k, None) for k in ("grammar", "grammar_file", "json_schema",
                                                  "json_schema_file")}
    given = {k: v for k, v in given.items() if v is not None}
    if len(given) > 1:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise UsageError(f"{flags}: give one grammar or schema")
    if not given:
        return None
    (key, value), = given.items()
    if key.endswith("_file"):
        try:
            with open(value, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--{key.replace('_', '-')} {value}: cannot read it "
                             f"({getattr(e, 'strerror', None) or e})") from None
    if key.startswith("grammar"):
        return GrammarSpec.gbnf(value)
    return GrammarSpec.json_schema(value)


def draft_plan_options(args) -> dict:
    """Planner.plan options for the speculative-decoding flags: the draft model and n_draft
    ({} without a draft)."""
    d = draft_from_args(args)
    if d is None:
        return {}
    out = {"n_draft": d.n_max}
    if getattr(args, "model_draft", None):
        out["draft_model"] = args.model_draft
    return out


def spec_stats_line(llm) -> str:
    """'draft: 120 drafted, 96 accepted (80.0%), 40 rounds' ('' without a draft)."""
    if llm.speculator is None:
        return ""
    s = llm.stats.spec
    return (f"draft ({llm.speculator.draft.describe()}): {s.drafted} drafted, {s.accepted} "
            f"accepted ({100 * s.acceptance_rate:.1f}%), {s.rounds} rounds")


def _logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's -l TOKEN_ID(+/-)BIAS: '15043+1', '15043-1', '15043-inf'."""
    import re
    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. "
                                         f"15043+1, 15043-inf), got {text!r}")
    bias = float(m.group(3))
    return int(m.group(1)), -bias if m.group(2) == "-" else bias


def add_sampling_args(p, *, seed_default: int = 0xFFFFFFFF) -> None:
    """llama.cpp's sampling flags and defaults (common/arg.cpp), for run and chat; the chain
    and its order are pyggml/llm/sampler.py's."""
    g = p.add_argument_group("sampling (llama.cpp's flags and defaults)")
    g.add_argument("--temp", "--temperature", dest="temp", type=float, default=0.8,
                   help="temperature (<= 0: greedy; default 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="top-k (0: off; default 40)")
    g.add_argument("--top-p", type=float, default=0.95, help="top-p (1.0: off; default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, help="min-p (0.0: off; default 0.05)")
    g.add_argument("--typical", "--typical-p", dest="typical_p", type=float, default=1.0,
                   help="locally typical sampling, p (1.0: off)")
    g.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="repetition penalty (1.0: off)")
    g.add_argument("--repeat-last-n", type=nonnegative_int, default=64,
                   help="tokens the penalties look back at (0: off; default 64)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="(0.0: off)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="(0.0: off)")
    g.add_argument("-l", "--logit-bias", type=_logit_bias, action="append", default=[],
                   metavar="TOKEN_ID(+/-)BIAS", help="e.g. 15043+1, 15043-inf (repeatable)")
    g.add_argument("--mirostat", type=int, default=0,
                   help="0: off, 1: Mirostat, 2: Mirostat 2.0 (top-k, top-p, typical, min-p, "
                        "penalties, DRY and XTC are not used then)")
    g.add_argument("--mirostat-lr", dest="mirostat_eta", type=float, default=0.1,
                   help="Mirostat learning rate, eta (default 0.1)")
    g.add_argument("--mirostat-ent", dest="mirostat_tau", type=float, default=5.0,
                   help="Mirostat target entropy, tau (default 5.0)")
    g.add_argument("--xtc-probability", type=float, default=0.0, help="XTC (0.0: off)")
    g.add_argument("--xtc-threshold", type=float, default=0.1,
                   help="XTC threshold (> 0.5: off; default 0.1)")
    g.add_argument("--dry-multiplier", type=float, default=0.0, help="DRY (0.0: off)")
    g.add_argument("--dry-base", type=float, default=1.75,
                   help="DRY base (default 1.75; values below 1 keep the default, as llama.cpp)")
    g.add_argument("--dry-allowed-length", type=nonnegative_int, default=2,
                   help="DRY: repeats longer than this are penalized (default 2)")
    g.add_argument("--dry-penalty-last-n", type=nonnegative_int, default=64,
                   help="DRY: tokens scanned for repeats (0: off; default 64)")
    g.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STRING",
                   help="a DRY sequence breaker, replacing the defaults ('\\n', ':', '\"', "
                        "'*'); 'none': no breakers (repeatable)")
    g.add_argument("--min-keep", type=nonnegative_int, default=0,
                   help="truncating samplers keep at least this many tokens (default 0)")
    g.add_argument("-s", "--seed", type=int, default=seed_default,
                   help="random seed (-1: random)")


def sampling_from_args(args) -> dict:
    """The sampling keywords (pyggml.llm.completion.sampling_params's) the flags ask for,
    checked now, before any model loads: a bad value is one line naming it."""
    from pyggml.llm.completion import sampling_params
    breakers = args.dry_sequence_breaker
    if breakers is not None:
        breakers = [] if "none" in breakers else breakers
    kw = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p,
          "min_p": args.min_p, "typical_p": args.typical_p,
          "repeat_penalty": args.repeat_penalty, "repeat_last_n": args.repeat_last_n,
          "presence_penalty": args.presence_penalty,
          "frequency_penalty": args.frequency_penalty,
          "logit_bias": tuple(args.logit_bias) or None, "mirostat": args.mirostat,
          "mirostat_tau": args.mirostat_tau, "mirostat_eta": args.mirostat_eta,
          "xtc_probability": args.xtc_probability, "xtc_threshold": args.xtc_threshold,
          "dry_multiplier": args.dry_multiplier,
          "dry_base": args.dry_base if args.dry_base >= 1.0 else 1.75,
          "dry_allowed_length": args.dry_allowed_length,
          "dry_penalty_last_n": args.dry_penalty_last_n, "dry_sequence_breakers": breakers,
          "min_keep": args.min_keep, "seed": None if args.seed < 0 else args.seed}
    try:
        sampling_params(**kw)
    except PyggmlError as e:
        flags = {"temperature": "--temp", "typical_p": "--typical", "mirostat_eta":
                 "--mirostat-lr", "mirostat_tau": "--mirostat-ent"}
        named = [flags.get(k, "--" + k.replace("_", "-")) for k in kw if f"{k} " in str(e)]
        raise type(e)(f"{e} (flag {', '.join(named)})" if named else str(e)) from None
    return kw
