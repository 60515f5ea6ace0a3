"""`pyggml plan` and configs at run time: every example config planned against Gemma 3 (a dry run
that never touches weight bytes), the plan's memory equal to what the runtime allocates,
--check-fit, the command line, and configs run on Vulkan (lavapipe) giving the CPU's results.
Tests that run on Vulkan skip only where no Vulkan device exists; planning works without one
(a planning-only Vulkan0 is assumed)."""
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend import vulkan
from pyggml.cli import main
from pyggml.errors import ConfigError
from pyggml.llm.runtime import LLM
from pyggml.models_default import ensure_default_model
from pyggml.offload import CPU
from pyggml.offload.config import load_config
from pyggml.offload import VirtualSpec
from pyggml.planning.dryrun import dry_run, format_report
from pyggml.planning.fit import suggest_changes
from pyggml.planning.memory import Planner
from pyggml.units import parse_size
from pyggml.types import GGMLType

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
NO_VULKAN = vulkan.unavailable_reason()
needs_vulkan = pytest.mark.skipif(NO_VULKAN is not None, reason=f"no Vulkan device: {NO_VULKAN}")
GIB = 1 << 30
PROMPT = [2, 17, 99, 5, 300, 41, 7, 8, 250, 3, 77, 12, 19]


def assumed(**more):
    """Vulkan0 with 2 GiB: a planning-only device where this machine has none, else the real
    one named (lavapipe is a software device, used only where named), as VirtualSpecs."""
    out = {"Vulkan0": 2 * GIB}
    out.update(more)
    return [VirtualSpec(n, b) for n, b in out.items()]


def line_of(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l)


@pytest.fixture(scope="module")
def gemma():
    planner = Planner(ensure_default_model(), virtual=assumed(Vulkan1=8 * GIB))
    yield planner
    planner.close()


def devs(report, pred):
    return {p.device for n, p in report.offload.weights.items() if pred(n)}


