"""llama.cpp's command-line flags and offload configs, both ways: the one place that turns
-ngl, -ot, -dev, -ts, -nkvo, --no-op-offload, -c, -b, -ub, -t, -tb, --rpc and --set into a
Config (`config_from_flags` for values, `config_from_cli` for a parsed command line, which
`pyggml` commands and the HTTP server's what-if plans both use), and a Config with its plan back
into llama.cpp's flags (`llama_flags`, what `pyggml plan` prints). The flags are declared
(argparse) in pyggml.cmdline.
"""

from __future__ import annotations

import re
import shlex

from pyggml.backend.catalog import CPU, DeviceCatalog, DeviceInfo, VirtualSpec
from pyggml.errors import ConfigError, UsageError
from pyggml.offload.config import CLI, Config, Where, load_config
from pyggml.offload.plan import OffloadPlan, layer_of
from pyggml.offload.rules import resolve
from pyggml.offload.saferegex import check_pattern


def config_from_flags(config=None, *, sets=(), n_gpu_layers: int | None = None, overrides=(),
                      kv_offload: bool = True, op_offload: bool = True, devices=None,
                      n_ctx: int | None = None, n_batch: int | None = None,
                      n_ubatch: int | None = None, threads: int | None = None,
                      threads_batch: int | None = None) -> Config:
    """llama.cpp's flags (and a config file they amend) as one Config. Precedence: the file,
    then the flags, then `sets` (--set key=value). overrides: [(regex, device)] (-ot), put before
    the file's rules (first match wins)."""
    cfg = load_config(config) if config is not None else Config({}, {(): Where(CLI)}, CLI)
    if devices is not None:
        cfg = cfg.with_values({"devices": list(devices)},
                              "-dev " + (",".join(map(str, devices)) or "none"))
    if n_gpu_layers is not None:
        if not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
            raise ConfigError(f"-ngl must be >= 0, got {n_gpu_layers}")
        cfg = cfg.with_values({"gpu_layers": n_gpu_layers}, f"-ngl {n_gpu_layers}")
    if overrides:
        rules = []
        for pattern, device in overrides:
            why = check_pattern(pattern)
            if why is not None:
                raise ConfigError(f"-ot {pattern}={device}: invalid regex: {why}")
            rules.append({"match": pattern, "device": device})
        old = cfg.get(("overrides",)) or []
        new = cfg.with_values({"overrides": rules + old}, "-ot")
        for i, (pattern, device) in enumerate(overrides):
            new.where[("overrides", i)] = Where(CLI, text=f"-ot {pattern}={device}")
        for j in range(len(old)):          # the file's rules keep their marks
            for p, w in cfg.where.items():
                if p[:2] == ("overrides", j):
                    new.where[("overrides", j + len(rules)) + p[2:]] = w
        cfg = new
    if not kv_offload:
        cfg = cfg.with_values({"kv": {"device": "cpu"}}, "--no-kv-offload")
    if not op_offload:
        cfg = cfg.with_values({"op_offload": False}, "--no-op-offload")
    for key, v, flag in ((("context", "n_ctx"), n_ctx, "-c"), (("context", "n_batch"), n_batch,
                         "-b"), (("context", "n_ubatch"), n_ubatch, "-ub"),
                         (("threads", "decode"), threads, "-t"),
                         (("threads", "batch"), threads_batch, "-tb")):
        if v is not None:
            cfg = cfg.with_values({key[0]: {key[1]: v}}, f"{flag} {v}")
    return cfg.with_sets(sets) if sets else cfg


def plan_from_args(tensor_names, n_layer: int, tied_output: bool, n_gpu_layers: int = 0,
                   gpu_device: str | None = None, overrides=(), kv_offload: bool = True,
                   op_offload: bool = True) -> OffloadPlan:
    """llama.cpp's flags as a plan. overrides: [(regex, device)] (-ot), first match wins, applied
    before -ngl. gpu_device: the device -ngl puts layers on (None: no GPU, everything on CPU).
    Device names are taken as given (the runtime checks that they exist)."""
    if not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
        raise ConfigError(f"-ngl must be >= 0, got {n_gpu_layers}")
    if n_gpu_layers > 0 and gpu_device is None:
        raise ConfigError("-ngl > 0 needs a GPU device, and none was found "
                          "(pyggml info lists the devices)")
    cfg = config_from_flags(n_gpu_layers=n_gpu_layers, overrides=overrides,
                            kv_offload=kv_offload, op_offload=op_offload,
                            devices=[gpu_device] if gpu_device else [])
    infos = [DeviceInfo(gpu_device)] if gpu_device else []
    plan, _ = resolve(cfg, tensor_names, n_layer, tied_output,
                      DeviceCatalog(infos, permissive=True))
    return plan


