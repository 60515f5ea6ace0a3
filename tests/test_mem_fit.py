"""The fit advisor on tiny models with artificial budgets: the answer is the largest that fits
(one step more does not), the YAML it writes runs and stays within the budgets, UMA devices
count against system RAM, virtual devices are declared in the YAML."""
import pytest
import yaml

from pyggml.backend import vulkan
from pyggml.cli import main
from pyggml.llm.runtime import LLM
from pyggml.planning.fit import CTX_STEP, fit
from pyggml.offload import VirtualSpec
from pyggml.planning.memory import CPU, plan_memory
from pyggml.units import MiB

NO_VULKAN = vulkan.unavailable_reason()
RUNTIME = 100 * MiB          # system RAM given to the runtime itself in these tests


def _model(tiny_models):
    # llama: every layer global, so the KV cache grows with n_ctx in every layer
    return tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=256, n_ff=512,
                           n_head=4, n_head_kv=2, head_dim=64, n_vocab=1024, n_ctx_train=16384)


def _run_yaml(path, model_path):
    """Run a config the advisor wrote, as `pyggml run -c` does: evaluate a full ubatch."""
    llm = LLM(model_path, config=str(path), n_threads=1)
    llm.eval([(7 * i + 3) % 1000 for i in range(min(llm.n_ubatch, llm.n_ctx))])
    return llm


def _system_ram(llm) -> int:
    """Bytes the runtime placed in system RAM (CPU buffers; every device here is UMA)."""
    r = llm.memory_report()
    return RUNTIME + r["weights_bytes"] + r["kv_cache_bytes"] + r["compute_buffer_bytes"]


def test_cpu_budget_gives_the_largest_context_and_the_yaml_fits(tiny_models, tmp_path):
    tm = _model(tiny_models)
    base = plan_memory(tm.path, n_ctx=1024, n_ubatch=128)
    budget = RUNTIME + base.system_ram + 3 * MiB           # room for a few thousand cells more
    res = fit(tm.path, {CPU: budget}, max_gpu_layers=0, min_ctx=1024, n_ubatch=128,
              runtime=RUNTIME)
    assert res.fits and res.n_gpu_layers == 0 and 1024 < res.n_ctx < 16384
    assert res.n_ctx % CTX_STEP == 0
    need = res.runtime + res.plan.system_ram
    assert need <= budget
    over = plan_memory(tm.path, n_ctx=res.n_ctx + CTX_STEP, n_ubatch=128)
    assert RUNTIME + over.system_ram > budget                 # one step more does not fit
    path = tmp_path / "fit.yaml"
    path.write_text(res.to_yaml())
    with _run_yaml(path, tm.path) as llm:
        assert llm.n_ctx == res.n_ctx
        assert _system_ram(llm) <= budget
    # nothing fits: says so, with the overshoot
    res2 = fit(tm.path, {CPU: RUNTIME + 1 * MiB}, max_gpu_layers=0, min_ctx=1024, n_ubatch=128,
               runtime=RUNTIME)
    assert not res2.fits and "over budget" in res2.notes[-1]


@pytest.mark.skipif(NO_VULKAN is not None, reason=f"no Vulkan device: {NO_VULKAN}")
def test_vulkan_budget_gives_gpu_layers_and_the_yaml_fits_on_the_device(tiny_models, tmp_path):
    tm = _model(tiny_models)
    gpu = vulkan.devices()[0].name
    full = plan_memory(tm.path, n_ctx=1024, n_ubatch=128, n_gpu_layers=99, gpu_device=gpu)
    budget = full.device(gpu).total * 6 // 10               # not everything fits on the device
    res = fit(tm.path, {gpu: budget, CPU: "8GiB"}, gpu_device=gpu, min_ctx=1024,
              max_ctx=1024, n_ubatch=128, runtime=RUNTIME)
    assert res.fits and 0 < res.n_gpu_layers <= 4 and res.n_ctx == 1024
    assert res.plan.device(gpu).total <= budget
    assert any(f"gpu_layers {res.n_gpu_layers + 1} does not fit" in n for n in res.notes)
    assert any("shares system RAM" in n for n in res.notes)   # lavapipe: UMA
    path = tmp_path / "fit.yaml"
    path.write_text(res.to_yaml())
    cfg = yaml.safe_load(path.read_text())
    assert cfg["devices"] == [gpu] and cfg["gpu_layers"] == res.n_gpu_layers
    dev = vulkan.devices()[0]
    free0, total = dev.memory()
    with _run_yaml(path, tm.path) as llm:
        used = (total - dev.memory()[0]) - (total - free0)    # what this run holds there
        planned = res.plan.device(gpu).total
        assert planned <= used <= planned + 1 * MiB           # plus the backend's own tables
        assert used <= budget + 1 * MiB


