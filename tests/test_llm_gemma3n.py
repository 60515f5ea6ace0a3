"""Gemma 3n's own pieces beyond the logits checks of tests/test_llm_archs.py (variant gemma3n
there: every prompt position on every CPU path, both attention paths, prompt then decodes,
Vulkan; llama.cpp's references in tests/data/arch_refs_gemma3n.npz):

- the hparams as llama.cpp's loader reads them: the sliding-window pattern, the last two of 22
  layers on the KV of layers 18 / 19, AltUp's 4 copies, LAuReL's rank, 256 per-layer dims,
  the FFN sparsity of layers 0..9, the final soft-cap; a file without the keys llama.cpp
  ignores gets its constants and computes the same logits;
- llama.cpp's greedy continuation, one decode per token;
- shared KV in a sliding-window cell space of its own;
- fully offloaded to Vulkan: AltUp's ops (CONCAT, SUM_ROWS, SQRT, DIV, TANH) and the sparsity's
  CLAMP run on the device;
- files pyggml cannot run fail at load with one line naming the key or tensor;
- the chat template renders as llama-cpp-python's (tests/test_chat_template_2026.py runs it).
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend import vulkan
from pyggml.errors import ModelError, PyggmlError
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_arch_models as M  # noqa: E402

REFS = dict(np.load(ROOT / "tests" / "data" / "arch_refs_gemma3n.npz"))
TOKENS = [int(t) for t in REFS["tokens"]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = M.write_variant("gemma3n", tmp_path_factory.mktemp("gemma3n") / "gemma3n.gguf")
    assert hashlib.sha256(p.read_bytes()).hexdigest() == str(REFS["gemma3n.sha256"])
    return p


def test_hparams_as_llamacpp_reads_them(model):
    with LLM(model, n_ctx=256) as m:
        hp = m.hparams
        assert hp.swa_layers == [il % 5 < 4 for il in range(20)] + [True, False]
        # layers 20 (sliding) and 21 (global) read layers 18 and 19
        assert [hp.kv_layer(il) for il in range(22)] == list(range(20)) + [18, 19]
        assert (hp.n_altup, hp.i_altup_act, hp.laurel_rank, hp.n_embd_per_layer) == \
            (4, 0, 64, 256)
        assert hp.ffn_sparsity == [pytest.approx(1.6448533535)] * 10 + [None] * 12
        assert hp.attn_scale == 1.0 and hp.embd_scale == 16.0 and hp.final_softcap == 30.0
        assert (hp.rope_base, hp.rope_base_swa, hp.rope_freq_scale_swa) == (1e6, 1e4, 1.0)
        assert hp.sliding_window == 8
        kv = m.kv
        assert kv.k[20] is kv.k[18] and kv.v[21] is kv.v[19]
        assert kv.layer_bytes(20) == kv.layer_bytes(21) == 0 < kv.layer_bytes(19)
        assert list(m.weights["altup_proj.weight"].ne[:3]) == [256, 256, 3]


def test_keys_llamacpp_ignores_default_to_its_constants(model, tmp_path):
    """llama.cpp fixes AltUp's size and active copy, the per-layer dims, the start of KV
    sharing (20) and the sparse layers (0..9, Φ⁻¹(0.95)); a file without those keys gets the
    same hparams and bit for bit the same logits."""
    drop = [f"gemma3n.{k}" for k in ("altup.num_inputs", "altup.active_idx",
                                      "embedding_length_per_layer_input",
                                      "attention.shared_kv_layers", "activation_sparsity_scale",
                                      "final_logit_softcapping")]
    bare = M.rewrite(model, tmp_path / "bare.gguf", drop_keys=drop)
    out = []
    for p in (model, bare):
        with LLM(p, n_ctx=256, logits_all=True, n_threads=2) as m:
            hp = m.hparams
            out.append((hp.n_altup, hp.i_altup_act, hp.n_embd_per_layer, hp.kv_source,
                        hp.ffn_sparsity, hp.final_softcap, m.eval(TOKENS[:6]).tobytes()))
    assert out[0] == out[1]


def test_greedy_path_matches_llamacpp(model):
    from test_llm_archs import NOISE
    want, margin = REFS["gemma3n.greedy"], REFS["gemma3n.greedy_margin"]
    assert (margin > NOISE["gemma3n"]).all()        # every step clear of the noise
    with LLM(model, n_ctx=256, n_threads=2) as m:
        got = [t.id for t in m.generate(TOKENS[:8], len(want), temperature=0,
                                        stop_at_eog=False)]
    assert got == [int(t) for t in want]


def test_shared_kv_in_own_sliding_window_space(model):
    """n_ctx 1024: the sliding-window layers get a space of their own; layer 20 shares layer
    18's cells there, layer 21 layer 19's in the full space. Prompt of 16, then 8 single-token
    decodes: llama.cpp's logits (computed with one space) within the bound."""
    import test_llm_archs as A
    with LLM(model, n_ctx=1024, logits_all=True, n_threads=2, n_ubatch=8) as m:
        assert m.kv.layer_space[18:] == ["swa", "full", "swa", "full"]
        assert m.kv.spaces["swa"].n_cells < 1024
        rows = [m.eval(A.TOKENS[:16])] + [m.eval([t]) for t in A.TOKENS[16:]]
    A.check_against_llamacpp("gemma3n", 1, np.concatenate(rows))


