"""The JSON the web page reads (docs/server.md, "The web page and its JSON"):

    GET  /v1/pyggml/plan    the plan of the run being served (its offload plan and sizes)
    POST /v1/pyggml/plan    a plan of the same model for other settings: `pyggml mem --plan-only`
                            flags and/or an offload config (virtual GPUs welcome)
    GET  /v1/pyggml/live    slots, queue, KV cells per slot, tokens per second (last minute)

A plan is pyggml.planning.measure.estimate, the report `pyggml mem --plan-only` prints: the
object under "mem" is exactly what `pyggml mem --json` writes for the same settings. Beside it:
the model's facts and quant mix, per layer where its weights / KV cache / ops are and which rule
or scheduler cause put them there, and the compute-buffer timeline (bytes alive per node) with
what is alive at its peak. Planning runs in a worker thread, one plan at a time, and is cached.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections import OrderedDict

from pyggml.cmdline import Parser, add_model_args, add_offload_args
from pyggml.errors import ConfigError, PyggmlError, UsageError
from pyggml.offload.config import parse_text, safe_load_bounded
from pyggml.offload.flags import planning_config, split_ctx, virtual_specs
from pyggml.offload.plan import layer_of
from pyggml.planning.plots import alive_at, peak_node, timeline_rows

N_AT_PEAK = 8               # tensors listed as alive at a buffer's peak
N_CACHED_PLANS = 16         # what-if plans kept (by request)
MAX_PLANS_WAITING = 4       # what-if requests waiting for the planner; more: 503
MAX_CONFIG_CHARS = 64_000
# flags of `pyggml mem` a request may not give: the model is the served one, and a config comes
# as text (no file of the server is read). --rpc (and a config's `rpc`) may name only servers
# this process is connected to (check_rpc): planning opens no connection.
REFUSED_FLAGS = {"-m": "the model is the one being served", "--model": "the model is the one "
                 "being served"}
# What a what-if request may set, as allow-lists checked on the result (the parsed flags and the
# final config, whatever spelled them: a flag, `--set`, the config text), so that a new option
# that opens a file or a connection is refused until it is listed here.
ALLOWED_DESTS = frozenset({
    "ctx", "batch_size", "ubatch_size", "threads", "threads_batch", "flash_attn",
    "cache_type_k", "cache_type_v", "swa_full", "logits_all", "n_gpu_layers", "device",
    "tensor_split", "override_tensor", "no_kv_offload", "no_op_offload", "set", "rpc",
    "virtual_device"})
ALLOWED_CONFIG_KEYS = frozenset({
    "fallback", "devices", "gpu_layers", "tensor_split", "overrides", "kv", "op_offload",
    "n_copies", "threads", "virtual_devices", "context", "rpc"})      # rpc: connected ones only


class PlanRequestError(PyggmlError):
    """A what-if plan request that cannot be planned as given (400); param: the request field
    at fault ("args" or "config")."""

    def __init__(self, message: str, param: str = "args"):
        super().__init__(message)
        self.param = param


# ---- planning ----------------------------------------------------------------------------------

def _mem_parser() -> Parser:
    p = Parser(prog="pyggml mem --plan-only", add_help=False)
    add_model_args(p)
    add_offload_args(p, planning=True)
    return p


def _mem_common(args) -> dict:
    """The run options `pyggml mem` passes beside the config (cli/mem.py cmd_mem)."""
    return {"logits_all": args.logits_all, "flash_attn": args.flash_attn != "off",
            "swa_full": args.swa_full}


def _request_config(text: str):
    """A config sent as YAML text: checked like a file, but `extends` (which reads another
    file on the server) is refused."""
    if not isinstance(text, str) or len(text) > MAX_CONFIG_CHARS:
        raise PlanRequestError(f"'config' must be YAML text of at most {MAX_CONFIG_CHARS} "
                               f"characters", "config")
    try:
        data = safe_load_bounded(text, "<request config>")
    except ConfigError as e:
        raise PlanRequestError(f"'config' is not valid YAML: {e}", "config") from None
    if data is None:
        return None
    if isinstance(data, dict) and "extends" in data:
        raise PlanRequestError("'config': `extends` is not taken here (it would read a file on "
                               "the server); send the whole config", "config")
    try:
        return parse_text(text, "<request config>")
    except ConfigError as e:
        raise PlanRequestError(f"'config': {e}", "config") from None


def check_rpc(endpoints, param: str) -> None:
    """A what-if may name the rpc-servers this process is connected to (the served run's: their
    devices are planned with the memory the live connection reports); any other is refused:
    planning would open a connection from the server to wherever the request says, and an
    rpc-server serves one client at a time."""
    if not endpoints:
        return
    from pyggml.backend.rpc import RpcError, connected_endpoints, parse_endpoints
    try:
        wanted = parse_endpoints(endpoints)
    except RpcError as e:
        raise PlanRequestError(f"'{param}': {e}", param) from None
    have = connected_endpoints()
    other = [e for e in wanted if e not in have]
    if other:
        raise PlanRequestError(
            f"'{param}': rpc-server {', '.join(other)}: this server is not connected to it "
            f"(connected: {', '.join(have) or 'none'}); a what-if plan opens no connection, so "
            f"it can name only those (plan others with `pyggml mem --plan-only --rpc ...` where "
            f"they can be reached)", param)


def check_final_config(cfg) -> None:
    """The config a what-if plan is made of, whatever spelled it (flags, `--set`, the config
    text): only ALLOWED_CONFIG_KEYS, and rpc-servers this process is connected to."""
    param = "config" if cfg.files or "request config" in str(cfg.source) else "args"
    for k in cfg.data:
        if k not in ALLOWED_CONFIG_KEYS:
            raise PlanRequestError(f"'{param}': `{k}` is not taken by a what-if plan (it takes "
                                   f"only settings that open no file and no connection)", param)
    check_rpc(cfg.get(("rpc",)) or [], param)


def what_if_args(body: dict):
    """The argparse namespace `pyggml mem` would get for a POST body {"args": "-ngl 99
    --virtual-device laptop=8GiB" or [...], "config": "YAML text"} (the config in args.ctx)."""
    raw = body.get("args", [])
    if isinstance(raw, str):
        try:
            raw = shlex.split(raw)
        except ValueError as e:
            raise PlanRequestError(f"'args': {e}") from None
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise PlanRequestError("'args' must be a string or a list of strings (pyggml mem flags)")
    for a in raw:
        flag = a.split("=", 1)[0]
        if flag in REFUSED_FLAGS:
            raise PlanRequestError(f"'args': {flag} is not taken here ({REFUSED_FLAGS[flag]})")
    p = _mem_parser()
    try:
        p.check_flags(raw)
        args = p.parse_args(raw)
    except UsageError as e:
        raise PlanRequestError(f"'args': {e}") from None
    defaults = p.parse_args([])
    for dest, v in vars(args).items():
        if dest not in ALLOWED_DESTS and v != getattr(defaults, dest, None):
            flag = next((o for a in p._actions if a.dest == dest for o in a.option_strings),
                        dest)
            raise PlanRequestError(f"'args': {flag} is not taken by a what-if plan (it takes "
                                   f"only options that open no file and no connection)")
    n_ctx, path = split_ctx(args.ctx)
    if path is not None:
        raise PlanRequestError(f"'args': -c {path}: a config file of the server is not read; "
                               f"send the config as text in 'config'")
    check_rpc(args.rpc or "", "args")
    cfg = _request_config(body["config"]) if body.get("config") is not None else None
    if cfg is not None:
        check_rpc(cfg.get(("rpc",)) or [], "config")
        # split_ctx takes anything but an integer as the config: a Config object works like a
        # path (config_from_flags loads either), so the flags amend it exactly as on the CLI
        args.ctx = ([str(n_ctx)] if n_ctx is not None else []) + [cfg]
    return args


def estimate_what_if(model_path: str, body: dict):
    """The MemReport `pyggml mem --plan-only` makes for the request's flags and config; where a
    device does not fit, plan.fit_changes holds the changes that fit (as `pyggml plan
    --check-fit` lists them)."""
    from pyggml.planning.fit import suggest_changes
    from pyggml.planning.measure import estimate
    from pyggml.planning.memory import Planner
    args = what_if_args(body)
    virtual = virtual_specs(args)
    cfg = planning_config(args, virtual)       # as `pyggml mem` reads its flags
    check_final_config(cfg)
    rep = estimate(model_path, virtual=virtual, config=cfg, with_nodes=True, **_mem_common(args))
    if rep.plan.not_fitting():
        with Planner(model_path, virtual=virtual) as planner:
            rep.plan.fit_changes = suggest_changes(planner, rep.plan)
    return rep


def estimate_running(llm):
    """The MemReport of the run being served: its offload plan, options and the config that
    made them (its rules, rpc-servers and llama.cpp flags; None for a run made from -ngl
    alone). Remote devices are the served run's own (the live connections: their memory is
    asked there). A CPU-only run is planned with the CPU only (listing devices would load
    every backend module into the server: Vulkan's driver is ~50 MB resident). A draft model
    the server decodes with is planned too, as the runtime opened it."""
    from pyggml.backend.base import Registry
    from pyggml.offload import CPU
    from pyggml.planning.measure import estimate
    from pyggml.llm.speculative import DraftModel
    cpu_only = all(n == CPU for n in llm.offload.devices_used())
    draft = {}          # the served draft model's weights, KV cache and compute (RunPlan.draft)
    dm = llm.speculator.draft if llm.speculator is not None else None
    if isinstance(dm, DraftModel) and dm.llm is not None:
        draft = {"draft_model": dm.llm.path, "n_draft": llm.run.opts.n_draft}
    return estimate(llm.path, config=llm.config, offload=llm.offload, opts=llm.run.opts,
                    with_nodes=True,
                    registry=Registry(("pyggml.backend.cpu",)) if cpu_only else None, **draft)


class PlannerBusy(PyggmlError):
    """Too many what-if plans are waiting (503, retry later)."""


class PlanCache:
    """One plan at a time (planning is CPU work beside the decode loop); the running plan is
    made once, what-if plans are kept per request (least recently used dropped)."""

    def __init__(self, llm):
        self.llm = llm
        self._lock = threading.Lock()
        self._running: dict | None = None
        self._what_if: OrderedDict[str, dict] = OrderedDict()
        self._n_waiting = 0                     # what-if requests in what_if() now
        self._count_lock = threading.Lock()

    def running(self) -> dict:
        with self._lock:
            if self._running is None:
                t0 = time.perf_counter()
                rep = estimate_running(self.llm)
                self._running = plan_json(rep, {"kind": "running"}, time.perf_counter() - t0,
                                          file_facts(self.llm.model))
            return self._running

    def what_if(self, body: dict) -> dict:
        with self._count_lock:
            if self._n_waiting >= MAX_PLANS_WAITING:
                raise PlannerBusy(f"{self._n_waiting} plans are being made or waiting; retry "
                                  f"later")
            self._n_waiting += 1
        try:
            return self._what_if_locked(body)
        finally:
            with self._count_lock:
                self._n_waiting -= 1

    def _what_if_locked(self, body: dict) -> dict:
        key = json.dumps({"args": body.get("args"), "config": body.get("config")},
                         sort_keys=True)
        with self._lock:
            hit = self._what_if.get(key)
            if hit is not None:
                self._what_if.move_to_end(key)
                return hit
            t0 = time.perf_counter()
            try:
                rep = estimate_what_if(self.llm.path, body)
            except PlanRequestError:
                raise
            except PyggmlError as e:         # a plan that cannot be made: say why
                raise PlanRequestError(str(e), "args" if body.get("args") else
                                       "config") from None
            args = body.get("args", [])
            out = plan_json(rep, {"kind": "what-if",
                                  "args": shlex.split(args) if isinstance(args, str) else args,
                                  "config": body.get("config")}, time.perf_counter() - t0,
                             file_facts(self.llm.model))
            self._what_if[key] = out
            while len(self._what_if) > N_CACHED_PLANS:
                self._what_if.popitem(last=False)
            return out


# ---- the plan as JSON --------------------------------------------------------------------------

def _where(name: str, n_layer: int) -> int:
    """A weight's row in the per-layer table: its layer; -1 the embedding; n_layer the rest
    (output norm and head)."""
    il = layer_of(name)
    if il is not None:
        return il
    return -1 if name.startswith("token_embd") else n_layer


def _short(name: str) -> str:
    s = name.split(".", 2)[2] if layer_of(name) is not None else name
    return s[:-7] if s.endswith(".weight") else s


def layers_json(rp) -> list[dict]:
    """Per layer (-1: embedding, 0..n_layer-1, n_layer: output head): weights (grouped by device
    and rule), the KV cache, and per phase the ops by device and scheduler cause (views, which
    compute nothing, left out)."""
    n_layer = rp.facts["n_layer"]
    rows = {il: {"layer": il, "weights": [], "kv": None, "ops": {}}
            for il in range(-1, n_layer + 1)}
    groups: dict[tuple, dict] = {}
    for name, p in rp.offload.weights.items():
        if name not in rp.tensor_bytes:
            continue
        il = _where(name, n_layer)
        dev = p.buffer_type or p.device
        g = groups.get((il, dev, p.rule))
        if g is None:
            g = groups[(il, dev, p.rule)] = {"device": dev, "rule": p.rule, "bytes": 0,
                                             "tensors": []}
            rows[il]["weights"].append(g)
        g["bytes"] += rp.tensor_bytes[name]
        g["tensors"].append(_short(name))
    for x in rp.kv_layers:
        rows[x.layer]["kv"] = {"device": x.device, "rule": rp.offload.kv[x.layer].rule,
                               "bytes": x.bytes, "cells": x.cells, "sliding": x.sliding}
    for phase, nodes in rp.nodes.items():
        for n in nodes:
            if n.view:
                continue
            ops = rows[n.layer]["ops"].setdefault(phase, {})
            key = f"{n.device} {n.cause}"
            ops[key] = ops.get(key, 0) + 1
    out = []
    for il in range(-1, n_layer + 1):
        r = rows[il]
        r["ops"] = {ph: [{"device": k.split(" ", 1)[0], "cause": k.split(" ", 1)[1], "n": v}
                         for k, v in sorted(ops.items(), key=lambda kv: -kv[1])]
                    for ph, ops in r["ops"].items()}
        if r["weights"] or r["kv"] or r["ops"]:
            out.append(r)
    return out


def timeline_json(rp) -> dict:
    """Per phase (scheduler): each compute buffer's bytes alive per node (live_bytes[i + 1]
    while node i runs, [0] before the first), its planned peak, the lower bound (most bytes
    alive at once), the naive sum, and the largest tensors alive at the peak."""
    out = {}
    for phase, rep in rp.reports.items():
        rows = timeline_rows(rep)
        # node names of the graph the allocator planned (the scheduler's copy: with the copies
        # of split inputs, so its indices are not the model graph's)
        names: list[str | None] = [None] * rep.n_nodes
        for t in rep.tensors:
            if t.role == "node":
                names[t.index] = t.name
        bufs = []
        for b in rep.buffers:
            if b.shares is not None or b.peak == 0:
                continue
            at = peak_node(b.live_bytes)
            alive = alive_at([r for r in rows if r.buffer_id == b.buffer_id], at, rep.n_nodes)
            bufs.append({
                "name": b.name, "peak": b.peak, "max_live": b.max_live, "naive": b.naive,
                "peak_no_inplace": b.peak_no_inplace, "chunks": b.chunk_sizes,
                "n_fresh": b.n_fresh, "n_inplace": b.n_inplace,
                "n_view_parent": b.n_view_parent, "live_bytes": b.live_bytes,
                "peak_node": at,
                "peak_node_name": names[at] if 0 <= at < len(names) else None,
                "at_peak_n": len(alive), "at_peak_bytes": sum(r.size for r in alive),
                "at_peak": [{"tensor": r.tensor, "op": r.op, "size": r.size, "first": r.first,
                             "last": r.last} for r in alive[:N_AT_PEAK]]})
        out[phase] = {"n_nodes": rep.n_nodes, "node_names": names, "buffers": bufs}
    return out


def file_facts(gguf) -> dict:
    """What the GGUF file holds: its name, parameters, and the quant mix (tensor type ->
    bytes and tensor count, largest first; as in the file, before any device's padding)."""
    mix: dict[str, dict] = {}
    for t in gguf.tensors.values():
        m = mix.setdefault(t.type.name.lower(), {"bytes": 0, "tensors": 0})
        m["bytes"] += t.nbytes
        m["tensors"] += 1
    return {"name": gguf.get_str("general.name", None),
            "n_params": sum(t.nelements() for t in gguf.tensors.values()),
            "n_tensors": len(gguf.tensors),
            "quant_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))}


def plan_json(rep, source: dict, seconds: float, facts: dict) -> dict:
    """The plan as JSON; facts: file_facts of the model."""
    rp = rep.plan
    model = dict(rp.facts, **facts, weights_as_placed=sum(rp.tensor_bytes.values()))
    fit = None if rp.fit_changes is None else [
        {"what": c.what, "sets": c.sets, "moved": c.moved} for c in rp.fit_changes]
    return {"object": "pyggml.plan", "source": source, "plan_seconds": round(seconds, 3),
            "model": model, "mem": rep.to_dict(), "not_fitting": rp.not_fitting(),
            "fit_changes": fit, "layers": layers_json(rp), "timeline": timeline_json(rp)}


# ---- live --------------------------------------------------------------------------------------

def live_json(server) -> dict:
    """A snapshot of the engine (read without its lock: counts may be a step apart)."""
    e, m, llm = server.engine, server.engine.metrics, server.llm
    slots = []
    for s in e.slots:
        job = s.job
        state = "idle" if job is None else ("embedding" if job.kind == "embed" else
                                            "prompt" if s.todo else "generating")
        gen = job.gen if job is not None else None
        slots.append({"id": s.seq_id, "state": state, "kv_cells": len(llm.seq_tokens(s.seq_id)),
                      "n_ctx_slot": e.n_ctx_slot, "prompt_tokens": len(job.ids) if job else 0,
                      "prompt_left": len(s.todo),
                      "generated": len(gen.tokens) if gen is not None else 0})
    return {"object": "pyggml.live", "time": time.time(),
            "uptime_s": round(time.time() - server.t_start, 1), "model": server.model_name,
            "slots": slots, "slots_busy": e.busy_slots(), "slots_total": len(e.slots),
            "queue_length": e.queue_length(), "queue_size": e.queue_size,
            "kv_cells_used": llm.kv.n_used(), "kv_cells_total": llm.n_ctx,
            "tokens_per_second": {"window_s": m.generated_per_s.seconds,
                                  "generated": m.generated_per_s.last(),
                                  "prompt": m.prompt_per_s.last()},
            "totals": {"requests": sum(m.requests_total.values()),
                       "requests_rejected": m.requests_rejected_total,
                       "requests_cancelled": m.requests_cancelled_total,
                       "prompt_tokens": m.prompt_tokens_total,
                       "prompt_tokens_reused": m.prompt_tokens_reused_total,
                       "generated_tokens": m.generated_tokens_total,
                       "decode_steps": m.decode_steps_total,
                       "decode_seconds": round(m.decode_seconds_total, 3)}}
