"""One run set-up (pyggml.llm.setup): the runtime and the planners build a run the same way, so
every buffer of a planned run equals the buffer `LLM` allocates, for every option the runtime has
(logits_all, swa_full, n_seq_max, KV types, phases, devices); and the package layering holds
(no import cycles, planning never imported by the engine, no document outside the repo cited)."""

import ast
import re
from pathlib import Path

import pytest

from pyggml.backend import vulkan
from pyggml.backend.base import DeviceType
from pyggml.cli import main
from pyggml.llm.runtime import LLM
from pyggml.llm.setup import DEFAULTS, ModelFile, RunOptions, build_run, resolve_offload
from pyggml.offload import CPU, VirtualSpec
from pyggml.planning.memory import Planner, plan_memory

REPO = Path(__file__).resolve().parent.parent
NO_VULKAN = vulkan.unavailable_reason()
needs_vulkan = pytest.mark.skipif(NO_VULKAN is not None, reason=f"no Vulkan device: {NO_VULKAN}")


def _model(tiny_models, arch="gemma3"):
    return tiny_models.get(arch=arch, weight_type="q8_0", n_layer=3, n_embd=128, n_ff=256,
                           n_head=4, n_head_kv=2, head_dim=32, n_vocab=1024, sliding_window=16)


def _buffers(run) -> dict:
    """Every buffer of a run by what it holds: compute per scheduler and backend, KV per
    buffer, weights per device (bytes)."""
    out = {}
    for phase, sched in run.scheds():
        for b in run.backends:
            out[f"compute.{phase}.{b.device.name}"] = sched.get_buffer_size(b)
    for i, buf in enumerate(run.kv.buffers):
        out[f"kv.{i}.{buf.buft.name}"] = buf.n_bytes
    for dev, buf in run.weight_buffers.items():
        out[f"weights.{dev}"] = buf.n_bytes
    return out


def _planned_run(path, **kw):
    mf = ModelFile(path)
    plan, opts = resolve_offload(mf, RunOptions(**kw))
    return mf, build_run(mf, plan, opts, planning=True)


SETTINGS = [dict(), dict(logits_all=True), dict(swa_full=True), dict(n_seq_max=3),
            dict(type_k="q8_0", type_v="q8_0"), dict(flash_attn=False, n_ubatch=32),
            dict(n_ctx=0)]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in
                                                                 kw.items()) or "defaults")
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_planned_run_has_the_runtimes_buffers(tiny_models, arch, kw):
    tm = _model(tiny_models, arch)
    kw = dict(dict(n_ctx=256, n_ubatch=64, n_batch=128, n_threads=1), **kw)
    mf, planned = _planned_run(tm.path, **kw)
    try:
        with LLM(tm.path, **kw) as llm:
            real = _buffers(llm.run)
            assert real == _buffers(planned) and real
            assert llm.run.opts == planned.opts
            # the planning buffers have addresses but no memory
            assert all(b.base >= 1 << 56 for b in planned.kv.buffers)
    finally:
        planned.close()
        mf.close()


@needs_vulkan
@pytest.mark.parametrize("config", ["all-on-gpu.yaml", "kv-on-cpu.yaml",
                                    "prefill-on-gpu-decode-on-cpu.yaml"])
def test_planned_run_has_the_runtimes_buffers_with_a_config(tiny_models, config):
    tm = _model(tiny_models)
    path = REPO / "configs" / config
    mf = ModelFile(tm.path)
    opts = RunOptions(n_ctx=256, n_ubatch=64, n_batch=64, n_threads=1)
    try:
        plan, o = resolve_offload(mf, opts, config=path)
        planned = build_run(mf, plan, o, planning=True)
        with LLM(tm.path, config=path, n_ctx=256, n_ubatch=64, n_batch=64, n_threads=1) as llm:
            assert _buffers(llm.run) == _buffers(planned)
            assert len(list(llm.run.scheds())) == len(list(planned.scheds()))
        planned.close()
    finally:
        mf.close()


def test_one_table_of_defaults():
    import inspect
    sig = inspect.signature(LLM.__init__).parameters
    for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "logits_all", "flash_attn",
                 "swa_full", "n_gpu_layers"):
        assert sig[name].default == getattr(DEFAULTS, name), name
    from pyggml.cli import parser
    text = parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert f"default {DEFAULTS.n_ctx}" in text and f"default {DEFAULTS.n_ubatch}" in text