def test_every_example_config_is_planned_against_gemma(gemma):
    files = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert files == ["all-on-gpu.yaml", "attention-on-gpu-ffn-on-cpu.yaml", "cpu-only.yaml",
                     "kv-on-cpu.yaml", "moe-experts-on-cpu.yaml", "pipeline.yaml",
                     "prefill-on-gpu-decode-on-cpu.yaml", "two-gpus-split.yaml"]
    r = {f: gemma.plan(load_config(CONFIGS / f)) for f in files}
    for f, rep in r.items():
        warnings = [w for w in rep.warnings if "software device" not in w]
        if f == "moe-experts-on-cpu.yaml":          # Gemma has no experts: the rule says so
            assert len(warnings) == 1 and "no tensor of kind experts" in warnings[0]
            continue
        assert warnings == [], f
        for d in rep.offload.devices:
            assert rep.device(d).compute > 0, (f, d)          # measured by the scheduler
        assert "llama.cpp: " in format_report(rep)

    cpu = r["cpu-only.yaml"]
    assert cpu.offload.devices == [CPU] and [d.device for d in cpu.devices] == [CPU]
    assert cpu.device(CPU).weights == sum(i.nbytes for i in gemma.mf.model.tensors.values())
    assert cpu.llama == ["-dev", "none", "-c", "4096", "-b", "2048", "-ub", "512"]

    gpu = r["all-on-gpu.yaml"]
    assert devs(gpu, lambda n: n.startswith(("blk.", "output"))) == {"Vulkan0"}
    assert gpu.offload.weights["token_embd.weight"].device == CPU
    assert "output.weight" in gpu.offload.weights                  # tied: a copy on the GPU
    assert {k.device for k in gpu.offload.kv} == {"Vulkan0"} and gpu.llama[:4] == \
        ["-dev", "Vulkan0", "-ngl", "19"]

    att = r["attention-on-gpu-ffn-on-cpu.yaml"]
    f = CONFIGS / "attention-on-gpu-ffn-on-cpu.yaml"
    rule = f"overrides[0] 'ffn on CPU' kind ffn -> CPU ({f}:{line_of(f, 'name: ffn on CPU')})"
    ffn = [n for n in att.offload.weights if re.search(r"\.ffn_(up|down|gate)\.", n)]
    assert len(ffn) == 3 * 18
    assert all(att.offload.weights[n].device == CPU and att.offload.weights[n].rule == rule for n in ffn)
    assert devs(att, lambda n: ".attn_" in n) == {"Vulkan0"}
    assert att.device("Vulkan0").weights < gpu.device("Vulkan0").weights

    kv = r["kv-on-cpu.yaml"]
    assert len(kv.config.files) == 2 and kv.config.files[1].endswith("all-on-gpu.yaml")
    assert {k.device for k in kv.offload.kv} == {CPU} and kv.opts.n_ctx == 32768
    # 3 global layers keep n_ctx cells, the 15 sliding-window layers window + n_ubatch cells
    n_ub = min(kv.opts.n_ubatch or 512, kv.opts.n_batch or 2048)
    swa_cells = min(32768, -(-(512 + n_ub) // 256) * 256)
    assert kv.device("Vulkan0").kv == 0
    assert kv.device(CPU).kv == 2 * 256 * 2 * (3 * 32768 + 15 * swa_cells)
    assert "--no-kv-offload" in kv.llama

    two = r["two-gpus-split.yaml"]
    assert two.offload.layer_devices == ["Vulkan0"] * 15 + ["Vulkan1"] * 4   # 19 slots, 3:1
    assert two.device("Vulkan1").virtual and "-ts" in two.llama

    pipe = r["pipeline.yaml"]
    assert pipe.offload.n_copies == 2 and pipe.opts.n_ubatch == 128
    assert pipe.offload.layer_devices == [CPU] * 9 + ["Vulkan0"] * 10
    assert any("n_copies: 2" in m for m in pipe.llama_missing)

    ph = r["prefill-on-gpu-decode-on-cpu.yaml"]
    assert devs(ph, lambda n: True) == {CPU}
    assert len(ph.offload.phase_ops["prefill"]) == 4 * 18 and "decode" not in ph.offload.phase_ops
    assert sorted(ph.compute_by_phase) == ["decode", "prefill"]      # two schedulers
    assert ph.offload.op_offload == {"prefill": True, "decode": False}


def test_two_gpu_config_on_a_one_gpu_machine(gemma):
    if NO_VULKAN is not None:
        pytest.skip(f"needs a real Vulkan0 next to an absent Vulkan1: {NO_VULKAN}")
    real = Planner(ensure_default_model())
    try:
        with pytest.raises(ConfigError, match=r"two-gpus-split\.yaml:\d+:\d+: devices\[1\]: "
                                              r"device 'Vulkan1' is absent on this machine"):
            real.plan(load_config(CONFIGS / "two-gpus-split.yaml"))
        r = real.plan(load_config(CONFIGS / "two-gpus-split.yaml", ["fallback=cpu"]))
    finally:
        real.close()
    assert r.offload.layer_devices == ["Vulkan0"] * 15 + [CPU] * 4
    assert any("'Vulkan1' is absent" in w for w in r.warnings)


def test_plan_reads_no_weight_byte(tmp_path):
    """The weights' pages are made unreadable (PROT_NONE) right after the file is mapped: the
    plan still works, while reading one weight byte kills the process."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, sys
        from pyggml import gguf
        from pyggml.planning.dryrun import dry_run, format_report
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        orig = gguf.open_gguf

        def protected(path):
            m = orig(path)
            for part in m.parts:
                b = part.buffer
                lo = (b.base + part.data_offset + 4095) & ~4095
                hi = (b.base + b.size + 4095) & ~4095
                assert libc.mprotect(lo, hi - lo, 0) == 0, ctypes.get_errno()
            return m

        gguf.open_gguf = protected
        gguf.GGUFModel.open = classmethod(lambda cls, p: protected(p))
        path, what = sys.argv[1], sys.argv[2]
        if what == "plan":
            from pyggml.offload import VirtualSpec
            r = dry_run(path, {str(CONFIGS / 'attention-on-gpu-ffn-on-cpu.yaml')!r},
                        virtual=[VirtualSpec(n, b) for n, b in {dict((v.name, v.memory) for v in assumed())!r}.items()])
            print(format_report(r))
        else:
            m = gguf.GGUFModel.open(path)
            print(int(m.tensor_bytes("blk.0.ffn_up.weight")[100]))
    """))
    model = str(ensure_default_model())
    run = lambda what: subprocess.run([sys.executable, str(script), model, what],  # noqa: E731
                                      capture_output=True, text=True, timeout=120)
    ok = run("plan")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert re.search(r"blk\.0-17\s+ffn_down ffn_gate ffn_up\s+CPU", ok.stdout)
    touch = run("touch")
    assert touch.returncode == -signal.SIGSEGV


