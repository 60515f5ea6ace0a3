"""Offload config files: YAML read with line numbers, `extends:`, `--set key=value`, and a
schema every value is checked against before anything is planned.

    cfg = load_config("configs/kv-on-cpu.yaml", sets=["context.n_ctx=8192"])
    cfg.get(("gpu_layers",))              # the value (None when unset)
    cfg.where_of(("overrides", 0))        # Where('configs/kv-on-cpu.yaml', 12, 5)

Every value remembers where it came from (file, line and column; `--set ...`; a command-line
flag), so that errors and the plan's "deciding rule" column can point at it. The schema (SCHEMA
below, JSON-Schema-like) is the one description of the format: `configs/README.md` documents the
same keys, and a test keeps the two in step. What needs the model or the machine (does a device
exist, does a rule match any tensor) is checked later, by pyggml.offload, with the same marks.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from pyggml.errors import ConfigError
from pyggml.units import size_or_none

KINDS = ("attn", "ffn", "experts", "norm", "embd", "output")
PHASES = ("prefill", "decode")
# (pyggml.llm.kv_cache.KV_TYPES; tests/test_kv_types.py checks they agree)
KV_TYPE_NAMES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
MAX_EXTENDS_DEPTH = 8


# ---- where a value came from ---------------------------------------------------------------------

@dataclass(frozen=True)
class Where:
    """file: a path, or '<command line>'; line, col: 1-based (None for command-line values);
    text: how the value was given on the command line ('-ngl 99', '--set gpu_layers=4')."""
    file: str
    line: int | None = None
    col: int | None = None
    text: str | None = None

    def __str__(self) -> str:
        if self.text is not None:
            return self.text
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}" + (f":{self.col}" if self.col is not None else "")

    @property
    def from_file(self) -> bool:
        return self.text is None and self.line is not None


CLI = "<command line>"


def key_path(path) -> str:
    """('overrides', 1, 'device') -> 'overrides[1].device'."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(top level)"


# ---- the schema ----------------------------------------------------------------------------------

_DEVICE = {"type": ["string", "integer"], "format": "device",
           "doc": "a device: its name as `pyggml plan` lists it (Vulkan0, CPU; any case) or its "
                  "index in that list; `cpu` always exists"}
_LAYERS = {"type": ["integer", "string", "array"], "format": "layers",
           "doc": "transformer layers: an index (3), an inclusive range ('0-11'), 'all', or a list "
                  "of those ([0, '4-7']); ranges in one list must not overlap"}
_KV_TYPE = {"enum": list(KV_TYPE_NAMES), "doc": "KV cache element type"}
_POS_INT = {"type": "integer", "minimum": 1}