def test_plan_command_plans_logits_all_and_swa_full(tiny_models, capsys):
    tm = _model(tiny_models)
    base = plan_memory(tm.path, n_ctx=512, n_ubatch=64)
    assert base.device(CPU).compute < plan_memory(tm.path, n_ctx=512, n_ubatch=64,
                                                  logits_all=True).device(CPU).compute
    assert base.kv_bytes < plan_memory(tm.path, n_ctx=512, n_ubatch=64, swa_full=True).kv_bytes

    def kv_line(*flags):
        assert main(["plan", "-m", str(tm.path), "-c", "512", "-ub", "64", *flags]) == 0
        out = capsys.readouterr().out
        return re.search(r"^\s*CPU\s+\S+ MiB\s+(\S+ MiB)\s+(\S+ MiB)", out, re.M).groups()
    kv, compute = kv_line()
    kv_full, _ = kv_line("--swa-full")
    _, compute_all = kv_line("--logits-all")
    assert float(kv_full.split()[0]) > float(kv.split()[0])
    assert float(compute_all.split()[0]) > float(compute.split()[0])


def test_virtual_device_flag_and_its_old_spelling_plan_the_same(tiny_models, capsys):
    tm = _model(tiny_models)
    outs = []
    for flag in ("--virtual-device", "--assume-device"):
        assert main(["plan", "-m", str(tm.path), "-c", "512", "-ngl", "99", flag,
                     "laptop=1GiB"]) == 0
        # the CPU's free memory is read live: other processes move it between the two runs
        outs.append(re.sub(r"(?m)^\s+CPU\s.*GiB.*$", "", capsys.readouterr().out))
    assert outs[0] == outs[1] and "laptop (planning only)" in outs[0]
    with Planner(tm.path, virtual=[VirtualSpec("laptop", "1GiB")]) as p:
        d = p.plan(n_gpu_layers=99, n_ctx=512).device("laptop")
        assert d.virtual and d.memory == (1 << 30, 1 << 30) and d.weights > 0


@needs_vulkan
def test_a_virtual_spec_with_a_real_name_assumes_its_memory(tiny_models):
    tm = _model(tiny_models)
    name = vulkan.devices()[0].name
    with Planner(tm.path, virtual=[VirtualSpec(name, "3GiB")]) as p:
        d = p.plan(n_gpu_layers=99, n_ctx=512).device(name)
    assert d.memory == (3 << 30, 3 << 30) and d.assumed_memory and not d.virtual


def test_software_devices_say_so():
    for d in vulkan.devices():
        assert d.is_software() == (d.vk_type == "CPU")
    from pyggml.backend.cpu import cpu_device
    assert not cpu_device().is_software() and cpu_device().type == DeviceType.CPU


# ---- layering ------------------------------------------------------------------------------

def _imports() -> dict[str, set[str]]:
    """pyggml module -> pyggml modules it imports (top level and inside functions)."""
    pkg = REPO / "pyggml"
    mods = {}
    for f in pkg.rglob("*.py"):
        rel = f.relative_to(REPO).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        mods[name] = f
    out = {}
    for name, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module
                deps.add(base)
                deps.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        out[name] = {d for d in deps if d in mods and d != name}
    return out


def _import_graph() -> dict[str, set[str]]:
    """_imports() as Python runs them: importing a.b.c first runs the packages a and a.b
    (their __init__), except those of the importer itself, which are running already."""
    def packages(m: str) -> set[str]:
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}
    deps = _imports()
    return {a: {p for d in ds for p in {d} | packages(d)
                if p in deps and p != a and p not in packages(a)}
            for a, ds in deps.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of any length: the strongly connected components (Tarjan) of more than
    one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_cycles_of_any_length_are_found():
    assert import_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_in_the_package():
    assert import_cycles(_import_graph()) == []


def test_the_server_never_imports_the_cli():
    # both front ends read llama.cpp's flags through pyggml.cmdline and pyggml.offload.flags
    for mod, ds in _imports().items():
        if mod.startswith("pyggml.server"):
            assert not [d for d in ds if d.startswith("pyggml.cli")], mod


def test_the_engine_never_imports_planning_or_the_cli():
    # the front ends (the command line, the HTTP server with its plan endpoint) may use both
    for mod, ds in _imports().items():
        if mod.startswith(("pyggml.planning", "pyggml.cli", "pyggml.server")):
            continue
        bad = [d for d in ds if d.startswith(("pyggml.planning", "pyggml.cli"))]
        assert not bad, (mod, bad)


def test_no_code_cites_documents_outside_the_repository():
    hits = []
    for folder in ("pyggml", "native", "shaders", "tools", "tests"):
        for f in (REPO / folder).rglob("*"):
            if f.is_file() and f.suffix in (".py", ".c", ".h", ".comp", ".glsl", ".sh", ".mk"):
                for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    if "shared/" in line and "test data came from" not in line \
                            and f.name != "test_setup.py":
                        hits.append(f"{f.relative_to(REPO)}:{i}")
    assert hits == []