def test_uma_device_counts_against_system_ram(tiny_models):
    tm = _model(tiny_models)
    cpu_only = plan_memory(tm.path, n_ctx=1024, n_ubatch=128)
    ram = RUNTIME + cpu_only.system_ram + 2 * MiB
    kw = dict(min_ctx=1024, n_ubatch=128, runtime=RUNTIME)
    own = fit(tm.path, {"dgpu": "1GiB", CPU: ram}, virtual=[VirtualSpec("dgpu", "1GiB")], **kw)
    uma = fit(tm.path, {"apu": "1GiB", CPU: ram}, virtual=[VirtualSpec("apu", "1GiB", "igpu")],
              **kw)
    # a discrete GPU takes weights and KV out of RAM: everything offloaded, a long context (the
    # CPU keeps the embeddings, the masks and the staging buffer)
    assert own.n_gpu_layers == 5 and own.n_ctx >= 8192
    assert own.plan.device("dgpu").kv == own.plan.kv_bytes
    # an integrated one does not: RAM still bounds the context, as on the CPU alone
    assert uma.fits and 4 * uma.n_ctx < own.n_ctx
    assert any("apu shares system RAM" in n for n in uma.notes)
    need = uma.runtime + uma.plan.system_ram
    assert need <= ram and uma.plan.system_ram >= uma.plan.device("apu").total


def test_virtual_device_yaml_and_cli(tiny_models, tmp_path, capsys):
    tm = _model(tiny_models)
    out = tmp_path / "fit.yaml"
    assert main(["mem", "-m", str(tm.path), "--fit", "--virtual-device", "laptop=64MiB",
                 "--budget", "CPU=4GiB", "--min-ctx", "512", "-ub", "128",
                 "--emit-yaml", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fits: gpu_layers 5 on laptop")
    cfg = yaml.safe_load(out.read_text())
    assert cfg["virtual_devices"] == [{"name": "laptop", "memory": "64MiB", "kind": "gpu"}]
    assert cfg["devices"] == ["laptop"] and cfg["gpu_layers"] == 5
    assert cfg["context"]["n_ctx"] >= 512
    assert "planning-only" in out.read_text()


def test_fit_keeps_the_base_config_and_its_yaml_loads(tiny_models, tmp_path):
    tm = _model(tiny_models)
    base = {"kv": {"device": "cpu"}, "context": {"n_ubatch": 64}}     # --no-kv-offload
    res = fit(tm.path, {"dgpu": "16MiB", CPU: "4GiB"}, config=base, runtime=RUNTIME,
              virtual=[VirtualSpec("dgpu", "16MiB")], min_ctx=512, max_ctx=4096)
    assert res.fits and res.n_gpu_layers == 5 and res.n_ctx == 4096
    cfg = res.to_config()
    assert cfg["kv"] == {"device": "cpu"} and cfg["context"]["n_ubatch"] == 64
    assert res.plan.device(CPU).kv == res.plan.kv_bytes              # the rule still holds
    assert res.plan.device("dgpu").kv == 0
    path = tmp_path / "fit.yaml"
    path.write_text(res.to_yaml())
    again = plan_memory(tm.path, config=str(path))                   # the file plans the same
    assert again.n_ctx == 4096 and again.device("dgpu").total == res.plan.device("dgpu").total
