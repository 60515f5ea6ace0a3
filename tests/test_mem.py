"""Memory reports (pyggml.planning.memory, pyggml.planning.measure): the planning-only figures equal what the runtime
reserves (CPU and, where a Vulkan device exists, offloaded), virtual devices plan without
hardware, UMA devices count against system RAM, the measured peak RSS after a warm-up is close to
the prediction, and `pyggml mem` prints and writes the report."""
import json
from pathlib import Path

import pytest

from pyggml.backend import vulkan
from pyggml.cli import main
from pyggml.llm.runtime import LLM
from pyggml.planning.measure import MiB, estimate, format_report, llamacpp_reference, measure
from pyggml.llm.setup import ModelFile
from pyggml.offload import VirtualSpec
from pyggml.planning.memory import CPU, plan_memory
from pyggml.units import parse_size

REPO = Path(__file__).resolve().parent.parent
NO_VULKAN = vulkan.unavailable_reason()
needs_vulkan = pytest.mark.skipif(NO_VULKAN is not None, reason=f"no Vulkan device: {NO_VULKAN}")


def _model(tiny_models, arch="gemma3"):
    return tiny_models.get(arch=arch, weight_type="q8_0", n_layer=3, n_embd=128, n_ff=256,
                           n_head=4, n_head_kv=2, head_dim=32, n_vocab=1024, sliding_window=16)


@pytest.mark.parametrize("arch,logits_all,flash_attn", [("gemma3", False, True),
                                                         ("gemma3", True, False),
                                                         ("llama", False, False),
                                                         ("llama", True, True)])
def test_plan_equals_what_the_runtime_reserves_on_cpu(tiny_models, arch, logits_all, flash_attn):
    tm = _model(tiny_models, arch)
    kw = dict(n_ctx=512, n_ubatch=128, n_batch=256, logits_all=logits_all, flash_attn=flash_attn)
    plan = plan_memory(tm.path, **kw)
    with LLM(tm.path, n_threads=1, **kw) as llm:
        cpu = plan.device(CPU)
        assert [d.device for d in plan.devices] == [CPU]
        assert cpu.compute == llm.compute_buffer_size(CPU) > 0
        assert cpu.kv == plan.kv_bytes == llm.kv.n_bytes
        assert cpu.weights == sum(t.nbytes() for t in llm.weights.values())
        assert sum(cpu.weights_by_type.values()) == cpu.weights
        assert set(cpu.weights_by_type) == {"q8_0", "f32"}
        assert cpu.weights_mapped and cpu.staging == 0
    # the allocator's saving is visible: lifetimes <= planned <= without in-place <= naive
    assert cpu.compute_lower_bound <= cpu.compute <= cpu.compute_no_inplace < cpu.compute_naive
    rep = plan.reports["prefill"]
    assert rep.peak == cpu.compute and rep.naive == cpu.compute_naive
    logits = 128 * 1024 * 4 if logits_all else 1024 * 4
    assert rep.tensor("result_output").size == logits


@needs_vulkan
@pytest.mark.parametrize("ngl", [2, 99])
def test_plan_equals_the_runtime_with_layers_on_vulkan(tiny_models, ngl):
    tm = _model(tiny_models)
    kw = dict(n_ctx=256, n_ubatch=64, n_batch=64)
    plan = plan_memory(tm.path, n_gpu_layers=ngl, gpu_device="Vulkan0", **kw)
    with LLM(tm.path, n_threads=1, n_gpu_layers=ngl, device="Vulkan0", **kw) as llm:
        gpu = llm.backends[0].device.name
        assert [d.device for d in plan.devices] == [gpu, CPU]
        for b in llm.backends:
            assert plan.device(b.device.name).compute == llm.compute_buffer_size(b.device.name)
        assert plan.device(gpu).weights == llm.weight_buffers[gpu].n_bytes > 0
        for dev in (gpu, CPU):
            assert plan.device(dev).kv == llm.kv.bytes_by_buffer_type.get(dev, 0)
        # lavapipe's memory is host memory: it counts against system RAM
        assert plan.device(gpu).uma is not None
        assert plan.system_ram == sum(d.total for d in plan.devices) + plan.staging


