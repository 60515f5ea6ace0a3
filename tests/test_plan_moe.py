"""Planning a mixture-of-experts model with its experts in host RAM (llama.cpp's
`-ngl 99 -ot exps=CPU`, the `experts` rule kind, configs/moe-experts-on-cpu.yaml): which tensors
go where, expert bytes per device, the weight bytes a decoded token reads, on a virtual GPU —
for qwen3moe, gpt-oss and gemma4-moe (tools/make_arch_models.py)."""

import re
import sys
from pathlib import Path

import pytest

from pyggml.backend import vulkan
from pyggml.cli import main
from pyggml.offload.config import load_config
from pyggml.llm.runtime import LLM
from pyggml.offload import VirtualSpec
from pyggml.offload.plan import is_expert
from pyggml.planning.memory import CPU, Planner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_arch_models as M  # noqa: E402

CONFIG = ROOT / "configs" / "moe-experts-on-cpu.yaml"


# gpt-oss: MXFP4 experts with per-expert biases; gemma4-moe: fused gate|up experts with
# per-expert scales beside a dense FFN
@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss", "gemma4-moe"])
def moe(tmp_path_factory, request):
    return M.write_variant(request.param, tmp_path_factory.mktemp("moe") / f"{request.param}.gguf")


def _plans(path):
    with Planner(path, virtual=[VirtualSpec("laptop", "4GiB")]) as p:
        by_flags = p.plan(n_gpu_layers=99, n_ctx=256, overrides=[("exps", "CPU")])
        by_config = p.plan(CONFIG, sets=["devices=[laptop]"], n_ctx=256)
    return by_flags, by_config


def test_experts_stay_on_the_cpu_and_the_rest_goes_to_the_gpu(moe):
    for plan in _plans(moe):
        placed = plan.offload.weights
        experts = [n for n in placed if is_expert(n)]
        assert experts and all(placed[n].device == CPU for n in experts)
        assert all(p.device == "laptop" for n, p in placed.items()
                   if n.startswith("blk.") and not is_expert(n))
        cpu, gpu = plan.device(CPU), plan.device("laptop")
        assert cpu.experts == plan.expert_bytes > 0 and gpu.experts == 0
        assert plan.not_fitting() == []
        # a decoded token reads k of n routed experts: less than all weights, more than the rest
        n, k = plan.facts["n_expert"], plan.facts["n_expert_used"]
        assert 0 < k < n
        all_weights = sum(plan.tensor_bytes.values())
        assert all_weights - plan.expert_bytes < plan.weight_bytes_per_token < all_weights


def test_plan_command_shows_the_experts(moe, capsys):
    assert main(["plan", "-m", str(moe), "-c", "256", "-ngl", "99", "-ot", "exps=CPU",
                 "--virtual-device", "laptop=4GiB"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"experts: .* on CPU\); a decoded token reads \d+ of \d+ routed experts", out)
    assert re.search(r"^\s*laptop\s.*\byes$", out, re.M)         # it fits
    assert main(["mem", "-m", str(moe), "-c", "256", "-ngl", "99", "-ot", "exps=CPU",
                 "--virtual-device", "laptop=4GiB"]) == 0
    out = capsys.readouterr().out
    assert "of which experts (MoE)" in out and "weights read per decoded token" in out


@pytest.mark.skipif(vulkan.unavailable_reason() is not None, reason="no Vulkan device")
def test_the_runtime_runs_the_experts_config(moe):
    cfg = load_config(CONFIG, ["devices=[Vulkan0]"])       # lavapipe: used only where named
    with LLM(moe, config=cfg, n_ctx=64, n_threads=1) as llm, \
            LLM(moe, n_ctx=64, n_threads=1) as ref:
        placed = llm.offload.weights
        assert all(placed[n].device == CPU for n in placed if is_expert(n))
        assert placed["blk.0.attn_q.weight"].device == "Vulkan0"
        toks = [1, 5, 9, 13, 2, 7]
        a, b = llm.eval(toks), ref.eval(toks)
        assert a.argmax() == b.argmax()
        assert abs(a - b).max() < 0.05 * abs(b).max()