def runtime_memory(m: LLM) -> dict:
    out = {}
    for b in m.backends:
        d = b.device.name
        out[d] = {"compute": m.compute_buffer_size(d),
                  "kv": m.kv.bytes_by_buffer_type.get(d, 0),
                  "weights": m.weight_buffers[d].n_bytes if d in m.weight_buffers else None}
    return out


def plan_memory(r) -> dict:
    return {d: {"compute": t.compute, "kv": t.kv,
                "weights": None if d == CPU or not t.weights else t.weights}
            for d, t in ((x.device, x) for x in r.devices)}


def test_plan_memory_equals_the_runtime_cpu(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0")
    cfg = {"devices": ["cpu"], "context": {"n_ctx": 96, "n_ubatch": 16},
           "kv": {"ranges": [{"layers": 1, "type_k": "f32", "type_v": "f32"}]}}
    r = dry_run(tm.path, cfg)
    with LLM(tm.path, config=cfg, n_threads=1) as m:
        assert runtime_memory(m) == plan_memory(r)
        assert m.kv.k[0].type == GGMLType.F16 and m.kv.v[0].type == GGMLType.F16
        assert m.kv.k[1].type == GGMLType.F32 and m.kv.v[1].type == GGMLType.F32
        assert m.n_ctx == 96 and m.n_ubatch == 16
        got = m.eval(PROMPT)
    with LLM(tm.path, n_ctx=96, n_threads=1) as ref:
        want = ref.eval(PROMPT)
    assert np.max(np.abs(got - want)) <= 5e-2 * np.max(np.abs(want))


@needs_vulkan
@pytest.mark.parametrize("name, sets", [
    ("attention-on-gpu-ffn-on-cpu.yaml", []),
    ("pipeline.yaml", ["gpu_layers=2", "context.n_ubatch=8"]),
    ("prefill-on-gpu-decode-on-cpu.yaml", []),
    ("kv-on-cpu.yaml", []),
])
def test_configs_on_vulkan_match_cpu_and_the_plan(tiny_models, name, sets):
    tm = tiny_models.get(arch="gemma3", weight_type="f16")
    cfg = load_config(CONFIGS / name, ["context.n_ctx=64", "threads=1"] + list(sets))
    r = dry_run(tm.path, cfg)
    with LLM(tm.path, n_ctx=64, n_threads=1, type_k="f32", type_v="f32") as cpu:
        ref = [cpu.eval(PROMPT)] + [cpu.eval([t]) for t in (5, 6)]
    with LLM(tm.path, config=cfg.with_sets(["kv.type_k=f32", "kv.type_v=f32"])) as g:
        assert [b.name for b in g.backends] == ["Vulkan0", CPU]
        got = [g.eval(PROMPT)] + [g.eval([t]) for t in (5, 6)]
        mem = runtime_memory(g)
    # same placement as planned (the plan ran with f16 KV: compare weights only here)
    assert {d: v["weights"] for d, v in mem.items()} == \
        {d: v["weights"] for d, v in plan_memory(r).items()}
    for a, b in zip(got, ref):
        assert np.max(np.abs(a - b)) <= 2e-2 * np.max(np.abs(b))
        assert int(np.argmax(a)) == int(np.argmax(b))


@needs_vulkan
def test_plan_memory_equals_the_runtime_vulkan(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0")
    for name in ("attention-on-gpu-ffn-on-cpu.yaml", "prefill-on-gpu-decode-on-cpu.yaml"):
        cfg = load_config(CONFIGS / name, ["context.n_ctx=64", "threads=1"])
        r = dry_run(tm.path, cfg)
        with LLM(tm.path, config=cfg) as m:
            assert runtime_memory(m) == plan_memory(r), name


@needs_vulkan
def test_phase_rule_pins_prefill_ops_to_the_gpu(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="f16")
    cfg = {"devices": ["Vulkan0"], "op_offload": False, "context": {"n_ctx": 64},
           "overrides": [{"kind": "attn", "device": "Vulkan0", "phase": "prefill"}]}
    with LLM(tm.path, config=cfg, n_threads=1) as m:
        assert all(p.device == CPU for p in m.offload.weights.values())
        assert m.sched["prefill"] is not m.sched["decode"]
        got = m.eval(PROMPT)
        pinned = [a for a in m.sched["prefill"].assignments() if a[3] == "usr"]
        # the phase rule's: q, k, v, output matmuls; the rest: the layers' norms where their
        # weights are (pin_layer_norms, llama.cpp's rule for batches under 32 tokens)
        mats = [a for a in pinned if a[1] == "MUL_MAT"]
        assert len(mats) == 4 * tm.hparams.n_layer
        assert {a[2] for a in mats} == {"Vulkan0"}
        assert {(a[1], a[2]) for a in pinned if a[1] != "MUL_MAT"} == {("RMS_NORM", CPU)}
        m.eval([5])
        assert all(a[2] == CPU for a in m.sched["decode"].assignments())
    with LLM(tm.path, n_ctx=64, n_threads=1) as cpu:
        want = cpu.eval(PROMPT)
    assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))