@needs_vulkan
def test_lavapipe_is_uma_with_a_reason():
    dev = vulkan.devices()[0]
    why = dev.uma_reason()
    if dev.vk_type == "CPU":
        assert "CPU device" in why
    elif dev.vk_type == "integrated GPU":
        assert "integrated" in why


def test_virtual_device_plans_without_hardware(tiny_models):
    tm = _model(tiny_models)
    pm = ModelFile(tm.path)
    try:
        gpu = VirtualSpec("laptop", "1GiB")
        plan = plan_memory(pm, n_ctx=1024, n_ubatch=128, n_gpu_layers=99, virtual=[gpu])
        lap, cpu = plan.device("laptop"), plan.device(CPU)
        assert lap.kind == "virtual GPU" and lap.memory == (1 << 30, 1 << 30) and lap.uma is None
        # every layer and the (tied, duplicated) output on the device; embeddings on the CPU
        on_dev = {n for n, p in plan.offload.weights.items() if p.device == "laptop"}
        assert {f"blk.{i}.attn_q.weight" for i in range(3)} <= on_dev
        assert "output.weight" in on_dev and "token_embd.weight" not in on_dev
        expect = sum(-(-pm.model.tensor_info(n if n in pm.model.tensors else
                                             "token_embd.weight").nbytes // 256) * 256
                     for n in on_dev)
        assert lap.weights == expect
        assert cpu.weights == pm.model.tensor_info("token_embd.weight").nbytes
        assert lap.kv == plan.kv_bytes and cpu.kv == 0
        assert lap.compute > 0 and lap.staging >= 4 * MiB      # not host-mapped: staging
        assert plan.system_ram == cpu.total + lap.staging         # its own memory: not RAM
        # the same as an integrated GPU: its bytes are system RAM
        apu = VirtualSpec("apu", "1GiB", "igpu")
        plan2 = plan_memory(pm, n_ctx=1024, n_ubatch=128, n_gpu_layers=99, virtual=[apu])
        d = plan2.device("apu")
        assert "integrated" in d.uma and d.staging == 0
        assert plan2.system_ram == plan2.device(CPU).total + d.total
        rep = estimate(pm, virtual=[apu], n_ctx=1024, n_ubatch=128, n_gpu_layers=99)
        assert any("apu shares system RAM" in n and "frees no RAM" in n for n in rep.notes)
        text = format_report(rep)
        assert "apu (UMA)" in text and "planning only" in text
    finally:
        pm.close()


def test_planning_reads_no_weight_byte_and_allocates_nothing(tiny_models):
    from pyggml.planning.measure import resident_bytes
    tm = tiny_models.get(arch="gemma3", weight_type="f16", n_layer=4, n_embd=512, n_ff=2048,
                         n_head=8, n_head_kv=4, head_dim=64, n_vocab=8192, n_ctx_train=8192,
                         sliding_window=8192)
    pm = ModelFile(tm.path)
    try:
        buf = pm.model.parts[0].buffer
        start = buf.base + min(i.offset for i in pm.model.tensors.values()) + (1 << 20)
        devs = [VirtualSpec("laptop", "1GiB")]
        free0 = [d.memory()[0] for d in vulkan.devices()] if NO_VULKAN is None else []
        plan = plan_memory(pm, n_ctx=4096, n_ubatch=512, n_gpu_layers=3, virtual=devs)
        if NO_VULKAN is None:
            plan_memory(pm, n_ctx=4096, n_ubatch=512, n_gpu_layers=99,     # the real device
                        gpu_device="Vulkan0")
            # asking the real backend about ops opens the device: its fixed tables, no buffer
            free1 = [d.memory()[0] for d in vulkan.devices()]
            assert all(0 <= a - b <= 64 << 10 for a, b in zip(free0, free1))
        assert plan.device("laptop").weights > 0
        # past the first MiB of tensor data (the kernel maps pages around a fault), nothing of
        # the mapped file is in this process's page tables: no weight byte was read
        assert resident_bytes([(start, buf.base + buf.size - start)]) == 0
    finally:
        pm.close()


def test_sliding_window_layers_keep_a_window_sized_cache(tiny_models):
    # gemma3: layers 0-4 sliding (window 16, pattern 6), layer 5 global
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=6, sliding_window=16)
    plan = plan_memory(tm.path, n_ctx=1024, n_ubatch=128)
    ng, bg, ns, bs = plan.kv_split()
    assert (ng, ns) == (1, 5)
    assert plan.n_swa_cells == 256                     # 16 + 128 padded to 256, as llama.cpp
    assert {x.cells for x in plan.kv_layers} == {256, 1024}
    assert bs == 5 * bg * 256 // 1024 and plan.kv_swa_window_bytes() == plan.kv_bytes
    full = plan_memory(tm.path, n_ctx=1024, n_ubatch=128, swa_full=True)
    assert full.kv_split() == (1, bg, 5, 5 * bg) and full.kv_swa_window_bytes() == plan.kv_bytes
    with LLM(tm.path, n_ctx=1024, n_ubatch=128, n_threads=1) as llm:
        assert llm.kv.n_bytes == plan.kv_bytes
        assert llm.compute_buffer_size(CPU) == plan.device(CPU).compute
    notes = estimate(tm.path, n_ctx=1024, n_ubatch=128).notes
    assert any("5 sliding-window layers keep 256 KV cells" in n for n in notes)
    notes = estimate(tm.path, n_ctx=1024, n_ubatch=128, swa_full=True).notes
    assert any("swa_full: the KV cache keeps all 1024 cells" in n for n in notes)
    assert llamacpp_reference(plan) is None            # not the model llama.cpp was measured on


