"""Offload config files: the schema, line marks, extends, --set, and every kind of bad input with
a message naming file, line and key."""
import re
from pathlib import Path

import pytest

from pyggml.errors import ConfigError
from pyggml.offload.config import (
    SCHEMA,
    load_config,
    parse_layers,
    parse_text,
    schema_keys,
)

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def bad(tmp_path, text, *, sets=()):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p, sets)
    return str(e.value), str(p)


def test_readme_documents_every_schema_key():
    readme = (REPO / "configs" / "README.md").read_text()
    table = readme[readme.index("## Keys"):]
    missing = []
    for key in schema_keys():
        parts = re.split(r"\[\]\.|\.", key)
        leaf = parts[-1]
        # a key is documented when its leaf name appears in a row that names its parent too
        rows = [l for l in table.splitlines() if l.startswith("|") and "`" in l]
        ok = any(leaf in l and all(p in l for p in parts[:-1]) for l in rows)
        if not ok:
            missing.append(key)
    assert missing == []
    for key in SCHEMA["properties"]:
        assert SCHEMA["properties"][key].get("doc"), key


def test_values_with_lines_extends_and_set(tmp_path):
    write(tmp_path, "gpu_layers: all\ncontext:\n  n_ctx: 4096\n  n_batch: 512\n"
                    "overrides:\n  - match: x\n    device: cpu\n", "base.yaml")
    p = write(tmp_path, "# child\nextends: base.yaml\ncontext:\n  n_ctx: 8192\n"
                        "kv:\n  device: cpu\nop_offload: true\n")
    cfg = load_config(p, sets=["threads=4", "op_offload.decode=false"])
    assert cfg.get(("gpu_layers",)) == "all"                   # from the base
    assert cfg.get(("context", "n_ctx")) == 8192               # the child wins
    assert cfg.get(("context", "n_batch")) == 512              # mappings merge key by key
    assert cfg.get(("threads",)) == 4
    assert cfg.get(("op_offload",)) == {"prefill": True, "decode": False}   # a bool expanded
    w = cfg.where_of(("context", "n_ctx"))
    assert (w.file, w.line) == (str(p), 4)
    w = cfg.where_of(("overrides", 0))
    assert w.file.endswith("base.yaml") and w.line == 6
    assert str(cfg.where_of(("threads",))) == "--set threads=4"
    assert cfg.files == [str(p), str((tmp_path / "base.yaml").resolve())]


def test_set_replaces_list_items_and_adds_keys(tmp_path):
    p = write(tmp_path, "overrides:\n  - kind: ffn\n    device: cpu\n")
    cfg = load_config(p, sets=["overrides.0.device=Vulkan0", "tensor_split=[3, 1]",
                               "kv.type_k=q8_0"])
    assert cfg.get(("overrides", 0)) == {"kind": "ffn", "device": "Vulkan0"}
    assert cfg.get(("tensor_split",)) == [3, 1]
    assert cfg.get(("kv", "type_k")) == "q8_0"


def test_layers_syntax():
    assert parse_layers("all") is None
    assert parse_layers([0, "4-7", 9]) == [(0, 0), (4, 7), (9, 9)]
    assert parse_layers("3") == [(3, 3)]
    for v, why in (([0, "0-3"], "overlapping"), ("5-2", "ends before"), (-1, "negative"),
                   ("x", "not a layer")):
        with pytest.raises(ValueError, match=why):
            parse_layers(v)


def test_unknown_keys_with_did_you_mean(tmp_path):
    msg, f = bad(tmp_path, "gpu_layer: 4\noverrides:\n  - kind: ffn\n    devcie: cpu\n")
    assert f"{f}:1:1: gpu_layer: unknown key (did you mean 'gpu_layers'?)" in msg
    assert f"{f}:4:5: overrides[0].devcie: unknown key (did you mean 'device'?)" in msg
    assert f"{f}:3:5: overrides[0]: a rule needs exactly one of device, buffer_type" in msg


def test_wrong_types(tmp_path):
    msg, f = bad(tmp_path, "gpu_layers: many\nn_copies: 9\nop_offload: 'yes'\n"
                           "context:\n  n_ctx: -5\nkv:\n  type_k: q4_k\n")
    assert f"{f}:1:1: gpu_layers: expected an integer >= 0 or 'all', got 'many' (a string)" in msg
    assert f"{f}:2:1: n_copies: expected an integer in 1..4, got 9" in msg
    assert f"{f}:3:1: op_offload: expected true or false or a mapping" in msg
    assert f"{f}:5:3: context.n_ctx: expected an integer >= 0, got -5" in msg
    assert f"{f}:7:3: kv.type_k: expected 'f16' or 'f32' or 'bf16' or 'q8_0' or 'q4_0' or " \
        f"'q4_1' or 'q5_0' or 'q5_1' or 'iq4_nl', got 'q4_k'" in msg


def test_invalid_regex(tmp_path):
    msg, f = bad(tmp_path, "overrides:\n  - match: 'ffn_(up'\n    device: cpu\n")
    assert f"{f}:2:5: overrides[0].match: invalid regex 'ffn_(up'" in msg
    assert "missing )" in msg