SCHEMA = {
    "type": "object",
    "doc": "An offload config: which device holds each weight and each layer's KV cache, where "
           "ops run per phase, and the runtime sizes that go with it.",
    "properties": {
        "extends": {"type": "string",
                    "doc": "a base config (path relative to this file) whose values this file "
                           "replaces; mappings merge key by key, lists are replaced whole"},
        "fallback": {"enum": ["error", "cpu"], "default": "error",
                     "doc": "what a device named here that this machine lacks becomes: an error "
                            "(default) or the CPU"},
        "devices": {"type": "array", "items": _DEVICE,
                    "doc": "devices in priority order (the scheduler prefers earlier ones); the "
                           "CPU is always available and always last; default: every GPU found "
                           "when gpu_layers > 0, else none"},
        "gpu_layers": {"oneOf": [{"type": "integer", "minimum": 0}, {"enum": ["all"]}],
                       "default": 0,
                       "doc": "llama.cpp's -ngl: the LAST N of the n_layer + 1 layer slots (the "
                              "output layer is the last slot) go to the GPUs of `devices`; 'all' "
                              "= every layer and the output; token embeddings stay on the CPU"},
        "tensor_split": {"type": "array", "items": {"type": "number", "minimum": 0},
                         "minItems": 1,
                         "doc": "llama.cpp's -ts: the share of gpu_layers each GPU of `devices` "
                                "gets, in order (default: in proportion to free memory)"},
        "overrides": {
            "type": "array",
            "doc": "ordered rules, llama.cpp's -ot generalised: the first rule that matches a "
                   "tensor decides its device; rules come before gpu_layers",
            "items": {
                "type": "object",
                "anyOf_required": ["match", "layers", "kind"],
                "oneOf_required": ["device", "buffer_type"],
                "properties": {
                    "name": {"type": "string", "doc": "a label shown by `pyggml plan`"},
                    "match": {"type": "string", "format": "regex",
                              "doc": "a Python regex searched in tensor names (as -ot)"},
                    "layers": dict(_LAYERS, doc="only tensors of these layers (blk.N.*)"),
                    "kind": {"type": ["string", "array"], "format": "kinds",
                             "doc": "only tensors of these kinds: attn (attention matrices and "
                                    "biases), ffn (feed-forward matrices, experts too), "
                                    "experts (a mixture-of-experts model's ffn_*_exps and "
                                    "ffn_*_shexp: -ot exps=CPU), norm "
                                    "(normalisation weights in layers), embd (token "
                                    "embeddings), output (output matrix and output norm); one "
                                    "or a list"},
                    "device": dict(_DEVICE, doc="where matched tensors go"),
                    "buffer_type": {"type": "string",
                                    "doc": "or: a buffer type by name (as -ot takes it)"},
                    "phase": {"enum": list(PHASES),
                              "doc": "only in this phase: the ops that read matched weights run "
                                     "on `device` during prefill (prompt batches) or decode "
                                     "(one token); the weights stay where the rules without "
                                     "phase put them and are copied per batch"},
                },
            },
        },
        "kv": {
            "type": "object",
            "doc": "the KV cache",
            "properties": {
                "device": {"type": ["string", "integer"], "format": "kv_device",
                           "doc": "layer (default: each layer's KV on its gpu_layers device, as "
                                  "llama.cpp), cpu (llama.cpp's --no-kv-offload) or a device"},
                "type_k": dict(_KV_TYPE, doc="K element type: f16 (default), f32, bf16, "
                                             "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"),
                "type_v": dict(_KV_TYPE, doc="V element type: f16 (default), f32, bf16, "
                                             "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"),
                "ranges": {
                    "type": "array",
                    "doc": "per layer range: device and types (ranges must not overlap)",
                    "items": {
                        "type": "object",
                        "required": ["layers"],
                        "properties": {
                            "layers": _LAYERS,
                            "device": {"type": ["string", "integer"], "format": "kv_device",
                                       "doc": "as kv.device"},
                            "type_k": _KV_TYPE,
                            "type_v": _KV_TYPE,
                        },
                    },
                },
            },
        },
        "op_offload": {
            "oneOf": [{"type": "boolean"},
                      {"type": "object", "properties": {
                          "prefill": {"type": "boolean", "doc": "prompt batches"},
                          "decode": {"type": "boolean", "doc": "single tokens"}}}],
            "default": True, "expand": ("prefill", "decode"),
            "doc": "may the scheduler move a big matrix product to a GPU although its weight is "
                   "in host memory (the weight is copied per batch; llama.cpp's default, "
                   "--no-op-offload turns it off); a boolean or per phase"},
        "n_copies": {"type": "integer", "minimum": 1, "maximum": 4, "default": 1,
                     "doc": "pipeline parallelism: copies of each split input, so that the next "
                            "batch's inputs can be written while devices still work"},
        "threads": {
            "oneOf": [_POS_INT,
                      {"type": "object", "properties": {
                          "decode": dict(_POS_INT, doc="CPU threads for single tokens (-t)"),
                          "batch": dict(_POS_INT, doc="CPU threads for batches (-tb)")}}],
            "expand": ("decode", "batch"),
            "doc": "CPU threads: one number, or per kind of work"},
        "rpc": {
            "type": "array", "items": {"type": "string", "format": "endpoint"},
            "doc": "llama.cpp rpc-servers to use, as HOST:PORT (as --rpc): their devices, "
                   "RPC[HOST:PORT], join `devices` and may be named in rules; connected when "
                   "the config is used. The server is unauthenticated: loopback or a trusted "
                   "network only (docs/rpc.md)"},
        "virtual_devices": {
            "type": "array",
            "doc": "planning-only devices (no hardware) with a declared memory: `pyggml plan`, "
                   "`pyggml mem` and the fit advisor plan against them; name them in `devices` "
                   "and rules like real ones (a run needs the real device's name there)",
            "items": {
                "type": "object",
                "required": ["name", "memory"],
                "properties": {
                    "name": {"type": "string", "doc": "how devices and rules name it"},
                    "memory": {"type": ["string", "integer"], "format": "size",
                               "doc": "its memory: bytes, or a size like 8GiB or 512MiB"},
                    "kind": {"enum": ["gpu", "igpu"], "default": "gpu",
                             "doc": "gpu: its own memory; igpu: an integrated GPU whose memory "
                                    "is system RAM (UMA)"},
                },
            },
        },
        "context": {
            "type": "object",
            "doc": "sizes",
            "properties": {
                "n_ctx": {"type": "integer", "minimum": 0,
                          "doc": "KV cells (-c; 0: the model's trained context)"},
                "n_batch": dict(_POS_INT, doc="tokens per eval chunk (-b)"),
                "n_ubatch": dict(_POS_INT, doc="tokens per graph (-ub)"),
                "n_seq_max": {"type": "integer", "minimum": 1, "maximum": 64,
                              "doc": "sequences decoded together (-np)"},
            },
        },
    },
}


