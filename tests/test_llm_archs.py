"""Every architecture variant against llama.cpp, without downloading a model: random-weight GGUFs
regenerated from tools/make_arch_models.py (byte-identical to the ones the references were made
on: the sha256 is checked) and llama.cpp's logits for every position of a fixed 24-token sequence
(tests/data/arch_refs.npz, made by tools/make_arch_refs.py with llama-cpp-python 0.3.36, with
flash attention off and on).

What is compared, per variant, CPU kernel path (scalar, avx2, avx512, neon where available) and
attention path (pyggml's flash_attn False / True against llama.cpp's fa0 / fa1):

- the logit RMS error over all T x V logits is at most RMS_BOUND[variant]. The noise floor is
  llama.cpp's own: its two attention paths round differently (softmax weights meet V in f16
  without flash attention; f16 accumulation with it), and the activation quantization before
  each quantized matmul (Q8_0 / Q8_K rows) turns such last-bit differences into whole
  quantization steps, which random weights amplify layer by layer. The bounds are 1.5 times
  llama.cpp's own fa0-vs-fa1 RMS difference on that variant plus 0.002 (the f16 storage of the
  reference logits), i.e. pyggml is no further from llama.cpp than llama.cpp is from itself.
  Measured (x86-64, all paths; RMS of logits ~2): see MEASURED below.
- the ordered top-5 ids: at every position and rank r < 5 where llama.cpp's gaps to ranks r-1
  and r+1 both exceed the noise (5 times llama.cpp's own fa0-vs-fa1 RMS difference + 0.01),
  pyggml's rank-r id is llama.cpp's. In particular the top-1 id is llama.cpp's wherever its own
  top-2 margin is above the noise. So that the check cannot pass by skipping: at least half of
  the positions have a clear top-2 margin and at least 20% of all (position, rank) pairs are
  clear (22-67% are, per variant).

Also: the sequence fed as a 16-token prompt then 8 single-token decodes (decode graphs, KV
reuse) gives the same logits within the same bound; every variant fully offloaded to Vulkan
(lavapipe) meets the same bounds (1.25 times them; 2.5 for qwen3moe, see the test); an unknown
architecture is a clear error naming the known ones.
"""
import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml import _native
from pyggml.backend import vulkan
from pyggml.errors import ModelError
from pyggml.llm.archs import SUPPORTED_ARCHS
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_arch_models as M  # noqa: E402

# arch_refs_2026.npz: the variants of issue 32 (IQ1..IQ4/MXFP4/TQ weights, smollm3, mistral3, gpt-oss), made
# the same way on their own so that either file can be remade without the other
# arch_refs_gemma4.npz: the gemma4 variants (dense with per-layer embeddings and shared KV; MoE)
# arch_refs_gemma3n.npz: the gemma3n variant (AltUp, LAuReL, activation sparsity, shared KV)
REFS = {k: v for f in ("arch_refs.npz", "arch_refs_2026.npz", "arch_refs_gemma4.npz",
                       "arch_refs_gemma3n.npz")
        for k, v in np.load(ROOT / "tests" / "data" / f).items()}
TOKENS = [int(t) for t in REFS["tokens"]]
VARIANTS = sorted(M.VARIANTS)
MOE = [v for v in VARIANTS if M.VARIANTS[v].n_expert]
N_CTX = 256          # llama.cpp's context after its padding to 256 (decides Phi-3's factors)


def _self_diff(name):
    a = REFS[f"{name}.fa0.logits"].astype(np.float32)
    b = REFS[f"{name}.fa1.logits"].astype(np.float32)
    return float(np.sqrt(((a - b) ** 2).mean())), float(np.abs(a - b).max())