def test_overlapping_layer_ranges(tmp_path):
    msg, f = bad(tmp_path, "overrides:\n  - layers: [0-5, 3-8]\n    device: cpu\n")
    assert f"{f}:2:5: overrides[0].layers: overlapping layer ranges 0-5 and 3-8" in msg
    msg, f = bad(tmp_path, "kv:\n  ranges:\n    - layers: 0-9\n      type_k: q8_0\n"
                           "    - layers: [12, 8-10]\n      device: cpu\n")
    assert (f"{f}:5:7: kv.ranges[1].layers: layers 8-10 overlap kv.ranges[0] (layers 0-9, "
            f"{f}:3:7)") in msg


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    msg, f = bad(tmp_path, "gpu_layers: 4\noverrides:\n  - match: [ffn\n    device: cpu\n")
    assert re.search(re.escape(f) + r":\d+:\d+: YAML syntax error", msg)
    msg, f = bad(tmp_path, "gpu_layers: 4\n  devices: x\n")
    assert f"{f}:2:10: YAML syntax error" in msg
    msg, f = bad(tmp_path, "gpu_layers: 4\ngpu_layers: 5\n")
    assert f"{f}:2:1: gpu_layers: duplicate key (first given at line 1)" in msg
    msg, f = bad(tmp_path, "- gpu_layers: 4\n")
    assert f"{f}:1:1: the config must be a mapping" in msg


def test_rules_need_a_condition_and_one_target(tmp_path):
    msg, f = bad(tmp_path, "overrides:\n  - device: cpu\n  - kind: attn\n    device: cpu\n"
                           "    buffer_type: CPU\n  - kind: [ffn, atn]\n    device: cpu\n")
    assert f"{f}:2:5: overrides[0]: a rule needs at least one of match, layers, kind" in msg
    assert f"{f}:3:5: overrides[1]: a rule needs exactly one of device, buffer_type" in msg
    assert "overrides[2].kind: unknown kind 'atn' (a string)" in msg
    assert "did you mean 'attn'" in msg


def test_extends_errors(tmp_path):
    msg, f = bad(tmp_path, "extends: nope.yaml\n")
    assert f"{f}:1:1: extends: cannot read config" in msg and "nope.yaml" in msg
    write(tmp_path, "extends: b.yaml\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(ConfigError, match=r"b\.yaml:1:1: extends: 'a\.yaml' is already being "
                                          r"read \(a cycle"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path, "gpu_layers: lots\n", "base.yaml")
    msg, f = bad(tmp_path, "extends: base.yaml\n")
    assert "base.yaml:1:1: gpu_layers: expected" in msg       # errors point into the base


def test_set_errors(tmp_path):
    p = write(tmp_path, "overrides:\n  - kind: ffn\n    device: cpu\n")
    for item, want in (("gpu_layers", "expected KEY=VALUE"),
                       ("gpu_layrs=3", "--set gpu_layrs=3: gpu_layrs: unknown key (did you mean "
                                       "'gpu_layers'?)"),
                       ("overrides.3.device=cpu", "overrides has 1 item(s), no index 3"),
                       ("context.n_ctx=[1", "the value is not valid YAML"),
                       ("overrides.0.kind.x=1", "overrides[0].kind is 'ffn' (a string), not a "
                                                "mapping"),
                       ("n_copies.x=1", "n_copies: expected an integer in 1..4, got a mapping"),
                       ("a..b=1", "is not a key path")):
        with pytest.raises(ConfigError) as e:
            load_config(p, [item])
        assert want in str(e.value), (item, str(e.value))


def test_parse_text_and_dict_sources():
    cfg = parse_text("gpu_layers: 3\n", "<emitted>")
    assert cfg.get(("gpu_layers",)) == 3 and str(cfg.where_of(("gpu_layers",))) == "<emitted>:1:1"
    with pytest.raises(ConfigError, match=r"<python>: gpu_layers: expected"):
        load_config({"gpu_layers": "x"})
    with pytest.raises(ConfigError, match=r"<python>: bogus: unknown key"):
        load_config({"bogus": 1})


def test_needs_machine_devices_reads_every_device_field():
    """Whether a plan must list this machine's devices (loading every backend module): any
    device, index or buffer type the schema's device fields name that is not the CPU or a
    virtual device, gpu_layers without devices, an rpc-server."""
    from pyggml.offload.devices import needs_machine_devices as needs
    from pyggml.offload import VirtualSpec
    cpu_only = [None, {}, {"devices": []}, {"gpu_layers": 0},
                {"kv": {"device": "cpu", "ranges": [{"layers": "0-1", "device": "CPU"}]}},
                {"overrides": [{"match": "ffn", "device": "cpu"},
                               {"match": "attn", "buffer_type": "CPU"}]},
                {"devices": ["laptop"], "gpu_layers": 4},
                {"virtual_devices": [{"name": "egpu", "memory": "1GiB"}],
                 "devices": ["egpu"], "gpu_layers": "all"}]
    machine = [{"gpu_layers": 2}, {"gpu_layers": "all"}, {"devices": ["Vulkan0"]},
               {"devices": [0]}, {"overrides": [{"match": "ffn", "device": "Vulkan0"}]},
               {"overrides": [{"match": "ffn", "buffer_type": "Vulkan0_Host"}]},
               {"kv": {"device": "Vulkan1"}},
               {"kv": {"ranges": [{"layers": "0-1", "device": "RPC[10.0.0.2:50052]"}]}},
               {"rpc": ["10.0.0.2:50052"]}, {"overrides": [{"kind": "ffn", "device": 1}]}]
    for data in cpu_only:
        cfg = None if data is None else load_config(data)
        assert not needs(cfg, [VirtualSpec("laptop", 1 << 30)]), data
    for data in machine:
        assert needs(load_config(data), [VirtualSpec("laptop", 1 << 30)]), data
