"""Config -> OffloadPlan: llama.cpp's -ngl / -ts / -ot / --no-kv-offload semantics, rule order
and deciding rules, kinds, KV per layer range, phase rules, device errors and fallback, warnings,
and the equivalent llama.cpp flags (checked by applying them back)."""
import re

import pytest

from pyggml.errors import ConfigError
from pyggml.offload import (
    CPU,
    DeviceCatalog,
    DeviceInfo,
    config_from_flags,
    llama_flags,
    plan_from_args,
    plan_from_config,
    tensor_kind,
)
from pyggml.offload.config import parse_text

L = 4
SHORTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
          "ffn_up", "ffn_down")
NAMES = (["token_embd.weight", "output_norm.weight"]
         + [f"blk.{i}.{s}.weight" for i in range(L) for s in SHORTS])     # tied: no output.weight
GIB = 1 << 30


def catalog(*gpus, free=8 * GIB):
    return DeviceCatalog([DeviceInfo(g, free=free, total=free, buffer_types=(g,)) for g in gpus]
                         + [DeviceInfo(CPU, is_cpu=True, free=64 * GIB, buffer_types=(CPU,))])


def plan_s(text, *gpus, names=NAMES, tied=True, sets=()):
    cfg = parse_text(text, "t.yaml")
    return plan_from_config(cfg, names, L, tied, catalog=catalog(*gpus), sets=sets)


def plan(text, *gpus, **kw):
    return plan_s(text, *gpus, **kw)[0]


def on(p, dev):
    return sorted(n for n, x in p.weights.items() if x.device == dev)


def test_kinds():
    assert [tensor_kind(n) for n in ("blk.0.attn_q.weight", "blk.0.attn_q_norm.weight",
                                     "blk.3.ffn_up_exps.weight", "blk.1.post_ffw_norm.weight",
                                     "token_embd.weight", "output.weight", "output_norm.weight",
                                     "rope_freqs.weight", "blk.0.attn_k.bias")] == \
        ["attn", "norm", "experts", "norm", "embd", "output", "output", None, "attn"]



def test_gemma3n_altup_projections_go_with_the_output_layer():
    """llama.cpp's tensor infos put Gemma 3n's AltUp projections (global, used at the first and
    the last layer) in its output layer (LLM_TENSOR_LAYER_OUTPUT): they follow the output
    matrix under gpu_layers, and kind: output rules take them."""
    altup = ["altup_proj.weight", "altup_unembd_proj.weight"]
    assert [tensor_kind(n) for n in altup] == ["output", "output"]
    names = NAMES + altup
    p = plan("gpu_layers: 1\ndevices: [Vulkan0]\n", "Vulkan0", names=names)
    assert on(p, "Vulkan0") == sorted(altup + ["output.weight", "output_norm.weight"])
    assert p.weights["altup_proj.weight"].rule == p.weights["output_norm.weight"].rule
    assert set(on(plan("devices: [Vulkan0]\n", "Vulkan0", names=names), CPU)) == set(names)
    p = plan("gpu_layers: all\ndevices: [Vulkan0]\noverrides:\n"
             "  - {kind: output, device: cpu}\n", "Vulkan0", names=names)
    assert set(altup) <= set(on(p, CPU)) and "blk.3.attn_q.weight" in on(p, "Vulkan0")

def test_per_layer_projection_goes_with_layer_0():
    """Gemma 3n / Gemma 4's per_layer_model_proj and per_layer_proj_norm are global names that
    llama.cpp creates as layer 0's tensors: under gpu_layers they follow layer 0 (on the GPU
    only when layer 0 is), other global tensors (rope_freqs) stay on the CPU."""
    proj = ["per_layer_model_proj.weight", "per_layer_proj_norm.weight"]
    names = NAMES + proj + ["rope_freqs.weight"]
    p = plan("gpu_layers: all\ndevices: [Vulkan0]\n", "Vulkan0", names=names)
    assert set(proj) <= set(on(p, "Vulkan0")) and "rope_freqs.weight" in on(p, CPU)
    assert p.weights[proj[0]].rule == p.weights["blk.0.attn_q.weight"].rule
    p = plan("gpu_layers: 4\ndevices: [Vulkan0]\n", "Vulkan0", names=names)  # 1..3, output
    assert "blk.0.attn_q.weight" in on(p, CPU) and set(proj) <= set(on(p, CPU))
    assert "blk.1.attn_q.weight" in on(p, "Vulkan0")