def _names_regex(names, n_layer: int) -> str:
    """An anchored regex matching exactly `names`: blk.N.x names grouped by their layer sets."""
    by_short: dict[str, set[int]] = {}
    glob = []
    for n in names:
        il = layer_of(n)
        if il is None:
            glob.append(n)
        else:
            by_short.setdefault(n.split(".", 2)[2], set()).add(il)
    groups: dict[tuple, list[str]] = {}
    for short, ls in by_short.items():
        groups.setdefault(tuple(sorted(ls)), []).append(short)
    alts = []
    for ls, shorts in groups.items():
        if ls == tuple(range(n_layer)):
            lre = "\\d+"
        else:
            lre = ls[0] if len(ls) == 1 else "(?:" + "|".join(map(str, ls)) + ")"
        sre = (re.escape(shorts[0]) if len(shorts) == 1
               else "(?:" + "|".join(re.escape(s) for s in sorted(shorts)) + ")")
        alts.append(f"blk\\.{lre}\\.{sre}")
    alts += [re.escape(n) for n in sorted(glob)]
    return "^(?:" + "|".join(alts) + ")$" if len(alts) > 1 else f"^{alts[0]}$"


def llama_flags(cfg: Config, plan: OffloadPlan, tensor_names, n_layer: int,
                settings=None) -> tuple[list[str], list[str]]:
    """(llama.cpp flags equivalent to the config, what has no llama.cpp equivalent); settings:
    the RunOptions fields the config sets (plan.settings). -ot rules
    keep their order (llama.cpp also takes the first match); a rule with only `match` keeps its
    regex, others become an exact list of the tensors they match in this model."""
    flags: list[str] = []
    missing: list[str] = []
    if cfg.get(("rpc",)):
        flags += ["--rpc", ",".join(cfg.get(("rpc",)))]
    listed = cfg.get(("devices",))
    gpus = [d for d in plan.devices if d != CPU]
    if listed is not None:
        flags += ["-dev", ",".join(gpus) if gpus else "none"]
    ngl = cfg.get(("gpu_layers",), 0)
    if ngl:
        flags += ["-ngl", str(n_layer + 1 if ngl == "all" else ngl)]
    split = cfg.get(("tensor_split",))
    if split is not None:
        flags += ["-ts", ",".join(f"{x:g}" for x in split)]
    names = set(tensor_names)
    for rep in plan.rules:
        r = cfg.get(("overrides", rep.index))
        if rep.phase is not None:
            missing.append(f"{rep.label}: llama.cpp has no per-phase placement (only "
                           f"--no-op-offload for all phases)")
            continue
        matched = [n for n in rep.matched if n in names]
        if "output.weight" in rep.matched and "output.weight" not in names:
            missing.append(f"{rep.label}: a tied output matrix has no name of its own in "
                           f"llama.cpp (it is token_embd.weight, placed with the output layer)")
        if not matched:
            continue
        if r is None:                   # a plan made by another config: its exact tensors
            pat = _names_regex(matched, n_layer)
        elif set(r) - {"name"} <= {"match", "device", "buffer_type"}:
            pat = r["match"]
        elif set(r) - {"name"} <= {"kind", "device"} and r["kind"] in ("experts", ["experts"]):
            pat = r"ffn_\w+_(exps|shexp)\b"          # llama.cpp users write -ot exps=CPU
        else:
            pat = _names_regex(matched, n_layer)
        flags += ["-ot", f"{pat}={rep.device}"]
    kvd = cfg.get(("kv", "device"), "layer")
    ranges = cfg.get(("kv", "ranges")) or []
    if isinstance(kvd, str) and kvd.lower() == "cpu" and not any("device" in r for r in ranges):
        flags.append("--no-kv-offload")
    elif not (isinstance(kvd, str) and kvd.lower() == "layer") or any("device" in r
                                                                      for r in ranges):
        missing.append("kv placement per device or layer range (llama.cpp: the KV cache follows "
                       "its layer, or --no-kv-offload puts all of it on the CPU)")
    settings = settings or {}
    if settings.get("type_k") is not None:
        for flag, types in (("-ctk", settings["type_k"]), ("-ctv", settings["type_v"])):
            if len(set(types)) > 1:
                missing.append(f"{flag}: KV types per layer range (llama.cpp: one type for all)")
            elif types and types[0] != "f16":
                flags += [flag, types[0]]
    oo = plan.op_offload
    if not any(oo.values()):
        flags.append("--no-op-offload")
    elif not all(oo.values()):
        missing.append("op_offload per phase (llama.cpp: --no-op-offload for all phases)")
    if plan.n_copies > 1:
        missing.append(f"n_copies: {plan.n_copies} (llama.cpp: a build setting, "
                       f"GGML_SCHED_MAX_COPIES)")
    for flag, key in (("-c", "n_ctx"), ("-b", "n_batch"), ("-ub", "n_ubatch"),
                      ("-np", "n_seq_max"), ("-t", "n_threads"), ("-tb", "n_threads_batch")):
        v = settings.get(key)
        if v is not None:
            flags += [flag, str(v)]
    if cfg.get(("fallback",)) == "cpu":
        missing.append("fallback: cpu (llama.cpp fails on a device it does not find)")
    return flags, missing