def test_parse_size():
    assert parse_size("8GiB") == 8 << 30 and parse_size("512 MiB") == 512 << 20
    assert parse_size("1.5G") == 3 << 29 and parse_size(4096) == 4096
    with pytest.raises(Exception, match="memory size"):
        parse_size("lots")


def _measure_in_fresh_process(path, queue):
    rep = measure(path, n_ctx=8192, n_ubatch=512, n_threads=2, warmup="ubatch")
    m, cpu = rep.measured, rep.plan.device(CPU)
    queue.put(dict(peak_reset=m.peak_reset, tokens=m.tokens_evaluated, peak_rss=m.peak_rss,
                   rss_at_load=m.rss_at_load, predicted=rep.predicted_rss, plan_total=cpu.total,
                   allocated_compute=m.allocated["compute"][CPU], weights=cpu.weights,
                   kv=cpu.kv, compute=cpu.compute, resident=dict(m.resident),
                   at_load=dict(m.resident_at_load), text=format_report(rep)))


def test_measured_peak_rss_is_close_to_the_prediction(tiny_models):
    # weights, KV and compute big enough to be seen in RSS (~90 MiB), CPU only
    # (a window as long as the context: one cell space for every layer). Measured in a fresh
    # process: what earlier tests of this worker left mapped must not count.
    import multiprocessing as mp
    tm = tiny_models.get(arch="gemma3", weight_type="f16", n_layer=4, n_embd=512, n_ff=2048,
                         n_head=8, n_head_kv=4, head_dim=64, n_vocab=8192, n_ctx_train=8192,
                         sliding_window=8192)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_measure_in_fresh_process, args=(str(tm.path), q))
    proc.start()
    r = q.get(timeout=120)
    proc.join(30)
    assert r["peak_reset"] and r["tokens"] == 512
    # the buffers a compute touches; weights read into host memory at load (huge pages,
    # pyggml.llm.setup.host_weights_copied) are resident before it
    buffers = r["predicted"] - r["rss_at_load"]
    assert buffers + r["at_load"]["weights"] >= r["plan_total"] > 80 * MiB
    # the acceptance bound, and the buffers' share on its own
    assert abs(r["peak_rss"] - r["predicted"]) <= 0.10 * r["predicted"] + 50e6
    assert abs((r["peak_rss"] - r["rss_at_load"]) - buffers) <= 0.15 * buffers + 8 * MiB
    assert r["allocated_compute"] == r["compute"]
    # each buffer's own pages: the whole file (tied output: every weight byte read), the KV
    # cache written whole, the compute buffer used by the full ubatch
    res = r["resident"]
    assert res["mapped"] + 4096 >= res["weights"] >= r["weights"]
    assert r["kv"] <= res["kv"] <= r["kv"] + 8192          # whole pages
    assert 0.75 * r["compute"] <= res["compute"] <= r["compute"] + 4096
    assert "peak RSS" in r["text"] and "runtime's compute buffers: as planned" in r["text"]