@needs_vulkan
def test_layer_norms_run_on_their_layers_device_in_small_batches(tiny_models):
    """-ngl 2 of 4 layers: in a decoded token every layer's norm runs where that layer's norm
    weight is (the CPU layers' on the CPU, the GPU layers' on the GPU), so no norm's result
    crosses the layer boundary; a 40-token prompt (>= 32 tokens, output on the GPU but not every
    layer) leaves the norms to the scheduler, as llama.cpp does."""
    from pyggml.offload.plan import layer_of
    tm = tiny_models.get(arch="gemma3", weight_type="f16", n_layer=4)
    cfg = {"devices": ["Vulkan0"], "gpu_layers": 2, "context": {"n_ctx": 128}}
    with LLM(tm.path, config=cfg, n_threads=1) as m:
        m.eval(list(range(5, 45)))
        assert not [a for a in m.sched["prefill"].assignments()
                    if a[1] == "RMS_NORM" and a[3] == "usr"]
        m.eval([5])
        sched = m.sched["decode"]
        pinned = [a for a in sched.assignments() if a[1] == "RMS_NORM" and a[3] == "usr"]
        devs = {m.offload.weight_device(n) for n in m.weights if layer_of(n) is not None}
        assert devs == {CPU, "Vulkan0"}
        assert {a[2] for a in pinned} == devs
        moved = [x for sp in sched.splits for x, _, _, user in sp.copy_plan if not user]
        assert moved and not [x.name for x in moved if x.op.name in ("RMS_NORM", "NORM")]


@needs_vulkan
def test_two_gpu_split_runs_on_two_vulkan_devices(tiny_models, tmp_path):
    """PYGGML_VULKAN_DEVICES=0,0 opens lavapipe twice: a real Vulkan0 and Vulkan1."""
    tm = tiny_models.get(arch="gemma3", weight_type="f16", n_layer=4)
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        from pyggml.llm.runtime import LLM
        from pyggml.offload.config import load_config
        p = {PROMPT!r}
        with LLM({str(tm.path)!r}, n_ctx=64, n_threads=1, type_k="f32", type_v="f32") as c:
            ref = c.eval(p)
        # 5 layer slots shared 1:1: layers 0-2 on Vulkan0, layer 3 and the output on Vulkan1
        cfg = load_config({str(CONFIGS / 'two-gpus-split.yaml')!r}, ["tensor_split=[1, 1]"])
        with LLM({str(tm.path)!r}, config=cfg, n_ctx=64, n_threads=1, type_k="f32",
                 type_v="f32") as g:
            print([b.name for b in g.backends], sorted(g.weight_buffers))
            print(sorted({{p.device for p in g.offload.kv}}))
            got = g.eval(p)
        print(float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYGGML_VULKAN_DEVICES="0,0"))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "['Vulkan0', 'Vulkan1', 'CPU'] ['Vulkan0', 'Vulkan1']"
    assert lines[1] == "['Vulkan0', 'Vulkan1']"
    assert float(lines[2]) <= 2e-2