RMS_BOUND = {v: 1.5 * _self_diff(v)[0] + 0.002 for v in VARIANTS}
NOISE = {v: 5.0 * _self_diff(v)[0] + 0.01 for v in VARIANTS}
# pyggml vs llama.cpp: RMS over all logits (flash attention off / on), the largest over the
# scalar, AVX2 and AVX-512 paths (x86-64)
MEASURED = {"gemma2": (0.0235, 0.0355), "granite": (0.0004, 0.0224),
            "granitemoe": (0.0135, 0.0274), "llama3": (0.0077, 0.0741),
            "mixtral": (0.0030, 0.0274), "olmo2": (0.0184, 0.0299), "olmoe": (0.0217, 0.0255),
            "phi3": (0.0099, 0.0204), "phi3-long": (0.0030, 0.0301),
            "qwen3": (0.0164, 0.0360), "qwen3-yarn": (0.0082, 0.0301),
            "qwen3moe": (0.0133, 0.0214), "llama-iq4": (0.0022, 0.0312),
            "smollm3": (0.0006, 0.0710), "mistral3": (0.0111, 0.0369),
            "gpt-oss": (0.0307, 0.0295), "llama-iqgrid": (0.0004, 0.0383),
            "llama-tq": (0.0187, 0.0320), "gemma4": (0.0209, 0.1339),
            "gemma4-moe": (0.0190, 0.0497), "gemma3n": (0.0516, 0.0573)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch_models")
    paths = {}
    for v in VARIANTS:
        p = M.write_variant(v, d / f"{v}.gguf")
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        assert digest == str(REFS[f"{v}.sha256"]), (
            f"{v}: the generator no longer writes the file the references were made on; "
            f"rerun tools/make_arch_refs.py")
        paths[v] = p
    return paths


@pytest.fixture
def cpu_path(request):
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


def check_against_llamacpp(name, fa, logits, slack=1.0):
    """logits float32 [T, V] of pyggml vs llama.cpp's (fa: its attention path); slack scales
    the RMS bound and the noise."""
    ref = REFS[f"{name}.fa{fa}.logits"].astype(np.float32)
    ids, vals = REFS[f"{name}.fa{fa}.top_ids"], REFS[f"{name}.fa{fa}.top_vals"]
    assert logits.shape == ref.shape
    rms = float(np.sqrt(((logits - ref) ** 2).mean()))
    bound = slack * RMS_BOUND[name]
    assert rms <= bound, f"{name}: logit RMS error {rms:.4f} > {bound:.4f}"
    noise = slack * NOISE[name]
    checked = 0
    for t in range(len(ref)):
        order = np.argsort(-logits[t], kind="stable")[:5]
        for r in range(5):
            clear_below = vals[t, r] - vals[t, r + 1] > noise
            clear_above = r == 0 or vals[t, r - 1] - vals[t, r] > noise
            if clear_below and clear_above:
                checked += 1
                assert order[r] == ids[t, r], (
                    f"{name}: position {t} rank {r}: id {order[r]}, llama.cpp {ids[t, r]} "
                    f"(gaps {vals[t, r - 1] - vals[t, r] if r else np.inf:.3f} / "
                    f"{vals[t, r] - vals[t, r + 1]:.3f}, noise {noise:.3f})")
    if slack == 1.0:        # (with more noise fewer ranks are clear; the CPU runs cover them)
        assert checked >= 0.2 * 5 * len(ref), f"{name}: only {checked} clear (position, rank) pairs"
        assert (vals[:, 0] - vals[:, 1] > noise).mean() >= 0.5, f"{name}: too few clear top-1s"
    return rms


def test_bounds_are_stated_for_every_variant():
    assert set(MEASURED) == set(VARIANTS) == set(RMS_BOUND)
    for v, (fa0, fa1) in MEASURED.items():
        assert fa0 <= RMS_BOUND[v] and fa1 <= RMS_BOUND[v], v
    # every architecture the registry knows is covered by at least one variant
    covered = {M.VARIANTS[v].arch for v in VARIANTS}
    import make_hybrid_models        # the hybrid architectures: tests/test_llm_hybrid.py
    covered |= {s.arch for s in make_hybrid_models.VARIANTS.values()}
    assert covered | {"gemma3", "qwen2"} == set(SUPPORTED_ARCHS)


@pytest.mark.parametrize("cpu_path", _native.available_paths(), indirect=True)
@pytest.mark.parametrize("fa", [0, 1])
@pytest.mark.parametrize("name", VARIANTS)
def test_logits_match_llamacpp(models, name, fa, cpu_path):
    with LLM(models[name], n_ctx=N_CTX, logits_all=True, n_threads=2,
             flash_attn=bool(fa)) as m:
        logits = m.eval(TOKENS)
    check_against_llamacpp(name, fa, logits)


@pytest.mark.parametrize("name", VARIANTS)
def test_prompt_then_decode_matches_llamacpp(models, name):
    with LLM(models[name], n_ctx=N_CTX, logits_all=True, n_threads=2, n_ubatch=8) as m:
        rows = [m.eval(TOKENS[:16])] + [m.eval([t]) for t in TOKENS[16:]]
        assert m.stats.graphs_reused > 0
    check_against_llamacpp(name, 1, np.concatenate(rows))
    # logits of the last position only (the output rows picked before the last layer's FFN)
    with LLM(models[name], n_ctx=N_CTX, n_threads=2) as m:
        last = m.eval(TOKENS)
    ref = REFS[f"{name}.fa1.logits"][-1].astype(np.float32)
    assert float(np.sqrt(((last - ref) ** 2).mean())) <= 2 * RMS_BOUND[name]
    assert int(np.argmax(last)) == int(REFS[f"{name}.fa1.top_ids"][-1, 0]) or \
        REFS[f"{name}.fa1.top_vals"][-1, 0] - REFS[f"{name}.fa1.top_vals"][-1, 1] <= NOISE[name]


def test_moe_hparams_and_expert_tensors(models):
    with LLM(models["qwen3moe"], n_ctx=N_CTX) as m:
        hp = m.hparams
        assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 3, 256)
        assert hp.expert_norm_w and hp.expert_gating == "softmax"
        assert list(m.weights["blk.0.ffn_up_exps.weight"].ne[:3]) == [256, 256, 8]
    with LLM(models["olmoe"], n_ctx=N_CTX) as m:
        assert not m.hparams.expert_norm_w
    with LLM(models["granitemoe"], n_ctx=N_CTX) as m:
        assert m.hparams.n_ff_shexp == 512 and m.hparams.logit_scale == 3.0


