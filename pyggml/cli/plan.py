"""`pyggml plan`: the dry run (pyggml.planning.dryrun) from the command line."""

from __future__ import annotations

import sys

from pyggml.cli.args import add_draft_args, draft_plan_options
from pyggml.cli.output import write_text
from pyggml.cmdline import (add_lora_args, add_model_args, add_offload_args, lora_from_args,
                             run_options)
from pyggml.offload.flags import config_from_cli, virtual_specs
from pyggml.offload.config import describe_schema


def cmd_plan(args) -> int:
    from pyggml.planning.dryrun import emit_yaml, format_report
    from pyggml.planning.fit import suggest_changes
    from pyggml.planning.memory import Planner
    if args.schema:
        print(describe_schema())
        return 0
    opts = run_options(args)
    lora = lora_from_args(args).get("lora")        # checked before the model is opened
    with Planner(args.model, virtual=virtual_specs(args)) as planner:
        # (a callable: this machine's devices are listed only when -ngl needs its first GPU)
        cfg = config_from_cli(args, always=True, first_gpu=lambda: planner.catalog.default_gpu())
        report = planner.plan(cfg, **opts, **draft_plan_options(args), lora=lora)
        if args.check_fit:
            report.fit_changes = suggest_changes(planner, report)
    if args.emit_yaml is not None:
        text = emit_yaml(report.config, args.argv)
        if args.emit_yaml == "-":
            print(text, end="")
            return 0
        write_text(args.emit_yaml, text)
        print(f"wrote {args.emit_yaml}", file=sys.stderr)
    print(format_report(report, per_tensor=args.per_tensor))
    if report.draft is not None:
        print(report.draft_summary())
    if args.check_fit and report.not_fitting():
        return 2
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="dry run: where each tensor goes, memory per device")
    add_model_args(p)
    add_offload_args(p, planning=True)
    add_draft_args(p)
    add_lora_args(p)
    p.add_argument("--per-tensor", action="store_true", help="one row per tensor")
    p.add_argument("--check-fit", action="store_true",
                   help="compare with free device memory; suggest the smallest change that fits")
    p.add_argument("--emit-yaml", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the equivalent config (after flags and --set) to FILE or stdout")
    p.add_argument("--schema", action="store_true", help="print the config schema and exit")
    p.set_defaults(func=cmd_plan)