def test_check_fit_suggests_changes_that_fit(tiny_models):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=128)
    cfg = load_config(CONFIGS / "all-on-gpu.yaml", ["context.n_ctx=8192", "context.n_ubatch=32"])
    big = dry_run(tm.path, cfg, virtual=assumed())
    kv_cpu = dry_run(tm.path, cfg.with_sets(["kv.device=cpu"]), virtual=assumed())
    size = kv_cpu.device("Vulkan0").total           # just enough with the KV cache on the CPU
    assert size < big.device("Vulkan0").total
    planner = Planner(tm.path, virtual=[VirtualSpec("Vulkan0", size)])
    try:
        r = planner.plan(cfg)
        assert r.not_fitting() == ["Vulkan0"]
        changes = suggest_changes(planner, r)
        r.fit_changes = changes
    finally:
        planner.close()
    kinds = [c.what.split(":")[0] for c in changes]
    assert {"KV cache on the CPU", "gpu_layers", "n_ctx"} <= set(kinds)
    assert [c.moved for c in changes] == sorted(c.moved for c in changes)
    for c in changes:                                 # each one fits when applied
        assert not c.plan.not_fitting()
        assert c.plan.device("Vulkan0").total <= size
    n_ctx = next(c for c in changes if c.what.startswith("n_ctx"))
    assert int(n_ctx.sets[0].split("=")[1]) % 256 == 0
    text = format_report(r)
    assert "Vulkan0" in text and "NO" in text and "changes that fit, smallest first" in text


