"""`pyggml mem`: memory per device, planned and measured (pyggml.planning.measure), sweeps,
timelines and the fit advisor (pyggml.planning.fit) from the command line."""

from __future__ import annotations

import json
import sys

from pyggml.cli.args import add_draft_args, draft_plan_options, int_list
from pyggml.cli.output import write_text, writable
from pyggml.cmdline import add_lora_args, add_model_args, add_offload_args, lora_from_args
from pyggml.errors import ConfigError
from pyggml.llm.setup import DEFAULTS
from pyggml.offload.flags import planning_config, virtual_specs

WARMUPS = ("fill", "ubatch", "token", "none")


def budgets_arg(items) -> dict[str, str]:
    """['Vulkan0=6GiB', 'CPU=8GiB'] -> {'Vulkan0': '6GiB', 'CPU': '8GiB'}."""
    out = {}
    for it in items or []:
        name, _, size = it.partition("=")
        if not name or not size:
            raise ConfigError(f"--budget {it!r}: expected DEVICE=SIZE, e.g. Vulkan0=6GiB")
        out[name] = size
    return out


def cmd_mem(args) -> int:
    from pyggml.planning import measure
    budgets = budgets_arg(args.budget)      # a malformed one is an error with or without --fit
    if budgets and not args.fit:
        raise ConfigError("--budget sets what --fit may use; add --fit")
    virtual = virtual_specs(args)
    cfg = planning_config(args, virtual)
    planning_only = args.plan_only or bool(virtual) or bool(cfg.get(("virtual_devices",)))
    common = {"logits_all": args.logits_all, "flash_attn": args.flash_attn != "off",
              "swa_full": args.swa_full, "lora": lora_from_args(args).get("lora")}
    for out in (args.json, args.emit_yaml, args.sweep_csv, args.sweep_plot, args.timeline,
                args.timeline_csv, args.address_map):
        if out:
            writable(out)                   # before minutes of work, not after
    if args.fit:
        from pyggml.planning.fit import fit
        res = fit(args.model, budgets, config=cfg, virtual=virtual,
                  min_ctx=args.min_ctx, max_ctx=args.max_ctx, prefer=args.prefer, **common)
        print(res.summary())
        if args.emit_yaml:
            write_text(args.emit_yaml, res.to_yaml())
            print(f"wrote {args.emit_yaml}")
        return 0 if res.fits else 1
    if args.sweep_ctx or args.sweep_ub:
        ctx = cfg.get(("context", "n_ctx")) or DEFAULTS.n_ctx
        ub = cfg.get(("context", "n_ubatch")) or DEFAULTS.n_ubatch
        rows = measure.sweep(args.model, args.sweep_ctx or [ctx], args.sweep_ub or [ub],
                             virtual=virtual, config=cfg, **common)
        print(measure.format_sweep(rows))
        if args.sweep_csv:
            measure.write_sweep_csv(rows, args.sweep_csv)
            print(f"wrote {args.sweep_csv}")
        if args.sweep_plot:
            from pyggml.planning.plots import plot_sweep
            plot_sweep(rows, args.sweep_plot)
            print(f"wrote {args.sweep_plot}")
        return 0
    if planning_only:
        rep = measure.estimate(args.model, virtual=virtual, config=cfg, **common)
    else:
        rep = measure.measure(args.model, config=cfg, n_threads=args.threads,
                              warmup=args.warmup, gen=args.gen, progress=sys.stderr.isatty(),
                              **common)
    for w in rep.plan.offload.warnings:
        print(f"pyggml: warning: {w}", file=sys.stderr)
    print(measure.format_report(rep))
    extra = draft_plan_options(args)
    if extra:               # speculative decoding: the draft model's planned memory
        from pyggml.planning.memory import Planner
        with Planner(args.model, virtual=virtual) as planner:
            spec_plan = planner.plan(cfg, **common, **extra)
        if spec_plan.draft is not None:
            print(spec_plan.draft_summary() + " (planned, not measured)")
    if args.json:
        write_text(args.json, json.dumps(rep.to_dict(), indent=1))
        print(f"wrote {args.json}")
    report = rep.plan.reports.get("prefill")
    if report is not None and (args.timeline or args.timeline_csv or args.address_map):
        from pyggml.planning import plots
        for path, write in ((args.timeline_csv, plots.write_timeline_csv),
                            (args.timeline, plots.plot_timeline),
                            (args.address_map, plots.plot_address_map)):
            if path:
                write(report, path)
                print(f"wrote {path}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("mem", help="memory per device: planned, and measured after a warm-up")
    add_model_args(p)
    add_offload_args(p, planning=True)
    add_draft_args(p)
    add_lora_args(p)
    p.add_argument("--plan-only", action="store_true", help="no loading, no compute")
    p.add_argument("--warmup", choices=WARMUPS, default="fill")
    p.add_argument("--gen", type=int, default=0, help="generate N tokens after the warm-up")
    p.add_argument("--json", default=None, help="also write the report as JSON")
    p.add_argument("--sweep-ctx", type=int_list, default=None, metavar="N,N,...")
    p.add_argument("--sweep-ub", type=int_list, default=None, metavar="N,N,...")
    p.add_argument("--sweep-plot", default=None, help="PNG/SVG of the sweep")
    p.add_argument("--sweep-csv", default=None)
    p.add_argument("--timeline", default=None, help="PNG/SVG: live bytes per buffer per node")
    p.add_argument("--timeline-csv", default=None, help="CSV: tensor, buffer, offset, size, "
                                                        "first, last")
    p.add_argument("--address-map", default=None, help="PNG/SVG: offset vs node index")
    p.add_argument("--fit", action="store_true",
                   help="the largest n_ctx and gpu_layers within the budgets (planning only)")
    p.add_argument("--budget", action="append", default=[], metavar="DEVICE=SIZE",
                   help="memory budget of a device (CPU: system RAM); default: free memory")
    p.add_argument("--min-ctx", type=int, default=None)
    p.add_argument("--max-ctx", type=int, default=None)
    p.add_argument("--prefer", choices=("gpu_layers", "ctx"), default="gpu_layers")
    p.add_argument("--emit-yaml", default=None, help="write the fit as a config file")
    p.set_defaults(func=cmd_mem)