def schema_keys(schema=SCHEMA, prefix="") -> list[str]:
    """Every key path the schema knows: 'gpu_layers', 'overrides[].match', 'kv.ranges[].layers'."""
    out = []
    for branch in [schema] + list(schema.get("oneOf", [])):
        items = branch.get("items")
        if items is not None and items.get("type") == "object":
            out += schema_keys(items, prefix + "[]")
        for k, sub in branch.get("properties", {}).items():
            p = f"{prefix}.{k}" if prefix else k
            out.append(p)
            out += schema_keys(sub, p)
    return list(dict.fromkeys(out))


def device_refs(data, schema=SCHEMA) -> list:
    """Every device a config's data names, where the schema says a value is a device (format
    device / kv_device: names, indices, 'cpu', 'layer') and every rule's buffer_type."""
    out = []
    if isinstance(data, list):
        items = schema.get("items")
        for x in data if items is not None else ():
            out += device_refs(x, items)
        return out
    if schema.get("format") in ("device", "kv_device"):
        return [data]
    if not isinstance(data, dict):
        return out
    props = {}
    for branch in [schema] + list(schema.get("oneOf", [])):
        props.update(branch.get("properties", {}))
    for k, v in data.items():
        if k == "buffer_type":
            out.append(v)
        elif k in props:
            out += device_refs(v, props[k])
    return out


def describe_schema(schema=SCHEMA, prefix="", out=None) -> str:
    """The schema as indented text (`pyggml plan --schema`)."""
    lines = [] if out is None else out
    for k, sub in schema.get("properties", {}).items():
        p = f"{prefix}.{k}" if prefix else k
        lines.append(f"{p}: {_expected(sub)}\n    {sub.get('doc', '')}")
        describe_schema(sub, p, lines)
        for br in sub.get("oneOf", []):
            describe_schema(br, p, lines)
        if "items" in sub and sub["items"].get("type") == "object":
            describe_schema(sub["items"], p + "[]", lines)
    return "\n".join(lines)


# ---- the loaded config ---------------------------------------------------------------------------

class Config:
    """A validated config: `data` (plain dicts, lists and scalars) and, for every key path, where
    its value was given. Immutable by convention: `with_values` / `with_sets` return new ones."""

    def __init__(self, data: dict, where: dict, source: str, files=()):
        self.data = data
        self.where = where
        self.source = source            # the main file, or '<command line>'
        self.files = list(files)        # the files read, this one first, then its bases

    def get(self, path, default=None):
        cur = self.data
        for p in path:
            if isinstance(p, int):
                if not isinstance(cur, list) or not -len(cur) <= p < len(cur):
                    return default
            elif not isinstance(cur, dict) or p not in cur:
                return default
            cur = cur[p]
        return cur

    def has(self, path) -> bool:
        sentinel = object()
        return self.get(path, sentinel) is not sentinel

    def where_of(self, path) -> Where:
        """Where the value at `path` (or the nearest enclosing one) was given."""
        path = tuple(path)
        while path:
            w = self.where.get(path)
            if w is not None:
                return w
            path = path[:-1]
        return self.where.get((), Where(self.source))

    def with_values(self, values: dict, text: str) -> "Config":
        """A copy with `values` (nested dicts) set, each marked as given by `text` (e.g. a flag)."""
        data, where = _copy(self.data), dict(self.where)
        for path, v in _flatten(values):
            _set_path(data, where, path, v, Where(CLI, text=text), text)
        return _validated(Config(data, where, self.source, self.files))

    def with_sets(self, sets) -> "Config":
        """A copy with `--set key=value` items applied (values parsed as YAML)."""
        data, where = _copy(self.data), dict(self.where)
        for item in sets:
            path, value, text = parse_set(item)
            _set_path(data, where, path, value, Where(CLI, text=text), text)
        return _validated(Config(data, where, self.source, self.files))

    def to_yaml(self) -> str:
        return dump_yaml(self.data)

    def __repr__(self) -> str:
        return f"Config({self.source!r}, {self.data!r})"