def test_expert_rules_and_kind_ffn_include_experts():
    names = [f"blk.{i}.{t}.weight" for i in range(2) for t in
             ("attn_q", "ffn_gate_inp", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp")]
    cfg = parse_text("gpu_layers: all\ndevices: [Vulkan0]\noverrides:\n"
                     "  - {kind: experts, device: cpu}\n")
    plan, _ = plan_from_config(cfg, names, 2, False, catalog=catalog("Vulkan0"))
    on_cpu = {n for n, p in plan.weights.items() if p.device == CPU}
    assert on_cpu == {n for n in names if "exps" in n or "shexp" in n}
    flags, _ = llama_flags(cfg, plan, names, 2)
    i = flags.index("-ot")
    assert re.search(flags[i + 1].split("=")[0], "blk.0.ffn_up_exps.weight")
    assert not re.search(flags[i + 1].split("=")[0], "blk.0.ffn_gate_inp.weight")
    ffn = parse_text("overrides:\n  - {kind: ffn, device: cpu}\ngpu_layers: all\n"
                     "devices: [Vulkan0]\n")
    plan, _ = plan_from_config(ffn, names, 2, False, catalog=catalog("Vulkan0"))
    assert {n for n, p in plan.weights.items() if p.device == CPU} == {
        n for n in names if ".ffn_" in n}


@pytest.mark.parametrize("ngl, gpu_layers, output", [
    (0, [], False), (1, [], True), (2, [3], True), (4, [1, 2, 3], True),
    (5, [0, 1, 2, 3], True), (99, [0, 1, 2, 3], True)])
def test_ngl_offloads_the_last_slots_like_llamacpp(ngl, gpu_layers, output):
    p = plan_from_args(NAMES, L, True, ngl, "Vulkan0" if ngl else None)
    layers = sorted({int(n.split(".")[1]) for n in on(p, "Vulkan0") if n.startswith("blk.")})
    assert layers == gpu_layers
    assert ("output_norm.weight" in on(p, "Vulkan0")) == output
    assert ("output.weight" in p.weights) == output          # tied: a copy only off the CPU
    assert p.weights["token_embd.weight"].device == CPU
    assert [k.device for k in p.kv] == ["Vulkan0" if i in gpu_layers else CPU for i in range(L)]
    if 3 in gpu_layers:
        assert p.weights["blk.3.attn_q.weight"].rule == f"-ngl {ngl}"
    assert p.weights["blk.0.attn_q.weight"].rule == (f"-ngl {ngl}" if ngl >= 5 else "default: CPU")


def test_ngl_needs_a_gpu_and_a_count():
    with pytest.raises(ConfigError, match="-ngl must be >= 0"):
        plan_from_args(NAMES, L, True, -1, "Vulkan0")
    with pytest.raises(ConfigError, match="-ngl > 0 needs a GPU device"):
        plan_from_args(NAMES, L, True, 3, None)


def test_ot_rules_come_first_and_first_match_wins():
    p = plan_from_args(NAMES, L, True, 99, "Vulkan0",
                       overrides=[("blk\\.0\\.ffn", "CPU"), ("ffn_(up|down)", "Vulkan1")],
                       kv_offload=False, op_offload=False)
    assert p.weights["blk.0.ffn_up.weight"] == p.weights["blk.0.ffn_up.weight"].__class__(
        CPU, "-ot blk\\.0\\.ffn=CPU")
    assert p.weights["blk.1.ffn_up.weight"].device == "Vulkan1"
    assert p.weights["blk.1.ffn_gate.weight"].device == "Vulkan0"
    assert p.devices == ["Vulkan0", "Vulkan1", CPU]
    assert all(k.device == CPU and k.rule == "--no-kv-offload" for k in p.kv)
    assert p.op_offload == {"prefill": False, "decode": False}
    with pytest.raises(ConfigError, match=r"-ot ffn_\(=CPU: invalid regex"):
        plan_from_args(NAMES, L, True, 0, None, overrides=[("ffn_(", "CPU")])


def test_tensor_split_follows_llamacpp_upper_bound():
    p = plan("devices: [Vulkan0, Vulkan1]\ngpu_layers: all\ntensor_split: [3, 1]\n",
             "Vulkan0", "Vulkan1")
    # 5 slots, shares 0.75 / 1.0: slot i goes to the first device whose cumulative share > i/5
    assert p.layer_devices == ["Vulkan0"] * 4 + ["Vulkan1"]
    p = plan("devices: [1, 0]\ngpu_layers: 3\ntensor_split: [1, 2]\n", "Vulkan0", "Vulkan1")
    assert p.devices == ["Vulkan1", "Vulkan0", CPU]           # by index, in priority order
    assert p.layer_devices == [CPU, CPU, "Vulkan1", "Vulkan0", "Vulkan0"]


def test_rules_by_layers_and_kind_record_file_and_line():
    text = ("devices: [Vulkan0]\ngpu_layers: all\noverrides:\n"
            "  - layers: 0-1\n    kind: [ffn, norm]\n    device: cpu\n"
            "  - kind: attn\n    layers: 3\n    buffer_type: CPU\n")
    p = plan(text, "Vulkan0")
    assert p.weights["blk.1.ffn_norm.weight"].device == CPU
    assert p.weights["blk.1.ffn_norm.weight"].rule == \
        "overrides[0] layers 0-1 kind ffn,norm -> CPU (t.yaml:4)"
    assert p.weights["blk.2.ffn_up.weight"].device == "Vulkan0"
    assert p.weights["blk.2.ffn_up.weight"].rule == "gpu_layers: all (t.yaml:2)"
    assert p.weights["blk.3.attn_q.weight"].device == CPU
    assert p.weights["blk.1.attn_q.weight"].device == "Vulkan0"
    assert [len(r.decided) for r in p.rules] == [10, 4]     # 2 x (3 ffn + 2 norms); 4 attn


def test_kv_per_layer_range_and_types():
    text = ("devices: [Vulkan0]\ngpu_layers: all\nkv:\n  type_k: q8_0\n  ranges:\n"
            "    - layers: 0-1\n      device: cpu\n      type_v: f32\n")
    p, s = plan_from_config(parse_text(text, "t.yaml"), NAMES, L, True,
                            catalog=catalog("Vulkan0"))
    assert [k.device for k in p.kv] == [CPU, CPU, "Vulkan0", "Vulkan0"]
    assert p.kv[0].rule == "kv.ranges[0] layers 0-1 (t.yaml:6)"
    assert s["type_k"] == ("q8_0",) * 4 and s["type_v"] == ("f32", "f32", "f16", "f16")


def test_settings_from_config():
    _, s = plan_s("threads: {decode: 2, batch: 6}\ncontext: {n_ctx: 512, n_ubatch: 64}\n")
    assert s == {"n_threads": 2, "n_threads_batch": 6, "n_ctx": 512, "n_ubatch": 64}
    _, s = plan_s("threads: 3\n")
    assert s == {"n_threads": 3, "n_threads_batch": 3}


def test_config_settings_are_run_options_fields():
    from pyggml.llm.setup import RunOptions
    p, s = plan_s("threads: {decode: 2, batch: 6}\nkv: {type_k: q8_0}\n"
                  "context: {n_ctx: 512, n_batch: 256, n_ubatch: 64, n_seq_max: 2}\n")
    o = RunOptions(logits_all=True).with_settings(s)
    assert p.settings is s and o.logits_all          # what the config leaves unset stays
    assert (o.n_ctx, o.n_batch, o.n_ubatch, o.n_seq_max, o.n_threads, o.n_threads_batch) == \
        (512, 256, 64, 2, 2, 6)
    assert o.type_k == ("q8_0",) * L and o.type_v == ("f16",) * L


def test_phase_rules_move_ops_not_memory():
    text = ("devices: [Vulkan0]\ngpu_layers: 0\nop_offload: {prefill: true, decode: false}\n"
            "overrides:\n  - kind: attn\n    device: Vulkan0\n    phase: prefill\n"
            "  - layers: 0\n    device: cpu\n    phase: prefill\n")
    p = plan(text, "Vulkan0")
    assert all(x.device == CPU for x in p.weights.values())            # memory: host
    assert sorted(p.phase_ops) == ["prefill"]
    assert len(p.phase_ops["prefill"]) == 4 * L                         # attention of every layer
    assert p.phase_ops["prefill"]["blk.0.attn_q.weight"].device == "Vulkan0"
    assert p.devices_used() == ["Vulkan0", CPU]
    assert p.op_offload == {"prefill": True, "decode": False}
    # the layer-0 rule matches 9 tensors: 4 were taken by the rule before it
    assert len(p.rules[1].decided) == 5 and p.rules[1].shadowed_by == [0]


def test_device_errors_and_fallback():
    with pytest.raises(ConfigError) as e:
        plan("devices: [Vulkan0, Vulkan1]\ngpu_layers: all\ntensor_split: [1, 1]\n", "Vulkan0")
    msg = str(e.value)
    assert ("t.yaml:1:20: devices[1]: device 'Vulkan1' is absent on this machine (devices here: "
            "Vulkan0, CPU); set 'fallback: cpu'") in msg
    assert "tensor_split" not in msg                  # no follow-up noise
    p = plan("devices: [Vulkan0, Vulkan1]\ngpu_layers: all\ntensor_split: [1, 1]\n"
             "fallback: cpu\n", "Vulkan0")
    assert p.layer_devices == ["Vulkan0"] * 3 + [CPU] * 2
    assert "Vulkan1 absent -> CPU (fallback: cpu)" in p.weights["blk.3.attn_q.weight"].rule
    assert any("devices[1]: device 'Vulkan1' is absent" in w for w in p.warnings)
    with pytest.raises(ConfigError, match=r"t\.yaml:3:5: overrides\[0\]\.device: unknown device "
                                          r"'cuda0'.*devices here: Vulkan0, CPU"):
        plan("overrides:\n  - kind: ffn\n    device: cuda0\n", "Vulkan0")
    with pytest.raises(ConfigError, match=r"t\.yaml:1:1: gpu_layers: 2 layer\(s\) for the GPUs, "
                                          r"but this machine has no GPU"):
        plan("gpu_layers: 2\n")
    with pytest.raises(ConfigError, match=r"devices\[0\]: the CPU is always the last device"):
        plan("devices: [cpu, Vulkan0]\n", "Vulkan0")
    with pytest.raises(ConfigError, match=r"buffer_type: unknown buffer type 'Vulkan_Host'"):
        plan("overrides:\n  - kind: ffn\n    buffer_type: Vulkan_Host\n", "Vulkan0")


def test_warnings_for_rules_that_never_apply():
    text = ("devices: [Vulkan0]\ngpu_layers: all\noverrides:\n"
            "  - match: 'exps'\n    device: cpu\n"
            "  - layers: 10-12\n    device: cpu\n"
            "  - kind: ffn\n    device: cpu\n"
            "  - match: 'ffn_up'\n    device: Vulkan0\n")
    p = plan(text, "Vulkan0")
    w = "\n".join(p.warnings)
    assert "t.yaml:4:5: overrides[0]: matches no tensor of this model, so it never applies" in w
    assert ("t.yaml:6:5: overrides[1]: matches no tensor of this model, so it never applies (its "
            "layers 10-12; this model has 0-3)") in w
    assert ("t.yaml:10:5: overrides[3]: shadowed: each of the 4 tensor(s) it matches is decided "
            "by an earlier rule (overrides[2])") in w


def test_flags_and_yaml_give_the_same_plan():
    by_flags = plan_from_args(NAMES, L, True, 3, "Vulkan0", overrides=[("ffn_down", "CPU")],
                              kv_offload=False)
    p = plan("devices: [Vulkan0]\ngpu_layers: 3\noverrides:\n  - match: ffn_down\n"
             "    device: cpu\nkv:\n  device: cpu\n", "Vulkan0")
    assert {n: x.device for n, x in p.weights.items()} == \
        {n: x.device for n, x in by_flags.weights.items()}
    assert [k.device for k in p.kv] == [k.device for k in by_flags.kv]


def _apply_flags(flags, names, n_layer, tied):
    """llama.cpp's semantics, independently: -ot in order, then -ngl's last slots."""
    ngl = int(flags[flags.index("-ngl") + 1]) if "-ngl" in flags else 0
    ots = [flags[i + 1].rsplit("=", 1) for i, f in enumerate(flags) if f == "-ot"]
    start = n_layer + 1 - min(ngl, n_layer + 1)
    out = {}
    for n in list(names) + (["output.weight"] if tied else []):
        hit = next((d for rx, d in ots if re.search(rx, n)), None)
        if hit is not None:
            out[n] = hit
            continue
        il = int(n.split(".")[1]) if n.startswith("blk.") else (n_layer if n.startswith("output")
                                                               else -1)
        out[n] = "Vulkan0" if ngl and il >= start else CPU
    return out


@pytest.mark.parametrize("text", [
    "devices: [Vulkan0]\ngpu_layers: all\noverrides:\n  - kind: ffn\n    device: cpu\n",
    "devices: [Vulkan0]\ngpu_layers: 3\noverrides:\n  - layers: [0, 2]\n    kind: attn\n"
    "    device: cpu\n  - match: 'ffn_(up|gate)'\n    device: cpu\n",
    "devices: [Vulkan0]\ngpu_layers: 0\noverrides:\n  - kind: output\n    device: Vulkan0\n",
])
def test_llamacpp_flags_reproduce_the_plan(text):
    cfg = parse_text(text, "t.yaml")
    names = NAMES + ["output.weight"]
    p, s = plan_from_config(cfg, names, L, False, catalog=catalog("Vulkan0"))
    flags, missing = llama_flags(cfg, p, names, L, s)
    assert missing == []
    assert _apply_flags(flags, names, L, False) == {n: x.device for n, x in p.weights.items()}


def test_tied_output_rules_have_no_llamacpp_name():
    cfg = parse_text("overrides:\n  - kind: output\n    device: Vulkan0\n", "t.yaml")
    p, s = plan_from_config(cfg, NAMES, L, True, catalog=catalog("Vulkan0"))
    assert p.weights["output.weight"].device == "Vulkan0"       # the copy, on the device
    flags, missing = llama_flags(cfg, p, NAMES, L, s)
    assert flags == ["-ot", "^output_norm\\.weight$=Vulkan0"]
    assert "tied output matrix has no name of its own in llama.cpp" in missing[0]


def test_no_llamacpp_equivalent_is_listed():
    cfg = parse_text("devices: [Vulkan0]\nn_copies: 2\nop_offload: {decode: false}\n"
                     "kv:\n  ranges:\n    - layers: 0\n      type_k: q8_0\n"
                     "overrides:\n  - kind: attn\n    device: Vulkan0\n    phase: prefill\n",
                     "t.yaml")
    p, s = plan_from_config(cfg, NAMES, L, True, catalog=catalog("Vulkan0"))
    flags, missing = llama_flags(cfg, p, NAMES, L, s)
    text = "\n".join(missing)
    for what in ("per-phase placement", "op_offload per phase", "KV types per layer range",
                 "n_copies: 2"):
        assert what in text
    assert "-ot" not in flags


def test_emitted_yaml_plans_the_same():
    cfg = config_from_flags(n_gpu_layers=3, overrides=[("ffn_up", "CPU")], kv_offload=False,
                            devices=["Vulkan0"], sets=["context.n_ctx=1024"])
    p1, s1 = plan_from_config(cfg, NAMES, L, True, catalog=catalog("Vulkan0"))
    again = parse_text(cfg.to_yaml(), "emitted.yaml")
    p2, s2 = plan_from_config(again, NAMES, L, True, catalog=catalog("Vulkan0"))
    assert {n: x.device for n, x in p1.weights.items()} == \
        {n: x.device for n, x in p2.weights.items()}
    assert [k.device for k in p1.kv] == [k.device for k in p2.kv] and s2["n_ctx"] == 1024
    assert p1.weights["blk.3.ffn_up.weight"].rule == "-ot ffn_up=CPU"
    assert p2.weights["blk.3.ffn_up.weight"].rule.startswith("overrides[0] match 'ffn_up'")


def test_default_devices_only_when_layers_go_to_gpus():
    p = plan("context: {n_ctx: 64}\n", "Vulkan0")
    assert p.devices == [CPU] and p.devices_used() == [CPU]        # no GPU, not even op offload
    p = plan("gpu_layers: all\n", "Vulkan0", "Vulkan1")             # every GPU, by free memory
    assert p.devices == ["Vulkan0", "Vulkan1", CPU]
    assert p.layer_devices == ["Vulkan0"] * 3 + ["Vulkan1"] * 2