def shell_join(flags) -> str:
    return " ".join(shlex.quote(f) for f in flags)


def split_ctx(values) -> tuple[int | None, str | None]:
    """-c may be given twice: an integer is the context size, anything else a config file."""
    n_ctx, path = None, None
    for v in values or []:
        if str(v).lstrip("-").isdigit():      # a number (a negative one is refused later)
            n_ctx = int(v)
        else:
            path = v
    return n_ctx, path


def parse_ot(item: str) -> tuple[str, str]:
    """'REGEX=DEVICE' -> (regex, device); the device is what follows the last '='."""
    pattern, sep, device = item.rpartition("=")
    if not sep or not pattern or not device.strip():
        raise ConfigError(f"-ot {item}: expected REGEX=DEVICE (e.g. -ot 'ffn_.*=CPU')")
    return pattern, device.strip()


def virtual_specs(args) -> list[VirtualSpec]:
    return [VirtualSpec.parse(v) for v in getattr(args, "virtual_device", None) or []]


def _split(text: str | None, flag: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.replace("/", ",").split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected numbers like 3,1") from None


def config_from_cli(args, always: bool = False, first_gpu=None) -> Config | None:
    """The Config a command line gives: a file, llama.cpp flags, --set (None: none of them and
    not `always`). Without a file, -ngl uses `first_gpu` (a name; default the registry's first
    GPU), as `LLM(n_gpu_layers=...)` does. -ctk/-ctv/--swa-full are run options, not here."""
    n_ctx, path = split_ctx(getattr(args, "ctx", None))
    ot = [parse_ot(x) for x in getattr(args, "override_tensor", None) or []]
    sets = list(getattr(args, "set", None) or [])
    nkvo = getattr(args, "no_kv_offload", False)
    noop = getattr(args, "no_op_offload", False)
    ngl = getattr(args, "n_gpu_layers", None)
    dev = getattr(args, "device", None)
    split = _split(getattr(args, "tensor_split", None), "-ts")
    rpc_arg = getattr(args, "rpc", None)
    rpc = [e.strip() for e in (rpc_arg or "").split(",") if e.strip()]
    if rpc_arg is not None and not rpc:     # an unset shell variable must not mean "CPU only"
        raise UsageError(f"--rpc {rpc_arg!r}: no server given; expected HOST:PORT[,HOST:PORT]")
    if not (always or path or ot or sets or nkvo or noop or dev or split or rpc):
        return None
    devices = None
    if dev is not None:
        devices = [] if dev.strip().lower() == "none" else [d.strip() for d in dev.split(",")]
    elif rpc:
        devices = None                    # llama.cpp: -ngl spreads over every device, remote too
    elif path is None and (ngl or 0) > 0:
        gpu = first_gpu() if first_gpu else DeviceCatalog.from_registry().default_gpu()
        devices = [gpu] if gpu else None         # None: the resolver says why there is none
    elif path is None:
        devices = [] if not (ngl or 0) else None
    one = (lambda k: v if isinstance(v := getattr(args, k, None), int) else None)
    cfg = config_from_flags(
        path, n_gpu_layers=ngl, overrides=ot, kv_offload=not nkvo, op_offload=not noop,
        devices=devices, n_ctx=n_ctx, n_batch=one("batch_size"), n_ubatch=one("ubatch_size"),
        threads=one("threads"), threads_batch=one("threads_batch"))   # bench: -t is a list
    if split is not None:
        cfg = cfg.with_values({"tensor_split": split}, f"-ts {args.tensor_split}")
    if rpc:
        cfg = cfg.with_values({"rpc": list(cfg.get(("rpc",)) or []) + rpc}, f"--rpc {args.rpc}")
    return cfg.with_sets(sets) if sets else cfg


def planning_config(args, virtual) -> Config:
    """The command line as the offload Config a plan is made of (`pyggml mem`, the server's
    what-if plans): config_from_cli with -ngl going to the first virtual device when some are
    declared and no file names devices, and -ctk/-ctv as the config's KV types."""
    first = (lambda: virtual[0].name) if virtual else None
    cfg = config_from_cli(args, always=True, first_gpu=first)
    kv = {k: v for k, v in (("type_k", args.cache_type_k), ("type_v", args.cache_type_v)) if v}
    if kv:
        cfg = cfg.with_values({"kv": kv}, "-ctk/-ctv")
    return cfg