def _copy(x):
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


def _flatten(values: dict, prefix=()):
    for k, v in values.items():
        if isinstance(v, dict) and v:
            yield from _flatten(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def dump_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


# ---- reading YAML with marks ---------------------------------------------------------------------

def _where(file: str, node) -> Where:
    m = node.start_mark
    return Where(file, m.line + 1, m.column + 1)


#: bounds on a YAML document (configs from files, requests and --set values): its text, the
#: values it expands to (aliases count as often as they are used: a "billion laughs" document
#: of a few hundred characters expands to 10^9 values) and its nesting
MAX_YAML_CHARS = 1_000_000
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


def _compose(text: str, file: str):
    """The node tree of one YAML document, within MAX_YAML_CHARS and MAX_YAML_DEPTH."""
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(f"{file}: {len(text)} characters of YAML; at most {MAX_YAML_CHARS} "
                          f"are read")
    # nesting counted on the text before the (recursive) composer sees it
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > MAX_YAML_DEPTH:
                break
        elif ch in "]}":
            depth = max(0, depth - 1)
    try:
        if depth > MAX_YAML_DEPTH:
            raise RecursionError
        loader = yaml.SafeLoader(text)
        try:
            return loader.get_single_node()
        finally:
            loader.dispose()
    except RecursionError:
        raise ConfigError(f"{file}: YAML nested more than {MAX_YAML_DEPTH} levels deep") from None


def _expand_budget(file: str):
    """A function to call per value converted: ConfigError naming file:line:col once more than
    MAX_YAML_NODES values (aliases expanded) or MAX_YAML_DEPTH levels were converted."""
    count = [0]

    def spend(node, depth: int) -> None:
        count[0] += 1
        if count[0] > MAX_YAML_NODES or depth > MAX_YAML_DEPTH:
            what = (f"more than {MAX_YAML_NODES} values" if count[0] > MAX_YAML_NODES
                    else f"nesting deeper than {MAX_YAML_DEPTH}")
            raise ConfigError(f"{_where(file, node)}: the YAML expands to {what} (aliases "
                              f"count each time they are used); refused")
    return spend


def safe_load_bounded(text: str, file: str):
    """yaml.safe_load within the bounds above (ConfigError naming file:line:col past them)."""
    try:
        node = _compose(text, file)
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        at = f"{file}:{m.line + 1}:{m.column + 1}" if m is not None else file
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(f"{at}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{file}: YAML error: {e}") from None
    if node is None:
        return None
    spend = _expand_budget(file)

    def walk(n, depth):
        spend(n, depth)
        if isinstance(n, yaml.MappingNode):
            for kn, vn in n.value:
                walk(kn, depth + 1)
                walk(vn, depth + 1)
        elif isinstance(n, yaml.SequenceNode):
            for item in n.value:
                walk(item, depth + 1)
    walk(node, 0)
    builder = yaml.SafeLoader("")
    try:
        return builder.construct_document(node)
    except (yaml.YAMLError, ValueError) as e:       # ValueError: an integer too long to convert
        raise ConfigError(f"{file}: YAML error: {str(e)[:200]}") from None
    finally:
        builder.dispose()


def _parse_yaml(text: str, file: str) -> tuple[dict, dict]:
    """(data, {key path: Where}) of one YAML document; ConfigError with line and column for a
    syntax error, a duplicate key, a top level that is not a mapping, or a document past the
    bounds above (an alias bomb)."""
    try:
        node = _compose(text, file)
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        at = f"{file}:{m.line + 1}:{m.column + 1}" if m is not None else file
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(f"{at}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{file}: YAML error: {e}") from None
    where: dict = {}
    if node is None:
        return {}, where
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{_where(file, node)}: the config must be a mapping of keys "
                          f"(gpu_layers: ..., overrides: ...), got a "
                          f"{'list' if isinstance(node, yaml.SequenceNode) else 'scalar'}")
    errors: list[str] = []
    builder = yaml.SafeLoader("")
    spend = _expand_budget(file)

    def convert(n, path):
        spend(n, len(path))
        if isinstance(n, yaml.MappingNode):
            out = {}
            for kn, vn in n.value:
                if not isinstance(kn, yaml.ScalarNode):
                    errors.append(f"{_where(file, kn)}: {key_path(path)}: keys must be plain "
                                  f"words")
                    continue
                k = builder.construct_object(kn)
                if not isinstance(k, str):
                    k = str(k)
                p = path + (k,)
                if k in out:
                    errors.append(f"{_where(file, kn)}: {key_path(p)}: duplicate key (first "
                                  f"given at line {where[p].line})")
                    continue
                where[p] = _where(file, kn)
                out[k] = convert(vn, p)
            return out
        if isinstance(n, yaml.SequenceNode):
            out = []
            for i, item in enumerate(n.value):
                where[path + (i,)] = _where(file, item)
                out.append(convert(item, path + (i,)))
            return out
        try:
            return builder.construct_object(n)
        except ValueError as e:         # e.g. an integer of more digits than Python converts
            raise ConfigError(f"{_where(file, n)}: {key_path(path)}: {str(e)[:100]}") from None

    where[()] = Where(file, 1, 1)
    data = convert(node, ())
    if errors:
        raise ConfigError("invalid offload config:\n  " + "\n  ".join(errors))
    return data, where