VULKAN_MISSING = vulkan.unavailable_reason()      # None, or why no device can be used


@pytest.mark.skipif(VULKAN_MISSING is not None, reason=f"no Vulkan device: {VULKAN_MISSING}")
def test_fully_offloaded_runs_altup_on_vulkan(model):
    """-ngl 99: the layers' ops run on the device, AltUp's and the sparsity's among them; the
    CPU keeps the lookups and what reads the tensors outside the layers that llama.cpp keeps
    with the input (per_layer_model_proj and its norm) or that pyggml's planner keeps on the
    CPU (altup_proj / altup_unembd_proj). The logits: test_llm_archs.py."""
    from pyggml.types import VIEW_OPS
    with LLM(model, n_ctx=256, n_threads=2, n_gpu_layers=99, device="Vulkan0") as m:
        m.eval(TOKENS[:4])
        dev = m.backends[0].device.name
        assert m.offload.weights["blk.21.laurel_r.weight"].device == dev
        assert m.offload.weights["blk.0.altup_predict_coef.weight"].device == dev
        views = {op.name for op in VIEW_OPS} | {"NONE"}
        for phase, s in m.sched.items():
            rows = [r for r in s.assignments() if r[1] not in views]
            on_dev = {op for n, op, b, _ in rows if b == dev}
            assert {"CONCAT", "SUM_ROWS", "SQRT", "DIV", "TANH", "CLAMP", "MUL_MAT"} <= on_dev
            on_cpu = [(n, op) for n, op, b, _ in rows if b != dev]
            # the token lookups, the per-layer projection, AltUp's entry and exit matmuls
            assert len(on_cpu) <= 8, (phase, on_cpu)
            assert {op for _, op in on_cpu} <= {"GET_ROWS", "MUL_MAT", "SCALE", "RMS_NORM",
                                                "MUL"}, on_cpu


@pytest.mark.parametrize("keys, match", [
    ({"attention.shared_kv_layers": 21},
     r"gemma3n.attention.shared_kv_layers = 21 leaves 1 layers with a KV cache"),
    ({"attention.sliding_window_pattern": [il % 5 < 4 for il in range(19)] + [True, True, False]},
     r"layer 21 \(global\) would share the KV cache of layer 19 \(sliding-window; "
     r"gemma3n.attention.shared_kv_layers = 2\)"),
    ({"activation_sparsity_scale": [1.0] * 21},
     r"gemma3n.activation_sparsity_scale has 21 entries for 22 layers"),
    ({"altup.active_idx": 4},
     r"gemma3n.altup.num_inputs = 4 must be >= 2 and gemma3n.altup.active_idx = 4 below it"),
])
def test_bad_metadata_is_a_load_error(model, tmp_path, keys, match):
    p = M.rewrite(model, tmp_path / "bad.gguf",
                 set_keys={f"gemma3n.{k}": v for k, v in keys.items()})
    with pytest.raises(ModelError, match=match) as e:
        LLM(p, n_ctx=256)
    assert "\n" not in str(e.value)


def test_bad_tensors_fail_at_load_with_one_line(model, tmp_path):
    cases = [
        (M.rewrite(model, tmp_path / "nolaurel.gguf", drop_tensors=("blk.3.laurel_r.weight",)),
         r"missing tensor 'blk.3.laurel_r.weight' \(architecture gemma3n\)"),
        (M.rewrite(model, tmp_path / "noaltup.gguf", drop_tensors=("altup_unembd_proj.weight",)),
         r"missing tensor 'altup_unembd_proj.weight'"),
        (M.rewrite(model, tmp_path / "coef.gguf", drop_tensors=("blk.5.altup_predict_coef.weight",),
                  add_tensor=("blk.5.altup_predict_coef.weight",
                              np.zeros((4, 4), np.float32))),
         r"tensor 'blk.5.altup_predict_coef.weight' has shape \[4, 4\], expected \[4, 16\]"),
    ]
    for path, match in cases:
        with pytest.raises(PyggmlError, match=match) as e:
            LLM(path, n_ctx=256)
        assert "\n" not in str(e.value)


def test_chat_template_is_covered():
    """Gemma 3n's template is among those tests/test_chat_template_2026.py renders against
    llama-cpp-python's (the system message folded into the first user turn)."""
    refs = json.loads((ROOT / "tests" / "data" / "template_refs_2026.json").read_text("utf-8"))
    r = refs["templates"]["google-gemma-3n-E4B-it.jinja"]["cases"][0]["renders"]
    assert r["gen.system_multi"].startswith("<bos><start_of_turn>user\nYou are a terse "
                                            "assistant.\n\nHello!")
    assert r["gen.user"].endswith("<end_of_turn>\n<start_of_turn>model\n")