def test_cli_plan_table_flags_and_emit_yaml(tiny_models, tmp_path, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    out = tmp_path / "emitted.yaml"
    rc = main(["plan", "-m", str(tm.path), "-c", "128", "--set", "devices=[cpu]",
               "-ot", "ffn_(up|gate)=CPU", "--no-op-offload", "--emit-yaml", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert re.search(r"blk\.0-1\s+ffn_gate ffn_up\s+CPU\s+\S+ \S+\s+-ot ffn_\(up\|gate\)=CPU", text)
    assert re.search(r"^  CPU\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+", text, re.M)
    assert "llama.cpp: -dev none -ot 'ffn_(up|gate)=CPU' --no-op-offload -c 128" in text
    cfg = load_config(out)
    assert cfg.get(("overrides", 0)) == {"match": "ffn_(up|gate)", "device": "CPU"}
    assert cfg.get(("context", "n_ctx")) == 128 and cfg.get(("op_offload",)) is False
    assert main(["plan", "-m", str(tm.path), "-c", str(out), "--per-tensor"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"blk\.1\.ffn_up\.weight\s+CPU\s+.*overrides\[0\] match 'ffn_\(up\|gate\)' "
                     r"-> CPU \(" + re.escape(str(out)) + r":\d+\)", text)
    assert main(["plan", "--schema"]) == 0
    assert "overrides[].phase" in capsys.readouterr().out


def test_cli_errors_name_file_line_and_key(tiny_models, tmp_path, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_layers: 1\noverides:\n  - kind: ffn\n    device: cpu\n")
    for cmd in ("plan", "run"):
        assert main([cmd, "-m", str(tm.path), "-c", str(bad)]) == 1
        err = capsys.readouterr().err
        assert f"{bad}:2:1: overides: unknown key (did you mean 'overrides'?)" in err
    assert main(["plan", "-m", str(tm.path), "-ot", "nonsense"]) == 1
    assert "expected REGEX=DEVICE" in capsys.readouterr().err
    assert main(["plan", "-m", str(tm.path), "--set", "devices=[cpu]", "--set",
                 "overrides=[{match: xyz, device: cpu}]"]) == 0
    out = capsys.readouterr().out
    assert "--set overrides=[{match: xyz, device: cpu}]: overrides[0]: matches no tensor" in out


def test_cli_run_and_bench_take_a_config(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    cfg = str(CONFIGS / "cpu-only.yaml")
    assert main(["run", "-m", str(tm.path), "-c", cfg, "-c", "64", "-p", "hello", "-n", "3",
                 "--temp", "0", "-t", "1", "--ignore-eos", "--no-warmup",
                 "--set", "context.n_ubatch=8"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello") and "generation 3 tokens" in err
    assert main(["bench", "-m", str(tm.path), "-c", cfg, "-p", "8", "-n", "2", "-t", "1",
                 "-r", "1"]) == 0
    assert "| CPU | 1 | pp8 |" in capsys.readouterr().out


@needs_vulkan
def test_acceptance_gemma_attention_on_gpu_matches_cpu(capsys):
    """`pyggml run -m MODEL -c configs/attention-on-gpu-ffn-on-cpu.yaml` on lavapipe gives the
    CPU's greedy tokens; `pyggml plan` shows the ffn weights on the CPU with their rule."""
    model = str(ensure_default_model())
    cfg = str(CONFIGS / "attention-on-gpu-ffn-on-cpu.yaml")
    common = ["-m", model, "-p", "The capital of France is", "-n", "4", "--temp", "0", "-t", "2",
              "--ignore-eos", "--no-warmup", "-c", "256"]
    assert main(["run", *common]) == 0
    cpu_out = capsys.readouterr().out
    assert main(["run", *common, "-c", cfg]) == 0
    gpu_out = capsys.readouterr().out
    assert gpu_out == cpu_out and len(gpu_out) > len("The capital of France is") + 4
    assert main(["plan", "-m", model, "-c", cfg]) == 0
    text = capsys.readouterr().out
    rule = re.escape(f"overrides[0] 'ffn on CPU' kind ffn -> CPU ({cfg}:")
    assert re.search(r"blk\.0-17\s+ffn_down ffn_gate ffn_up\s+CPU\s+46\.49 MiB\s+" + rule, text)


def test_parse_size():
    assert parse_size("8GiB") == 8 << 30 and parse_size("512M") == 512 << 20
    assert parse_size("1.5k") == 1536 and parse_size("100") == 100
    with pytest.raises(ConfigError, match="expected a byte count"):
        parse_size("lots")


@pytest.mark.parametrize("tied", [True, False, "forced"])
def test_plan_says_where_the_token_lookup_runs(tiny_models, tied, monkeypatch):
    """All of layer 0 on a (planning-only) device with the tied output's copy: `pyggml plan`
    says the token lookup runs there; layer 0 on the CPU, or a file with its own output.weight:
    on the CPU (no line). "forced": hparams that say tied (as Gemma 2's always do) over a file
    that has an output.weight of token_embd's type and shape: that matrix is not token_embd."""
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=64,
                         tied_embeddings=tied is True)
    if tied == "forced":
        import pyggml.llm.setup as setup_mod
        real = setup_mod.read_hparams

        def forced(*a, **k):
            hp = real(*a, **k)
            hp.tied_output = True
            return hp
        monkeypatch.setattr(setup_mod, "read_hparams", forced)
    full = dry_run(tm.path, virtual=assumed(), n_gpu_layers=99, gpu_device="Vulkan0", n_ctx=256)
    part = dry_run(tm.path, virtual=assumed(), n_gpu_layers=3, gpu_device="Vulkan0", n_ctx=256)
    assert full.lookup_device == ("Vulkan0" if tied is True else CPU)
    assert part.lookup_device == CPU
    assert ("token lookup: on Vulkan0" in format_report(full)) == (tied is True)
    assert "token lookup" not in format_report(part)


def test_cli_plan_llamacpp_line_names_kv_types_given_as_flags(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    assert main(["plan", "-m", str(tm.path), "-c", "128", "-ctk", "bf16", "-ctv", "f32"]) == 0
    assert "llama.cpp: -dev none -ctk bf16 -ctv f32 -c 128" in capsys.readouterr().out