def test_phi3_picks_long_factors_by_context(models):
    from pyggml.llm.archs.common import rope_factors
    with LLM(models["phi3-long"], n_ctx=N_CTX) as m:      # original context 128
        hp, w = m.hparams, m.weights
        assert rope_factors(hp, w, N_CTX) is w["rope_factors_long.weight"]
        assert rope_factors(hp, w, 128) is w["rope_factors_short.weight"]
        assert abs(hp.rope_attn_factor - float(np.sqrt(1 + np.log(32) / np.log(128)))) < 1e-6
    with LLM(models["phi3"], n_ctx=N_CTX) as m:           # original 4096
        assert rope_factors(m.hparams, m.weights, N_CTX) is m.weights["rope_factors_short.weight"]
        assert m.hparams.rope_attn_factor == 1.0


def test_unknown_architecture_is_a_clear_error(tmp_path):
    import gguf
    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.add_uint32("mamba.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"architecture 'mamba' is not supported \(supported: "
                                         r".*gemma2.*granitemoe.*olmoe.*phi3.*qwen3moe"):
        LLM(p)


def test_bad_expert_count_is_a_clear_error(tmp_path):
    import dataclasses
    spec = M.VARIANTS["qwen3moe"]
    M.VARIANTS["bad-moe"] = dataclasses.replace(spec, n_expert_used=9)
    try:
        p = M.write_variant("bad-moe", tmp_path / "bad.gguf")
    finally:
        del M.VARIANTS["bad-moe"]
    with pytest.raises(ModelError, match=r"expert_used_count = 9 must be in \[1, "
                                         r"qwen3moe.expert_count = 8\]"):
        LLM(p)


vulkan_missing = vulkan.unavailable_reason()      # None, or why no device can be used


@pytest.mark.skipif(vulkan_missing is not None, reason=f"no Vulkan device: {vulkan_missing}")
@pytest.mark.parametrize("name", VARIANTS)
def test_on_vulkan_matches_llamacpp(models, name):
    with LLM(models[name], n_ctx=N_CTX, logits_all=True, n_threads=2, n_gpu_layers=99,
             device="Vulkan0") as m:
        dev = m.backends[0].device.name
        assert dev.lower().startswith("vulkan")
        w = "blk.0.ffn_down_exps.weight" if name in MOE else "blk.0.ffn_down.weight"
        assert m.offload.weights[w].device == dev
        logits = m.eval(TOKENS)
    # The Vulkan matmuls round activations otherwise than the CPU's Q8_0 / Q8_K rows, so the
    # noise is that of a third implementation: measured RMS (bound): gemma2 0.032 (0.056),
    # granite 0.025 (0.036), granitemoe 0.032 (0.032), llama3 0.085 (0.112), mixtral 0.029
    # (0.044), olmo2 0.033 (0.048), olmoe 0.027 (0.040), phi3 0.023 (0.032), phi3-long 0.033
    # (0.047), qwen3 0.037 (0.058), qwen3-yarn 0.032 (0.047); hence 1.25 times the CPU bound
    # and noise. qwen3moe 0.078 (0.034): an expert whose router probability is within that
    # rounding of the k-th best is chosen otherwise at position 3 (0.31 RMS there), which moves
    # the later positions through attention; hence 2.5 times, and the typical position within
    # the CPU bound. With f16 weights (no activation quantization) the Vulkan MoE graph equals
    # the CPU's: test_moe_on_vulkan_equals_cpu_f16.
    check_against_llamacpp(name, 1, logits, slack=2.5 if name == "qwen3moe" else 1.25)
    ref = REFS[f"{name}.fa1.logits"].astype(np.float32)
    per_pos = np.sqrt(((logits - ref) ** 2).mean(1))
    assert float(np.median(per_pos)) <= RMS_BOUND[name], np.round(per_pos, 3)


@pytest.mark.skipif(vulkan_missing is not None, reason=f"no Vulkan device: {vulkan_missing}")
@pytest.mark.parametrize("name", MOE)
def test_moe_on_vulkan_equals_cpu_f16(tmp_path, name):
    import dataclasses
    M.VARIANTS["f16-moe"] = dataclasses.replace(M.VARIANTS[name], types=("f16",), exp_type="")
    try:
        path = M.write_variant("f16-moe", tmp_path / "f16.gguf")
    finally:
        del M.VARIANTS["f16-moe"]
    with LLM(path, n_ctx=N_CTX, logits_all=True, n_threads=2) as m:
        cpu = m.eval(TOKENS)
    with LLM(path, n_ctx=N_CTX, logits_all=True, n_threads=2, n_gpu_layers=99,
             device="Vulkan0") as m:
        assert m.offload.weights["blk.1.ffn_down_exps.weight"].device != "CPU"
        gpu = m.eval(TOKENS)
    # measured 0.001 (f16 K/V and activations rounded in different places)
    assert float(np.sqrt(((gpu - cpu) ** 2).mean(1)).max()) <= 0.004
    assert (np.argmax(gpu, 1) == np.argmax(cpu, 1)).all()