def test_cli_mem_plan_only_and_json(tiny_models, tmp_path, capsys):
    tm = _model(tiny_models)
    out_json = tmp_path / "mem.json"
    assert main(["mem", "-m", str(tm.path), "-c", "512", "-ub", "64", "--virtual-device",
                 "laptop=256MiB", "-ngl", "99", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    for what in ("compute buffer (planned peak)", "naive sum of intermediates",
                 "peak without in-place reuse", "host staging", "laptop"):
        assert what in text
    d = json.loads(out_json.read_text())
    devs = {x["device"]: x for x in d["plan"]["devices"]}
    assert set(devs) == {"laptop", CPU} and devs["laptop"]["memory"] == [256 << 20, 256 << 20]
    assert d["measured"] is None and d["plan"]["n_ctx"] == 512


def test_cli_mem_measures(tiny_models, capsys):
    tm = _model(tiny_models)
    assert main(["mem", "-m", str(tm.path), "-c", "256", "-ub", "64", "-t", "1",
                 "--warmup", "fill", "--gen", "4"]) == 0
    text = capsys.readouterr().out
    assert "measured after warm-up (256 tokens (full context), then 4 generated tokens)" in text
    assert "predicted RSS" in text


def test_config_with_a_virtual_device_in_mem_and_plan(tiny_models, tmp_path, capsys):
    tm = _model(tiny_models)
    cfg = tmp_path / "laptop.yaml"
    cfg.write_text("virtual_devices:\n"
                   "  - {name: laptop, memory: 512MiB}\n"
                   "devices: [laptop]\n"
                   "gpu_layers: all\n"
                   "kv: {type_k: f32, type_v: f32}\n"
                   "context: {n_ctx: 1024, n_ubatch: 64}\n")
    out_json = tmp_path / "mem.json"
    assert main(["mem", "-m", str(tm.path), "-c", str(cfg), "--json", str(out_json)]) == 0
    d = json.loads(out_json.read_text())
    assert d["measured"] is None                                  # planning only
    p = d["plan"]
    assert (p["n_ctx"], p["n_ubatch"], p["type_k"]) == (1024, 64, "f32")
    devs = {x["device"]: x for x in p["devices"]}
    assert devs["laptop"]["memory"] == [512 << 20, 512 << 20]
    assert devs["laptop"]["kv"] == sum(x["bytes"] for x in p["kv_layers"]) > 0
    assert "laptop" in capsys.readouterr().out
    # pyggml plan reads the same config against the same planning-only device
    assert main(["plan", "-m", str(tm.path), "-c", str(cfg)]) == 0
    assert "laptop" in capsys.readouterr().out


def test_example_config_plans_as_the_runtime_runs(tiny_models):
    tm = _model(tiny_models)
    cfg = REPO / "configs" / "cpu-only.yaml"
    plan = plan_memory(tm.path, config=str(cfg), n_ctx=512, n_ubatch=64)
    with LLM(tm.path, config=str(cfg), n_ctx=512, n_ubatch=64) as llm:
        assert plan.n_ctx == llm.n_ctx and plan.n_ubatch == llm.n_ubatch
        assert plan.device(CPU).compute == llm.compute_buffer_size(CPU)
        assert plan.kv_bytes == llm.kv.n_bytes
        assert [d.device for d in plan.devices] == [b.device.name for b in llm.backends]


def test_gemma_against_llamacpp_figures():
    # the default model, planning only (< 1 s): llama.cpp at n_ctx 2048 reserves 514.50 MiB
    # (n_ubatch 512) and 128.63 MiB (128) of compute buffer with logits for every position; its
    # KV cache is 6.00 + 15.00 MiB and its model buffer 235.16 MiB
    pm = ModelFile(None)
    try:
        for ub, theirs in ((512, 514.50), (128, 128.63)):
            all_rows = plan_memory(pm, n_ctx=2048, n_ubatch=ub, logits_all=True)
            last = plan_memory(pm, n_ctx=2048, n_ubatch=ub)
            ref = llamacpp_reference(all_rows)
            assert ref["compute"] == int(theirs * MiB)
            assert all_rows.compute_bytes <= ref["compute"]             # no larger than theirs
            assert last.compute_bytes < all_rows.compute_bytes / 9      # far smaller
            assert round(last.device(CPU).weights / MiB, 2) == round(ref["weights"] / MiB, 2)
            assert last.kv_bytes == ref["kv"]                           # same cache layout
        assert plan_memory(pm, n_ctx=2048, n_ubatch=512).kv_split() == (3, 6 * MiB, 15,
                                                                        15 * MiB)
    finally:
        pm.close()


_MODULES_AFTER = """
import contextlib, io, json, sys
from pyggml.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as text:
        rc = main(argv)
    out.append({"rc": rc, "text": text.getvalue()})
print(json.dumps({"runs": out, "modules": sorted(m for m in sys.modules if "vulkan" in m)}))
"""


def _vulkan_modules_after(argvs) -> dict:
    """Run pyggml commands in one fresh interpreter; what ran and which modules with 'vulkan' in
    their name it imported ('vulkan': the loader's binding; pyggml.backend.vulkan: ours)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _MODULES_AFTER, json.dumps(argvs)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert [x["rc"] for x in got["runs"]] == [0] * len(argvs), got["runs"]
    return got


def test_cpu_only_mem_and_plan_load_no_vulkan(tiny_models):
    """A CPU-only `pyggml mem` (planned and measured) and `pyggml plan` (a CPU-only config, a
    draft model) never import the Vulkan backend: listing devices would load the loader and
    its drivers (lavapipe: ~50 MB resident) for nothing."""
    tm, dm = _model(tiny_models), _model(tiny_models, "llama")
    m = str(tm.path)
    got = _vulkan_modules_after([
        ["mem", "-m", m, "--plan-only", "-c", "256"],
        ["mem", "-m", m, "-c", "256", "-ub", "64", "--warmup", "token"],
        ["mem", "-m", m, "--plan-only", "-c", str(REPO / "configs" / "cpu-only.yaml")],
        ["plan", "-m", m, "-c", "256", "-nkvo", "-ot", "ffn_.*=CPU"],
        ["plan", "-m", str(dm.path), "-c", "256", "-md", str(dm.path)]])
    assert got["modules"] == []
    assert all("CPU" in r["text"] for r in got["runs"])
    # a virtual GPU follows the Vulkan backend's rules, but no real device is listed
    got = _vulkan_modules_after([["mem", "-m", m, "--plan-only", "-c", "256", "-ngl", "99",
                                  "--virtual-device", "laptop=256MiB"]])
    assert "vulkan" not in got["modules"] and "laptop" in got["runs"][0]["text"]


@needs_vulkan
def test_a_plan_naming_a_gpu_still_lists_this_machines_devices(tiny_models):
    dev = vulkan.devices()[0].name
    got = _vulkan_modules_after([["mem", "-m", str(_model(tiny_models).path), "--plan-only",
                                  "-c", "256", "-ngl", "99", "-dev", dev]])
    assert "vulkan" in got["modules"] and dev in got["runs"][0]["text"]
