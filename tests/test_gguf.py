"""pyggml.gguf: the real Gemma 3 file, metadata getters, the tensor table, mapped weights, every
validation error, split files, and the tiny-model fixtures."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT
from gguf.quants import dequantize

from fixtures.gguf_bytes import Raw, gguf_bytes, kv, layout, tensor
from fixtures.tiny_models import WEIGHT_TYPES, make_tiny_model, tensor_shapes
from pyggml.context import Context
from pyggml.errors import GGUFError
from pyggml.gguf import GGUFModel, TensorInfo, open_gguf, split_path
from pyggml.types import GGMLType

T = GGMLType


def write(tmp_path: Path, blob: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def good_kvs():
    return [kv("general.architecture", "llama"), kv("llama.block_count", 2),
            kv("llama.attention.layer_norm_rms_epsilon", 1e-5),
            kv("tokenizer.ggml.tokens", ["a", "b", "c"]),
            kv("tokenizer.ggml.scores", [0.0, -1.0, -2.0]),
            kv("tokenizer.ggml.add_bos_token", True)]


def good_tensors():
    return [tensor("a", T.F32, [8, 2]), tensor("b", T.Q4_0, [64, 3]),
            tensor("c", T.F16, [4]), tensor("d", T.Q4_K, [256, 2])]


def expect_error(tmp_path, blob, *needles):
    p = write(tmp_path, blob)
    with pytest.raises(GGUFError) as ei:
        open_gguf(p)
    msg = str(ei.value)
    assert str(p) in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


# ---- the real model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_path():
    from pyggml.errors import PyggmlError
    from pyggml.models_default import default_model_path, ensure_default_model
    p = default_model_path()
    if not p.exists():
        try:
            p = ensure_default_model()
        except PyggmlError as e:
            pytest.skip(str(e))
    return p


def test_gemma_opens_fast_and_mapped(gemma_path):
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    m = open_gguf(gemma_path)
    weights = m.create_tensors()
    dt = time.perf_counter() - t0
    grew = proc.memory_info().rss - rss0
    assert dt < 1.0, f"open took {dt:.3f} s"
    assert grew < 50 * 2**20, f"RSS grew by {grew / 2**20:.1f} MB on open"
    size = os.path.getsize(gemma_path)
    assert m.n_bytes > 200 * 2**20 and m.n_bytes < size
    # weights are the mapping itself: data addresses inside it, bytes equal to the file
    buf = m.parts[0].buffer
    emb = weights["token_embd.weight"]
    assert emb.buffer is buf and buf.base <= emb.data and emb.data + emb.nbytes() <= buf.base + size
    info = m.tensors["output_norm.weight"]
    t = weights["output_norm.weight"]
    with open(gemma_path, "rb") as f:
        f.seek(info.offset)
        assert ctypes.string_at(t.data, info.nbytes) == f.read(info.nbytes)


def test_gemma_metadata(gemma_path):
    m = open_gguf(gemma_path)
    assert m.version == 3 and m.alignment == 32
    assert m.arch == "gemma3"
    assert m.arch_key("context_length") == "gemma3.context_length"
    expect = {"block_count": 18, "embedding_length": 640, "feed_forward_length": 2048,
              "attention.head_count": 4, "attention.head_count_kv": 1,
              "attention.key_length": 256, "attention.value_length": 256,
              "attention.sliding_window": 512, "context_length": 32768}
    for k, v in expect.items():
        assert m.get_u32(m.arch_key(k)) == v, k
        assert m.get_u32("{arch}." + k) == v
    assert m.get_f32("{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert m.get_f32("{arch}.rope.freq_base") == 1e6
    assert m.get_f32("{arch}.rope.freq_base_swa", 10000.0) == 10000.0
    assert m.get_u32_per_layer("{arch}.feed_forward_length", 18) == [2048] * 18
    assert m.get_str("tokenizer.ggml.model") == "llama"
    assert m.get_str("general.name") == "Gemma 3 270m"
    assert [m.get_u32(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown", "padding")] \
        == [2, 1, 3, 0]
    assert m.get_bool("tokenizer.ggml.add_bos_token") is True
    assert m.get_bool("tokenizer.ggml.add_space_prefix") is False
    assert m.value_type("tokenizer.ggml.scores") == "ARRAY[FLOAT32]"
    toks = m.get_arr("tokenizer.ggml.tokens", elem="string")
    assert len(toks) == 262144 and toks[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert toks[105] == "<start_of_turn>" and toks[106] == "<end_of_turn>"
    scores = m.get_arr("tokenizer.ggml.scores", elem="float32")
    types = m.get_arr("tokenizer.ggml.token_type", elem="int32")
    assert scores.dtype == np.float32 and scores.shape == (262144,)
    assert types.dtype == np.int32 and types[0] == 3 and set(np.unique(types)) <= {1, 2, 3, 4, 5, 6}
    assert m.get("general.tags") == ["gemma3", "gemma", "google", "text-generation"]


def test_gemma_tensor_table(gemma_path):
    m = open_gguf(gemma_path)
    assert len(m.tensors) == 236
    emb = m.tensors["token_embd.weight"]
    assert emb.type == T.Q8_0 and emb.ne == (640, 262144, 1, 1) and emb.shape == (262144, 640)
    assert emb.nbytes == 640 // 32 * 34 * 262144
    assert "output.weight" not in m.tensors                      # tied embeddings
    for i in range(18):
        names = {f"blk.{i}.{n}.weight" for n in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
            "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
            "post_ffw_norm")}
        assert names <= set(m.tensors)
    assert m.tensors["blk.0.attn_q.weight"].ne[:2] == (640, 1024)
    assert m.tensors["blk.0.attn_k_norm.weight"].ne[:1] == (256,)
    assert {t.type for t in m.tensors.values()} == {T.F32, T.Q5_0, T.Q4_K, T.Q8_0, T.Q6_K}
    spans = sorted((t.offset, t.offset + t.nbytes) for t in m.tensors.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= os.path.getsize(m.path)
    norm = m.tensor_array("output_norm.weight")
    assert norm.shape == (640,) and np.isfinite(norm).all()
    q = m.tensor_array("blk.0.ffn_down.weight")               # Q6_K [2048, 640]
    assert q.dtype == np.uint8 and q.shape == (640, 2048 // 256 * 210)
    assert np.isfinite(dequantize(q[:4], m.tensors["blk.0.ffn_down.weight"].type)).all()


# ---- getters -----------------------------------------------------------------------------------

def test_getters_types_defaults_and_errors(tmp_path):
    kvs = good_kvs() + [kv("x.u8", 7, VT.UINT8), kv("x.i32neg", -5, VT.INT32),
                        kv("x.u64big", 2**40, VT.UINT64), kv("x.f64", 0.25, VT.FLOAT64),
                        kv("x.str", "héllo"), kv("x.ff", [10, 20], elem_type=VT.UINT32),
                        kv("x.bools", [True, False, True], elem_type=VT.BOOL)]
    m = open_gguf(write(tmp_path, gguf_bytes(kvs, good_tensors())))
    assert m.get_u32("llama.block_count") == 2 and m.get_u32("x.u8") == 7
    assert m.get_i32("x.i32neg") == -5 and m.get_int("x.u64big") == 2**40
    assert m.get_f32("x.f64") == 0.25 and m.get_str("x.str") == "héllo"
    assert m.get_u32("missing.key", 123) == 123 and m.get_str("missing", None) is None
    assert m.get_arr("x.bools").tolist() == [True, False, True]
    assert m.get_arr("tokenizer.ggml.tokens", raw=True) == [b"a", b"b", b"c"]
    assert m.get_u32_per_layer("x.ff", 2) == [10, 20]
    assert m.array_len("tokenizer.ggml.tokens") == 3 and m.array_len("x.ff") == 2
    assert m.array_len("missing", 0) == 0
    buf, starts, lens = m.string_spans("tokenizer.ggml.tokens")
    assert [bytes(buf[a:a + n]) for a, n in zip(starts, lens)] == [b"a", b"b", b"c"]
    with pytest.raises(GGUFError, match=r"'x.str' has type STRING, expected an array"):
        m.array_len("x.str")
    with pytest.raises(GGUFError, match=r"expected ARRAY\[STRING\]"):
        m.string_spans("x.ff")
    assert m.get_u32_per_layer("{arch}.block_count", 3) == [2, 2, 2]
    assert "x.u8" in m and "{arch}.block_count" in m and "nope" not in m
    with pytest.raises(GGUFError, match=r"required key 'llama.context_length' .* missing"):
        m.get_u32("{arch}.context_length")
    with pytest.raises(GGUFError, match=r"'x.str' has type STRING, expected uint32"):
        m.get_u32("x.str")
    with pytest.raises(GGUFError, match=r"'x.i32neg' = -5 is out of range for uint32"):
        m.get_u32("x.i32neg")
    with pytest.raises(GGUFError, match=r"'x.u64big' = 1099511627776 is out of range"):
        m.get_u32("x.u64big")
    with pytest.raises(GGUFError, match=r"has type UINT32, expected FLOAT32"):
        m.get_f32("llama.block_count")
    with pytest.raises(GGUFError, match=r"has type ARRAY\[FLOAT32\], expected ARRAY\[STRING\]"):
        m.get_arr("tokenizer.ggml.scores", elem="string")
    with pytest.raises(GGUFError, match=r"'x.ff' has 2 values, expected one per layer \(3\)"):
        m.get_u32_per_layer("x.ff", 3)
    with pytest.raises(GGUFError, match=r"has type BOOL, expected STRING"):
        m.get_str("tokenizer.ggml.add_bos_token")
    with pytest.raises(GGUFError, match="no tensor named 'zz'"):
        m.tensor_info("zz")


def test_invalid_utf8_values_error_on_access(tmp_path):
    kvs = good_kvs() + [kv("x.bad", b"ok\xff"), kv("x.badarr", [b"fine", b"\xc3"],
                                                    elem_type=VT.STRING)]
    m = open_gguf(write(tmp_path, gguf_bytes(kvs, good_tensors())))
    with pytest.raises(GGUFError, match=r"'x.bad': string is not valid UTF-8"):
        m.get_str("x.bad")
    with pytest.raises(GGUFError, match=r"'x.badarr': element 1 is not valid UTF-8"):
        m.get_arr("x.badarr")
    assert m.get_arr("x.badarr", raw=True) == [b"fine", b"\xc3"]


# ---- tensors: table, mapped Tensors, copying ---------------------------------------------------

def test_tensor_table_and_zero_copy_tensors(tmp_path):
    p = write(tmp_path, gguf_bytes(good_kvs(), good_tensors()))
    m = open_gguf(p)
    blob = p.read_bytes()
    assert list(m.tensors) == ["a", "b", "c", "d"]
    b = m.tensors["b"]
    assert isinstance(b, TensorInfo) and b.type == T.Q4_0 and b.ne == (64, 3, 1, 1)
    assert b.n_dims == 2 and b.nbytes == 2 * 18 * 3 and b.shape == (3, 64)
    assert m.tensors["c"].ne == (4, 1, 1, 1) and m.tensors["c"].n_dims == 1
    assert all(t.offset % 32 == 0 for t in m.tensors.values())
    ctx = Context(no_alloc=True)
    ts = m.create_tensors(ctx)
    assert len(ctx) == 4 and ctx.get_tensor("d") is ts["d"]
    for name, t in ts.items():
        info = m.tensors[name]
        assert t.type == info.type and t.ne == info.ne and t.nbytes() == info.nbytes
        assert t.data == t.buffer.base + info.offset
        assert ctypes.string_at(t.data, info.nbytes) == blob[info.offset:info.offset + info.nbytes]
    assert m.tensor_array("a").shape == (2, 8) and m.tensor_array("a").dtype == np.float32
    with pytest.raises(ValueError, match="no_alloc=True"):
        m.create_tensors(Context(mem_size=1 << 20, no_alloc=False))
    # the tensors keep the mapping alive after the model object is gone
    del m
    import gc
    gc.collect()
    info_a = blob.index(ctypes.string_at(ts["a"].data, 64))
    assert info_a > 0


def test_copy_tensors_to_quiet_and_with_progress(tmp_path, capsys):
    p = write(tmp_path, gguf_bytes(good_kvs(), good_tensors()))
    m = open_gguf(p)
    got = {}
    n = m.copy_tensors_to(lambda info, src: got.__setitem__(info.name, src.tobytes()),
                          progress=False)
    assert n == sum(t.nbytes for t in m.tensors.values())
    blob = p.read_bytes()
    assert got == {k: blob[t.offset:t.offset + t.nbytes] for k, t in m.tensors.items()}
    assert capsys.readouterr().err == ""
    order = []
    m.copy_tensors_to(lambda info, src: order.append(info.name), names=["d", "a"], progress=True)
    assert order == ["a", "d"]                                # file order
    assert "loading weights" in capsys.readouterr().err


# ---- validation errors -------------------------------------------------------------------------

def test_error_missing_file_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        open_gguf(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="not a regular file"):
        open_gguf(tmp_path)


def test_error_header(tmp_path):
    good = gguf_bytes(good_kvs(), good_tensors())
    expect_error(tmp_path, b"", "0 bytes is too short")
    expect_error(tmp_path, good[:20], "20 bytes is too short")
    expect_error(tmp_path, b"GGML" + good[4:], "bad magic b'GGML'")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), version=1), "version 1")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), version=4), "version 4")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), version=3 << 24), "big-endian")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), n_kv=2**62),
                 f"n_kv = {2**62}")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), n_kv=2**64 - 1),
                 f"n_kv = {2**64 - 1}")
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors(), n_tensors=10**9),
                 "n_tensors = 1000000000")


def test_error_key_values(tmp_path):
    t = good_tensors()
    expect_error(tmp_path, gguf_bytes(good_kvs() + [kv("x", 1, vtype=13)], t),
                 "key 'x'", "unknown value type 13")
    expect_error(tmp_path, gguf_bytes([kv("x", [Raw(struct.pack("<IQI", VT.UINT32, 1, 7))],
                                          elem_type=VT.ARRAY)], t),
                 "key 'x'", "nested arrays")
    expect_error(tmp_path, gguf_bytes([kv("x", [1], elem_type=99)], t),
                 "key 'x'", "unknown array element type 99")
    expect_error(tmp_path, gguf_bytes(good_kvs() + [kv("llama.block_count", 3)], t),
                 "key 'llama.block_count'", "duplicate key")
    expect_error(tmp_path, gguf_bytes([kv("", 1)], t), "empty key")
    expect_error(tmp_path, gguf_bytes([kv(b"k\xfe", 1)], t), "key is not valid UTF-8")
    expect_error(tmp_path, gguf_bytes([kv("x", [1, 2], elem_type=VT.UINT64, count=2**61)], t),
                 "key 'x'", f"array of {2**61} UINT64")
    expect_error(tmp_path, gguf_bytes([kv("x", ["a", "b"], elem_type=VT.STRING, count=50)], t),
                 "key 'x'", "string #")
    # a string whose length runs past the end
    blob = bytearray(gguf_bytes([kv("x", "abc")], t))
    i = blob.index(b"abc") - 8
    blob[i:i + 8] = struct.pack("<Q", 2**40)
    expect_error(tmp_path, bytes(blob), "key 'x'", "truncated")


def test_error_alignment_key(tmp_path):
    t = good_tensors()
    expect_error(tmp_path, gguf_bytes([kv("general.alignment", 32, VT.UINT64)], t),
                 "general.alignment", "type UINT64, expected UINT32")
    expect_error(tmp_path, gguf_bytes([kv("general.alignment", 48)], t, alignment=48),
                 "general.alignment", "= 48, expected a power of two")
    expect_error(tmp_path, gguf_bytes([kv("general.alignment", 0)], t), "= 0")
    m = open_gguf(write(tmp_path, gguf_bytes([kv("general.alignment", 64)], t, alignment=64)))
    assert m.alignment == 64 and all(x.offset % 64 == 0 for x in m.tensors.values())


def test_error_tensor_infos(tmp_path):
    k = good_kvs()
    expect_error(tmp_path, gguf_bytes(k, [tensor("x" * 64, T.F32, [4])]), "name length 64")
    expect_error(tmp_path, gguf_bytes(k, [tensor(b"\xff\xfe", T.F32, [4])]),
                 "tensor name is not valid UTF-8")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.F32, [2, 2, 2, 2, 2])]),
                 "tensor 'w'", "n_dims = 5, at most 4")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.F32, [4], n_dims=2**31)]),
                 "tensor 'w'", f"n_dims = {2**31}")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", 4, [32], data=b"\0" * 32)]),
                 "tensor 'w'", "unknown tensor type id 4")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", 1234, [32], data=b"\0" * 32)]),
                 "unknown tensor type id 1234")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.Q4_0, [48, 2], data=b"\0" * 64)]),
                 "tensor 'w'", "type Q4_0: ne[0] = 48 is not a multiple of the block size 32")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.F32, [-1, 2], data=b"")]),
                 "tensor 'w'", "ne[0] = 18446744073709551615 is negative")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.F32, [2**32, 2**32], data=b"")]),
                 "tensor 'w'", "overflows int64")
    expect_error(tmp_path, gguf_bytes(k, [tensor("w", T.F32, [2**20, 2**20], data=b"")]),
                 "tensor 'w'", "runs past the end of the file")
    expect_error(tmp_path, gguf_bytes(k, [tensor("a", T.F32, [8]),
                                          tensor("w", T.F32, [8], offset=16)]),
                 "tensor 'w'", "data offset 16 is not a multiple of the alignment 32")
    expect_error(tmp_path, gguf_bytes(k, [tensor("a", T.F32, [8]), tensor("a", T.F32, [8])]),
                 "tensor 'a'", "duplicate tensor name")
    expect_error(tmp_path, gguf_bytes(k, [tensor("a", T.F32, [16]),
                                          tensor("b", T.F32, [16], offset=32)]),
                 "tensor 'b'", "overlaps tensor 'a'")
    # offset past the end / data cut short
    expect_error(tmp_path, gguf_bytes(k, [tensor("a", T.F32, [8], offset=2**40, data=b"")]),
                 "tensor 'a'", "runs past the end")
    full = gguf_bytes(k, good_tensors())
    m = open_gguf(write(tmp_path, full))
    last = max(m.tensors.values(), key=lambda t: t.offset)
    expect_error(tmp_path, full[:last.offset + last.nbytes - 1], f"tensor '{last.name}'",
                 "runs past the end")
    expect_error(tmp_path, full[:m.tensors["a"].offset - 4], "past the end")


def test_zero_tensors_and_zero_size_tensors_are_fine(tmp_path):
    m = open_gguf(write(tmp_path, gguf_bytes(good_kvs(), [])))
    assert m.tensors == {} and m.get_u32("llama.block_count") == 2
    m = open_gguf(write(tmp_path, gguf_bytes(good_kvs(), [tensor("e", T.F32, [0, 4]),
                                                          tensor("f", T.F32, [4])])))
    assert m.tensors["e"].nbytes == 0 and m.tensors["f"].nbytes == 16


def test_v2_files_open(tmp_path):
    m = open_gguf(write(tmp_path, gguf_bytes(good_kvs(), good_tensors(), version=2)))
    assert m.version == 2 and len(m.tensors) == 4


# ---- split files ----------------------------------------------------------------------------------

@pytest.fixture
def split_model(tmp_path):
    tm = make_tiny_model(tmp_path / "s" / "tiny.gguf", "llama", "q8_0", split_max_tensors=7)
    whole = make_tiny_model(tmp_path / "w" / "tiny.gguf", "llama", "q8_0")
    return tm, whole


def test_split_opens_as_one_model(split_model):
    tm, whole = split_model
    assert len(tm.paths) == 3 and tm.path.name == "tiny-00001-of-00003.gguf"
    m = open_gguf(tm.path)
    w = open_gguf(whole.path)
    assert m.paths == tm.paths and len(m.parts) == 3
    assert list(m.tensors) == list(w.tensors)
    assert {t.part for t in m.tensors.values()} == {0, 1, 2}
    assert m.get_u32("{arch}.block_count") == 2 and m.arch == "llama"
    assert m.get_arr("tokenizer.ggml.tokens") == w.get_arr("tokenizer.ggml.tokens")
    ts = m.create_tensors()
    for name, info in m.tensors.items():
        assert m.tensor_bytes(name).tobytes() == w.tensor_bytes(name).tobytes()
        assert ts[name].buffer is m.parts[info.part].buffer
        assert ctypes.string_at(ts[name].data, 16) == w.tensor_bytes(name)[:16].tobytes()
    got = {}
    m.copy_tensors_to(lambda info, src: got.__setitem__(info.name, src.tobytes()), progress=False)
    assert got.keys() == m.tensors.keys()


def test_split_errors(split_model, tmp_path):
    tm, _ = split_model
    p1, p2, p3 = tm.paths
    with pytest.raises(GGUFError, match=r"part 2 of a 3-part split model .* open the first part"):
        open_gguf(p2)
    saved = p3.read_bytes()
    p3.unlink()
    with pytest.raises(GGUFError, match=r"split part 3 of 3 is missing: .*tiny-00003-of-00003"):
        open_gguf(p1)
    p3.write_bytes(p2.read_bytes())                           # part 2 where part 3 belongs
    with pytest.raises(GGUFError, match=r"00003-of-00003.gguf: expected split.no = 2 .* found 1"):
        open_gguf(p1)
    p3.write_bytes(saved)
    other = tmp_path / "renamed.gguf"
    shutil.copy(p1, other)
    with pytest.raises(GGUFError, match="split.count = 3 but the name does not follow"):
        open_gguf(other)
    # split.tensors.count disagreeing with the parts
    lay = layout(p1)
    f = next(x for x in lay.of_kind("value") if x.owner == "split.tensors.count")
    blob = bytearray(p1.read_bytes())
    blob[f.offset:f.offset + 4] = struct.pack("<i", 99)
    p1.write_bytes(bytes(blob))
    with pytest.raises(GGUFError, match=r"split.tensors.count = 99 but the 3 parts hold 21"):
        open_gguf(p1)


def test_split_path_names():
    assert split_path("/x/m", 0, 3) == Path("/x/m-00001-of-00003.gguf")
    assert split_path("m", 11, 12).name == "m-00012-of-00012.gguf"


# ---- the tiny-model fixtures --------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_tiny_models_round_trip(tiny_models, arch, wtype):
    k_quant = wtype in ("q4_k", "q6_k")
    kw = dict(n_embd=256, n_ff=512, n_head=2) if k_quant else {}
    tm = tiny_models.get(arch=arch, weight_type=wtype, **kw)
    hp = tm.hparams
    m = open_gguf(tm)
    assert m.arch == arch
    for key, val in tm.metadata.items():
        got = m.get(key)
        if isinstance(val, float):
            assert got == pytest.approx(val, rel=1e-6), key
        elif isinstance(val, list) and val and isinstance(val[0], float):
            assert np.allclose(got, val), key
        else:
            assert got == val, key
    assert m.get_u32("{arch}.embedding_length") == hp.n_embd
    assert m.get_u32("{arch}.block_count") == hp.n_layer
    assert len(m.get_arr("tokenizer.ggml.tokens")) == hp.n_vocab
    types = m.get_arr("tokenizer.ggml.token_type")
    assert {3, 6, 1} <= set(types.tolist()) and (types == 6).sum() == 256
    toks = m.get_arr("tokenizer.ggml.tokens")
    assert toks[types.tolist().index(6)] == "<0x00>" and "\u2581the" in toks
    shapes = tensor_shapes(hp)
    assert list(m.tensors) == list(shapes)
    assert ("output.weight" in m.tensors) == (not hp.tied_embeddings)
    for name, ne in shapes.items():
        info = m.tensors[name]
        assert info.ne[:len(ne)] == ne and info.type == int(tm.tensor_types[name]), name
        x = dequantize(m.tensor_array(name), tm.tensor_types[name]).reshape(info.shape)
        assert np.array_equal(x, tm.weights[name]), name
    if wtype != "f32":
        assert tm.tensor_types["blk.0.attn_q.weight"].name.lower() == wtype
    assert tm.tensor_types["output_norm.weight"] == T.F32


def test_tiny_model_quantization_is_close_to_the_floats(tmp_path):
    """K-quant fixtures hold real approximations (the packing is checked by dequantize)."""
    from fixtures.tiny_models import quantize_q4_k, quantize_q6_k
    from gguf import GGMLQuantizationType as QT
    x = np.random.default_rng(3).standard_normal((4, 512)).astype(np.float32)
    for f, qt, tol in ((quantize_q4_k, QT.Q4_K, 0.11), (quantize_q6_k, QT.Q6_K, 0.03)):
        y = dequantize(f(x), qt)
        assert np.sqrt(np.mean((y - x) ** 2)) < tol, qt.name


def test_tiny_model_fallback_types_and_alignment(tmp_path):
    tm = make_tiny_model(tmp_path / "f.gguf", "gemma3", "q4_k", alignment=64,
                         type_overrides={"token_embd.weight": "f16"})
    assert tm.tensor_types["blk.0.attn_q.weight"].name == "Q5_0"      # ne[0]=64: q4_k -> q5_0
    assert tm.tensor_types["token_embd.weight"].name == "F16"
    m = open_gguf(tm)
    assert m.alignment == 64 and m.get_u32("general.alignment") == 64
    assert all(t.offset % 64 == 0 for t in m.tensors.values())
    assert isinstance(m, GGUFModel)


# ---- hostile sizes: allocations stay bounded by the file size --------------------------------------

def test_huge_string_array_count_in_a_big_zero_file(tmp_path):
    """1M zero-length strings fill an 8 MB zero tail exactly: a valid (odd) file; counting them
    must stay fast and allocate about the file's size, no more."""
    import resource
    n = 1 << 20
    head = gguf_bytes([kv("general.architecture", "llama"),
                       kv("x", ["a"], elem_type=VT.STRING, count=n)])
    blob = head[:-9] + b"\0" * (8 * n)            # drop the one written string, zero lengths
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    m = open_gguf(write(tmp_path, blob))
    assert time.perf_counter() - t0 < 5.0
    assert m.value_type("x") == "ARRAY[STRING]" and m.kv["x"].count == n
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    assert grew < 64 * 2**20, f"peak RSS grew {grew / 2**20:.0f} MB for an 8 MB file"
    # one more string than fits: an error naming the key, before any big allocation
    expect_error(tmp_path, head[:-9] + b"\0" * (8 * n - 8), "key 'x'", f"array of {n} STRING")


def test_reader_exceptions_become_gguf_errors(tmp_path, monkeypatch):
    import pyggml.gguf as G

    def boom(self, offs):
        raise IndexError("index 0 is out of bounds")

    monkeypatch.setattr(G._SafeReader, "_get_tensor_info_field", boom)
    expect_error(tmp_path, gguf_bytes(good_kvs(), good_tensors()),
                 "tensor 'a'", "unreadable (IndexError: index 0 is out of bounds)")