def _merge(base, base_where, child, child_where, prefix=()):
    """child over base: mappings merge key by key, everything else is replaced."""
    out = dict(base)
    for k, v in child.items():
        p = prefix + (k,)
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], base_where, v, child_where, p)
        else:
            for wp in [wp for wp in base_where if wp[:len(p)] == p]:
                del base_where[wp]
            out[k] = v
    for wp, w in child_where.items():
        if wp[:len(prefix)] == prefix:
            base_where[wp] = w
    return out


def _read(path: Path, seen: tuple, at: Where | None) -> tuple[dict, dict, list]:
    where_txt = f"{at}: extends: " if at is not None else ""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where_txt}cannot read config '{path}': {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where_txt}config '{path}' is not UTF-8 text ({e.reason} at byte "
                          f"{e.start})") from None
    data, where = _parse_yaml(text, str(path))
    files = [str(path)]
    base = data.pop("extends", None)
    if base is None:
        return data, where, files
    ew = where.pop(("extends",))
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{ew}: extends: expected the path of a base config (a string), got "
                          f"{_got(base)}")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ConfigError(f"{ew}: extends: '{base}' is already being read (a cycle: "
                          f"{' -> '.join(str(s) for s in seen + (base_path,))})")
    if len(seen) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"{ew}: extends: more than {MAX_EXTENDS_DEPTH} nested base configs")
    bdata, bwhere, bfiles = _read(base_path, seen + (base_path,), ew)
    merged = _merge(bdata, bwhere, data, where)
    bwhere[()] = Where(str(path), 1, 1)
    return merged, bwhere, files + bfiles


def load_config(source, sets=()) -> Config:
    """A Config from a YAML file path (or an already loaded Config), with `--set key=value`
    items applied; validated against SCHEMA. Raises ConfigError naming file, line and key."""
    if isinstance(source, Config):
        return source.with_sets(sets) if sets else source
    if isinstance(source, dict):
        cfg = config_from_dict(source)
        return cfg.with_sets(sets) if sets else cfg
    path = Path(os.fspath(source))
    data, where, files = _read(path, (path.resolve(),), None)
    cfg = Config(data, where, str(path), files)
    return cfg.with_sets(sets) if sets else _validated(cfg)


