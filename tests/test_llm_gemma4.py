"""Gemma 4's own pieces beyond the logits checks of tests/test_llm_archs.py (variants gemma4 and
gemma4-moe there, llama.cpp's references in tests/data/arch_refs_gemma4.npz):

- the hparams as llama.cpp's loader reads them: per-layer head sizes and rotated dims, the
  shared-KV layers' source layers, per-layer embeddings, experts on the layers with a router,
  the final soft-cap's default;
- shared KV: the last layers hold no cache bytes and read their source layer's tensors; with a
  sliding-window cell space of its own (n_ctx above the window's room) the logits of a prompt
  then single-token decodes still equal llama.cpp's;
- files pyggml cannot run fail at load with one line naming the key or tensor.
"""
import dataclasses
import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import ModelError, PyggmlError
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_arch_models as M  # noqa: E402

REFS = dict(np.load(ROOT / "tests" / "data" / "arch_refs_gemma4.npz"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    out = {}
    for v in ("gemma4", "gemma4-moe"):
        p = M.write_variant(v, d / f"{v}.gguf")
        assert hashlib.sha256(p.read_bytes()).hexdigest() == str(REFS[f"{v}.sha256"])
        out[v] = p
    return out


def _variant(tmp_path, base, name="bad", **kw):
    spec = M.VARIANTS[base]
    g4 = dict(spec.g4)
    g4.update(kw.pop("g4", {}))
    M.VARIANTS[name] = dataclasses.replace(spec, g4=g4, **kw)
    try:
        return M.write_variant(name, tmp_path / f"{name}.gguf")
    finally:
        del M.VARIANTS[name]


def test_hparams_as_llamacpp_reads_them(models):
    with LLM(models["gemma4"], n_ctx=256) as m:
        hp = m.hparams
        assert hp.swa_layers == [True, False, True, False]
        assert [hp.head_k(il) for il in range(4)] == [64, 128, 64, 128]
        assert [hp.rot(il) for il in range(4)] == [64, 128, 64, 128]
        assert hp.n_ff == [768, 512, 1024, 768]
        # shared_kv_layers 2: layers 2 (sliding) and 3 (global) read layers 0 and 1
        assert [hp.kv_layer(il) for il in range(4)] == [0, 1, 0, 1]
        assert hp.n_embd_per_layer == 256 and hp.attn_scale == 1.0
        assert hp.embd_scale == 16.0 and hp.final_softcap == 30.0
        assert (hp.rope_base, hp.rope_base_swa) == (1e6, 1e4)
        kv = m.kv
        assert kv.k[2] is kv.k[0] and kv.v[3] is kv.v[1]
        assert kv.layer_bytes(2) == kv.layer_bytes(3) == 0
        assert kv.n_bytes == kv.layer_bytes(0) + kv.layer_bytes(1) > 0
        assert kv.k[0].ne[0] == 64 * 2 and kv.k[1].ne[0] == 128 * 2
    with LLM(models["gemma4-moe"], n_ctx=256) as m:
        hp = m.hparams
        assert hp.expert_layers == [True] * 3
        assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 2, 256)
        assert hp.final_softcap == 30.0        # the key is absent: llama.cpp's default
        assert "blk.0.ffn_gate_up_exps.weight" in m.weights
        assert "blk.1.ffn_gate_exps.weight" in m.weights


def test_shared_kv_in_own_sliding_window_space(models):
    """n_ctx 1024: the sliding-window layers get a space of 256 cells (window 8 + ubatch 8,
    padded) apart from the full one; layer 2 shares layer 0's cells there. Prompt of 16, then 8
    single-token decodes: llama.cpp's logits (computed with one space) within the bound."""
    import test_llm_archs as A
    with LLM(models["gemma4"], n_ctx=1024, logits_all=True, n_threads=2, n_ubatch=8) as m:
        assert m.kv.layer_space == ["swa", "full", "swa", "full"]
        assert m.kv.spaces["swa"].n_cells == 256
        rows = [m.eval(A.TOKENS[:16])] + [m.eval([t]) for t in A.TOKENS[16:]]
    A.check_against_llamacpp("gemma4", 1, np.concatenate(rows))


@pytest.mark.parametrize("kw, match", [
    ({"g4": {"shared_kv": 3}}, r"shared_kv_layers = 3 leaves 1 layers with a KV cache"),
    ({"g4": {"n_rot_swa": 96}}, r"gemma4.rope.dimension_count_swa = 96 must be > 0, even and "
                                r"at most the head size 64"),
    ({"g4": {"swa": [True, True, False, False]}},
     r"layer 2 \(global\) would share the KV cache of layer 1 \(sliding-window; "),
])
def test_bad_shared_kv_is_a_load_error(tmp_path, kw, match):
    p = _variant(tmp_path, "gemma4", **kw)
    with pytest.raises(ModelError, match=match):
        LLM(p, n_ctx=256)


def test_unsupported_files_fail_at_load_with_one_line(tmp_path):
    src = M.write_variant("gemma4-moe", tmp_path / "ok.gguf")

    def rewrite(name, **kw):
        return M.rewrite(src, tmp_path / f"{name}.gguf", **kw)

    cases = [
        (rewrite("nopattern", drop_keys=("gemma4.attention.sliding_window_pattern",)),
         r"gemma4 needs gemma4.attention.sliding_window_pattern"),
        (rewrite("noper", drop_keys=("gemma4.embedding_length_per_layer_input",)),
         r"required key 'gemma4.embedding_length_per_layer_input' \(uint32\) is missing"),
        (rewrite("scale", add_tensor=("blk.0.ffn_up.scale", np.ones(1, np.float32))),
         r"blk.0.ffn_up.scale: per-tensor weight scales are not supported"),
        (rewrite("badoutscale", add_tensor=("blk.1.layer_output_scale.weight",
                                            np.ones(3, np.float32))),
         r"tensor 'blk.1.layer_output_scale.weight' has shape \[3\], expected \[1\]"),
        (rewrite("nogate", rename={"blk.1.ffn_gate_exps.weight": "blk.1.ffn_gatex_exps.weight"}),
         r"missing tensor 'blk.1.ffn_gate_exps.weight'"),
    ]
    for path, match in cases:
        with pytest.raises(PyggmlError, match=match) as e:
            LLM(path, n_ctx=256)
        assert "\n" not in str(e.value)


def test_plan_keeps_per_layer_embeddings_on_the_cpu_and_out_of_per_token_reads(models):
    """The per-layer embedding table is read one row per token (get_rows), like token_embd:
    placed on the CPU as embeddings under -ngl 99 and not counted in the bytes a decoded token
    reads; the shared-KV layers hold no KV bytes in the plan."""
    from pyggml.offload import VirtualSpec
    from pyggml.offload.plan import tensor_kind
    from pyggml.planning.memory import CPU, Planner
    assert tensor_kind("per_layer_token_embd.weight") == "embd"
    with Planner(models["gemma4"], virtual=[VirtualSpec("laptop", "4GiB")]) as p:
        plan = p.plan(n_gpu_layers=99, n_ctx=256)
    placed = plan.offload.weights
    assert placed["per_layer_token_embd.weight"].device == CPU
    assert placed["blk.0.inp_gate.weight"].device == "laptop"
    ple = plan.tensor_bytes["per_layer_token_embd.weight"]
    rest = sum(plan.tensor_bytes.values()) - ple - plan.tensor_bytes["token_embd.weight"]
    assert ple > 0 and plan.weight_bytes_per_token <= rest + 4096
    kv = {x.layer: x.bytes for x in plan.kv_layers}
    assert kv[2] == kv[3] == 0 < kv[0] < kv[1]


def test_saved_state_skips_shared_layers_and_continues_exactly(models):
    import test_llm_archs as A
    with LLM(models["gemma4"], n_ctx=256, n_threads=2, n_seq_max=2) as m:
        m.eval(A.TOKENS[:16])
        st = m.save_state()
        assert set(st.spaces["full"][1]) == {0, 1}           # layers 2 and 3 share 0 and 1
        want = [m.eval([t]) for t in A.TOKENS[16:20]]
        m.reset()
        m.load_state(st, seq_id=1)
        got = [m.eval([t], seq_id=1) for t in A.TOKENS[16:20]]
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