def config_from_dict(data: dict, text: str = "<python>") -> Config:
    """A Config from Python values (LLM(config={...}))."""
    if not isinstance(data, dict):
        raise ConfigError(f"{text}: a config must be a mapping, got {_got(data)}")
    where = {(): Where(CLI, text=text)}
    cfg = Config({}, where, text)
    return cfg.with_values(data, text) if data else _validated(cfg)


def parse_text(text: str, name: str = "<string>") -> Config:
    """A Config from YAML text (tests, emitted configs); `extends` is relative to the cwd."""
    data, where = _parse_yaml(text, name)
    if "extends" in data:
        base = data.pop("extends")
        ew = where.pop(("extends",))
        bdata, bwhere, files = _read(Path(base).resolve(), (), ew)
        data = _merge(bdata, bwhere, data, where)
        where = bwhere
    return _validated(Config(data, where, name))


# ---- --set -------------------------------------------------------------------------------------

_SET_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|\d+))*$")


def parse_set(item: str) -> tuple[tuple, object, str]:
    """'context.n_ctx=8192' -> (('context', 'n_ctx'), 8192, '--set context.n_ctx=8192')."""
    text = f"--set {item}"
    if "=" not in item:
        raise ConfigError(f"{text}: expected KEY=VALUE (e.g. --set gpu_layers=8 or "
                          f"--set context.n_ctx=4096)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not _SET_KEY.match(key):
        raise ConfigError(f"{text}: '{key}' is not a key path (words joined by dots, list "
                          f"indices as numbers: overrides.0.device)")
    try:
        value = safe_load_bounded(raw, "value") if raw.strip() else None
    except ConfigError as e:
        raise ConfigError(f"{text}: the value is not valid YAML: {e}") from None
    path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    return path, value, text


def _schema_at(path):
    """The schema node for a key path (None when unknown)."""
    node = SCHEMA
    for p in path:
        if node is None:
            return None
        cands = [node] + list(node.get("oneOf", []))
        nxt = None
        for c in cands:
            if isinstance(p, int) and "items" in c:
                nxt = c["items"]
            elif not isinstance(p, int) and p in c.get("properties", {}):
                nxt = c["properties"][p]
            if nxt is not None:
                break
        node = nxt
    return node


def _set_path(data, where, path, value, w: Where, text: str) -> None:
    cur = data
    for i, p in enumerate(path[:-1]):
        here = path[:i + 1]
        nxt_is_index = isinstance(path[i + 1], int)
        if isinstance(p, int):
            if not isinstance(cur, list) or not 0 <= p < len(cur):
                n = len(cur) if isinstance(cur, list) else 0
                raise ConfigError(f"{text}: {key_path(path[:i])} has {n} item(s), no "
                                  f"index {p}")
            if cur[p] is None:
                cur[p] = [] if nxt_is_index else {}
            cur = cur[p]
            continue
        if not isinstance(cur, dict):
            raise ConfigError(f"{text}: {key_path(path[:i])} is not a mapping")
        v = cur.get(p)
        if v is None:
            v = cur[p] = [] if nxt_is_index else {}
            where[here] = w
        elif not isinstance(v, (dict, list)):
            sch = _schema_at(here)
            if sch is not None and "expand" in sch:      # op_offload: false -> per phase
                v = cur[p] = {k: v for k in sch["expand"]}
                for k in sch["expand"]:
                    where[here + (k,)] = where.get(here, w)
            else:
                raise ConfigError(f"{text}: {key_path(here)} is {_got(v)}, not a mapping; "
                                  f"set it whole (--set {key_path(here)}=...)")
        cur = v
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(cur, list) or not 0 <= last < len(cur):
            n = len(cur) if isinstance(cur, list) else 0
            raise ConfigError(f"{text}: {key_path(path[:-1])} has {n} item(s), no index {last}")
    elif not isinstance(cur, dict):
        raise ConfigError(f"{text}: {key_path(path[:-1])} is not a mapping")
    for wp in [wp for wp in where if wp[:len(path)] == path]:
        del where[wp]
    cur[last] = value
    where[path] = w
    if isinstance(value, (dict, list)):
        for sub, _ in _walk(value, path):
            where[sub] = w


def _walk(x, path):
    if isinstance(x, dict):
        for k, v in x.items():
            yield path + (k,), v
            yield from _walk(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield path + (i,), v
            yield from _walk(v, path + (i,))


# ---- validation --------------------------------------------------------------------------------

_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string",
               "integer": "an integer", "number": "a number", "boolean": "true or false"}


def _got(v) -> str:
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    kind = {int: "an integer", float: "a number", str: "a string"}.get(type(v), type(v).__name__)
    return f"{v!r} ({kind})"


def _is_type(v, t: str) -> bool:
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    return False


def _expected(s) -> str:
    if "oneOf" in s:
        return " or ".join(_expected(b) for b in s["oneOf"])
    if "enum" in s:
        return " or ".join(repr(x) for x in s["enum"])
    fmt = s.get("format")
    if fmt == "layers":
        return "layers (3, '0-11', 'all' or a list of those)"
    if fmt == "device":
        return "a device (name or index)"
    if fmt == "kv_device":
        return "'layer', 'cpu' or a device (name or index)"
    if fmt == "kinds":
        return f"a kind ({', '.join(KINDS)}) or a list of kinds"
    types = s.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    words = " or ".join(_TYPE_WORDS[t] for t in types)
    if "minimum" in s and "maximum" in s:
        words += f" in {s['minimum']}..{s['maximum']}"
    elif "minimum" in s:
        words += f" >= {s['minimum']}"
    if s.get("type") == "object" and s.get("properties"):
        words += f" with keys {', '.join(s['properties'])}"
    return words


def parse_layers(v) -> list[tuple[int, int]] | None:
    """Layer spec -> sorted inclusive ranges (None = all layers). ValueError with the reason."""
    if isinstance(v, str) and v.strip().lower() == "all":
        return None
    items = v if isinstance(v, list) else [v]
    if not items:
        raise ValueError("an empty list of layers")
    ranges = []
    for it in items:
        if isinstance(it, bool):
            raise ValueError(f"{_got(it)} is not a layer")
        if isinstance(it, int):
            if it < 0:
                raise ValueError(f"layer {it} is negative")
            ranges.append((it, it))
            continue
        if isinstance(it, str):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", it)
            if m:
                a = int(m.group(1))
                b = int(m.group(2)) if m.group(2) is not None else a
                if b < a:
                    raise ValueError(f"range '{it}' ends before it starts")
                ranges.append((a, b))
                continue
            if it.strip().lower() == "all":
                raise ValueError("'all' cannot be combined with other layers")
        raise ValueError(f"{_got(it)} is not a layer index or an inclusive range like '0-11'")
    ranges.sort()
    for (a0, b0), (a1, b1) in zip(ranges, ranges[1:]):
        if a1 <= b0:
            raise ValueError(f"overlapping layer ranges {_fmt_range(a0, b0)} and "
                             f"{_fmt_range(a1, b1)}")
    return ranges


def _fmt_range(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


def format_layers(ranges) -> str:
    return "all" if ranges is None else ", ".join(_fmt_range(a, b) for a, b in ranges)


def _check_format(fmt: str, v):
    """None or why `v` is not valid for the format."""
    if fmt == "regex":
        from pyggml.offload.saferegex import check_pattern
        why = check_pattern(v)
        if why is not None:
            return f"invalid regex {v!r}: {why}"
    elif fmt == "layers":
        try:
            parse_layers(v)
        except ValueError as e:
            return str(e)
    elif fmt in ("device", "kv_device"):
        if isinstance(v, int) and v < 0:
            return f"a device index must be >= 0, got {v}"
        if isinstance(v, str) and not v.strip():
            return "an empty device name"
    elif fmt == "size":
        if size_or_none(v) is None:
            return f"expected a memory size (bytes, or like 8GiB, 512MiB), got {_got(v)}"
    elif fmt == "endpoint":
        host, sep, port = str(v).rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            return f"expected HOST:PORT (e.g. 127.0.0.1:50052), got {_got(v)}"
    elif fmt == "kinds":
        items = v if isinstance(v, list) else [v]
        if not items:
            return "an empty list of kinds"
        for it in items:
            if it not in KINDS:
                hint = _did_you_mean(str(it), KINDS)
                return f"unknown kind {_got(it)}; kinds: {', '.join(KINDS)}{hint}"
    return None


def _did_you_mean(word: str, choices) -> str:
    m = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{m[0]}'?)" if m else ""


def _validate(v, s, path, cfg: Config, errors: list) -> None:
    def err(msg, at=path):
        errors.append(f"{cfg.where_of(at)}: {key_path(path)}: {msg}")

    if "oneOf" in s:
        for br in s["oneOf"]:
            if _shape_matches(v, br):
                _validate(v, br, path, cfg, errors)
                return
        err(f"expected {_expected(s)}, got {_got(v)}")
        return
    if "enum" in s:
        if v not in s["enum"] or isinstance(v, bool) != any(isinstance(x, bool)
                                                             for x in s["enum"]):
            hint = _did_you_mean(str(v), [str(x) for x in s["enum"]]) if isinstance(v, str) else ""
            err(f"expected {_expected(s)}, got {_got(v)}{hint}")
        return
    types = s.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if types and not any(_is_type(v, t) for t in types):
        err(f"expected {_expected(s)}, got {_got(v)}")
        return
    if _is_type(v, "number"):
        if "minimum" in s and v < s["minimum"] or "maximum" in s and v > s["maximum"]:
            err(f"expected {_expected(s)}, got {v}")
            return
    fmt = s.get("format")
    if fmt is not None:
        why = _check_format(fmt, v)
        if why:
            err(why)
            return
    if isinstance(v, list) and "items" in s:
        if len(v) < s.get("minItems", 0):
            err(f"expected at least {s['minItems']} item(s)")
        for i, item in enumerate(v):
            _validate(item, s["items"], path + (i,), cfg, errors)
    if isinstance(v, dict) and "properties" in s:
        props = s["properties"]
        for k, sub in v.items():
            if k not in props:
                errors.append(f"{cfg.where_of(path + (k,))}: {key_path(path + (k,))}: unknown "
                              f"key{_did_you_mean(str(k), props)}; known here: "
                              f"{', '.join(props)}")
                continue
            _validate(sub, props[k], path + (k,), cfg, errors)
        for k in s.get("required", []):
            if k not in v:
                err(f"'{k}' is required")
        any_of = s.get("anyOf_required")
        if any_of and not any(k in v for k in any_of):
            err(f"a rule needs at least one of {', '.join(any_of)} (what it matches)")
        one_of = s.get("oneOf_required")
        if one_of:
            n = sum(k in v for k in one_of)
            if n != 1:
                err(f"a rule needs exactly one of {', '.join(one_of)} (where matched tensors go)"
                    + (f", got {n}" if n else ""))


def _shape_matches(v, s) -> bool:
    if "enum" in s:
        return any(v == x and isinstance(v, bool) == isinstance(x, bool) for x in s["enum"])
    types = s.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    return any(_is_type(v, t) for t in types)


def validate(cfg: Config) -> list[str]:
    """Every schema error of `cfg`, each naming file, line and key."""
    errors: list[str] = []
    _validate(cfg.data, SCHEMA, (), cfg, errors)
    ranges = cfg.get(("kv", "ranges"))
    if isinstance(ranges, list) and not errors:
        seen: list[tuple[int, int, int]] = []
        for i, r in enumerate(ranges):
            if parse_layers(r["layers"]) is None and len(ranges) > 1:
                errors.append(f"{cfg.where_of(('kv', 'ranges', i, 'layers'))}: "
                              f"kv.ranges[{i}].layers: 'all' overlaps every other range")
                continue
            for a, b in parse_layers(r["layers"]) or []:
                for j, a2, b2 in seen:
                    if a <= b2 and a2 <= b:
                        errors.append(
                            f"{cfg.where_of(('kv', 'ranges', i, 'layers'))}: "
                            f"kv.ranges[{i}].layers: layers {_fmt_range(a, b)} overlap "
                            f"kv.ranges[{j}] (layers {_fmt_range(a2, b2)}, "
                            f"{cfg.where_of(('kv', 'ranges', j, 'layers'))})")
                seen.append((i, a, b))
    return errors


def _validated(cfg: Config) -> Config:
    errors = validate(cfg)
    if errors:
        raise ConfigError("invalid offload config:\n  " + "\n  ".join(errors))
    return cfg
