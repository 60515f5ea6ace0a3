"""LoRA adapters (pyggml/llm/lora.py) against llama.cpp with the same adapters: random-weight
base models (tools/make_arch_models.py) and adapters (tools/make_lora_refs.py) regenerated here
and checked byte for byte (sha256) against the files llama.cpp's references were made on
(tests/data/lora_refs.npz: llama-cpp-python 0.3.36, `Llama(lora_path=, lora_scale=)` and
llama_set_adapters_lora for two adapters).

Compared as tests/test_llm_archs.py compares architectures: the logit RMS error over every
position is at most 1.5 x llama.cpp's own difference between its two attention paths + 0.002,
the top-1 id is llama.cpp's wherever its top-2 margin is above the noise, and the greedy path
is llama.cpp's up to the first step whose margin is within the noise. So that the bounds mean
something, the same run without the adapter is checked to be far outside them.

Also: scale 0 is the base model bit for bit with the same graph (no node added), adapters
loaded without apply; prefix reuse never crosses a scale change; bad adapter files are one
LoraError naming the file and the key or tensor, before anything is allocated; llama-cpp-
python's lora_path / lora_scale; the CLI flags; llama-server's /lora-adapters and "lora".
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

import pyggml
from pyggml.backend import vulkan
from pyggml.cli import main as cli_main
from pyggml.llm.lora import LoraError
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_lora_refs as R  # noqa: E402

REFS = dict(np.load(ROOT / "tests" / "data" / "lora_refs.npz"))
TOKENS = [int(t) for t in REFS["tokens"]]
N_CTX = 256


def _self_diff(case):
    a = REFS[f"{case}.fa0.logits"].astype(np.float32)
    b = REFS[f"{case}.fa1.logits"].astype(np.float32)
    return float(np.sqrt(((a - b) ** 2).mean()))


BOUND = {c: 1.5 * _self_diff(c) + 0.002 for c in R.CASES}
NOISE = {c: 5.0 * _self_diff(c) + 0.01 for c in R.CASES}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    paths = R.write_models(d)
    for stem, p in paths.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == str(REFS[f"{stem}.sha256"]), (
            f"{stem}: the generator no longer writes the file the references were made on; "
            f"rerun tools/make_lora_refs.py")
    return paths


def _llm(files, case, fa=True, **kw):
    base, adapters = R.CASES[case]
    return LLM(files[base], n_ctx=N_CTX, n_threads=2, logits_all=True, flash_attn=fa,
               lora=[(files[f"lora-{a}"], s) for a, s in adapters], **kw)


def _rms(a, b):
    return float(np.sqrt(((a - b) ** 2).mean()))


@pytest.mark.parametrize("fa", [0, 1])
@pytest.mark.parametrize("case", sorted(R.CASES))
def test_logits_match_llamacpp(files, case, fa):
    ref = REFS[f"{case}.fa{fa}.logits"].astype(np.float32)
    vals, ids = REFS[f"{case}.fa{fa}.top_vals"], REFS[f"{case}.fa{fa}.top_ids"]
    with _llm(files, case, bool(fa)) as llm:
        logits = llm.eval(TOKENS)
        rms = _rms(logits, ref)
        assert rms <= BOUND[case], f"{case}: RMS {rms:.4f} > {BOUND[case]:.4f}"
        clear = vals[:, 0] - vals[:, 1] > NOISE[case]
        assert clear.mean() >= 0.4          # enough clear positions to check
        assert (logits.argmax(1)[clear] == ids[clear, 0]).all()
        # without the adapters the same model is far off: the bound can see a wrong LoRA
        llm.set_lora_scales([0.0] * len(R.CASES[case][1]))
        llm.reset()
        assert _rms(llm.eval(TOKENS), ref) > 10 * BOUND[case]


@pytest.mark.parametrize("case", sorted(R.CASES))
def test_greedy_path_matches_llamacpp(files, case):
    """llama.cpp's greedy path, fed one decoded token at a time (decode graphs, the KV cache
    growing): at every step whose top-2 margin is above the noise, pyggml's argmax is
    llama.cpp's token; where it is clear from the start, pyggml's own greedy run is the same."""
    ref, margin = REFS[f"{case}.greedy"], REFS[f"{case}.greedy_margin"]
    clear = margin > NOISE[case]
    assert clear.sum() >= 4, f"{case}: only {clear.sum()} clear greedy steps"
    with _llm(files, case, True) as llm:
        row = llm.eval(TOKENS[:R.N_PROMPT])[-1]
        for i, t in enumerate(ref):
            if clear[i]:
                assert int(np.argmax(row)) == int(t), f"{case}: greedy step {i}"
            row = llm.eval([int(t)])[-1]
        n = int(np.argmin(clear)) if not clear.all() else len(ref)
        if n:
            got = [t.id for t in llm.generate(TOKENS[:R.N_PROMPT], n, temperature=0,
                                              stop_at_eog=False)]
            assert got == [int(t) for t in ref[:n]]


vulkan_missing = vulkan.unavailable_reason()      # None, or why no device can be used


@pytest.mark.skipif(vulkan_missing is not None, reason=f"no Vulkan device: {vulkan_missing}")
@pytest.mark.parametrize("case", ["qwen3-all", "mixtral-exps"])
def test_offloaded_to_vulkan_matches_llamacpp(files, case):
    """Every layer on the GPU: the adapters' tensors stay in host memory (mapped), the
    scheduler runs their matmuls where it can; the same bound as on the CPU."""
    with _llm(files, case, True, n_gpu_layers=99, device="Vulkan0") as llm:
        assert llm.backends[0].device.name == "Vulkan0"
        logits = llm.eval(TOKENS)
    assert _rms(logits, REFS[f"{case}.fa1.logits"].astype(np.float32)) <= BOUND[case]


def test_scale_zero_is_the_base_model_bit_for_bit(files):
    base = files["qwen3"]
    with LLM(base, n_ctx=N_CTX, n_threads=2, logits_all=True) as plain:
        want = plain.eval(TOKENS)
        gp = next(iter(plain.context._graphs))[0]      # the graph of that eval
        g_plain, _, _ = plain.run.build_graph(gp)
    two = [(files["lora-qwen3-all"], 0.0), (files["lora-qwen3-attn"], 0.0)]
    with LLM(base, n_ctx=N_CTX, n_threads=2, logits_all=True, lora=two) as llm:
        assert np.array_equal(llm.eval(TOKENS), want)
        g, _, _ = llm.run.build_graph(gp, llm.context.seq_loras(0) or None)
        assert [(t.op, t.name) for t in g.nodes] == [(t.op, t.name) for t in g_plain.nodes]
        assert llm.lora_adapters[1]["scale"] == 0.0
        # the same adapters applied: more nodes, other logits
        llm.set_lora_scales([1.0, 0.0])
        llm.reset()
        assert not np.array_equal(llm.eval(TOKENS), want)
        g2, _, _ = llm.run.build_graph(gp, llm.context.seq_loras(0))
        assert len(g2.nodes) > len(g.nodes)


def test_init_without_apply_then_set_scales(files):
    case = "qwen3-all-half"
    with _llm(files, case, True, lora_init_without_apply=True) as llm:
        assert [a["scale"] for a in llm.lora_adapters] == [0.0]
        base = llm.eval(TOKENS)
        llm.set_lora_scales({0: 0.5})
        llm.reset()
        logits = llm.eval(TOKENS)
    assert _rms(logits, REFS[f"{case}.fa1.logits"].astype(np.float32)) <= BOUND[case]
    assert _rms(base, logits) > 10 * BOUND[case]


def test_prefix_reuse_never_crosses_a_scale_change(files):
    """A prompt evaluated at one scale is not reused at another (its cells would hold other
    K/V); at the same scale again it is."""
    prompt = TOKENS[:20]
    with _llm(files, "qwen3-all", True) as llm:
        fresh = {}
        for s in (1.0, 0.5):
            llm.set_lora_scales([s])
            llm.reset()
            fresh[s] = llm.create_completion(prompt, max_tokens=4, temperature=0,
                                             logprobs=1)["choices"][0]
        llm.reset()
        llm.set_lora_scales([1.0])
        llm.create_completion(prompt, max_tokens=4, temperature=0)
        before = llm.stats.n_prompt_reused
        llm.set_lora_scales([0.5])
        out = llm.create_completion(prompt, max_tokens=4, temperature=0, logprobs=1)
        assert llm.stats.n_prompt_reused == before            # nothing reused across scales
        assert out["choices"][0]["text"] == fresh[0.5]["text"]
        assert out["choices"][0]["logprobs"] == fresh[0.5]["logprobs"]
        assert llm.context.seq_lora_tag(0) == llm.context.seq_loras(0).tag
        llm.create_completion(prompt, max_tokens=4, temperature=0)
        assert llm.stats.n_prompt_reused > before             # same scale: reused


def test_per_sequence_scales_in_one_batch(files):
    """Two sequences with different scales decoded in one decode_batch give each its own
    adapter's logits (one graph per set)."""
    with _llm(files, "qwen3-all", True, n_seq_max=2) as llm:
        llm.context.set_seq_lora(1, [0.0])
        out = llm.decode_batch([(TOKENS, 0), (TOKENS, 1)], all_logits=(0, 1))
        assert _rms(out[0], REFS["qwen3-all.fa1.logits"].astype(np.float32)) \
            <= BOUND["qwen3-all"]
        llm.set_lora_scales([0.0])
        llm.reset(0)
        assert np.array_equal(out[1], llm.eval(TOKENS, 0))


def test_state_keeps_the_lora_tag(files, tmp_path):
    """A saved state (and a slot file) remembers the scales its cells were computed under, so
    that a restored prefix is reused under those scales only."""
    from pyggml.llm.state import read_state, write_state
    with _llm(files, "qwen3-all", True) as llm:
        llm.eval(TOKENS[:10])
        st = llm.save_state()
        assert st.model["lora"] == llm.context.seq_lora_tag(0) != ()
        write_state(st, tmp_path / "s.npz")
        llm.reset()
        llm.load_state(read_state(tmp_path / "s.npz"))
        assert llm.context.seq_lora_tag(0) == llm.context.seq_loras(0).tag
        assert llm.reuse_prefix(TOKENS[:12]) == 10
        llm.load_state(st)
        llm.set_lora_scales([0.5])
        assert llm.reuse_prefix(TOKENS[:12]) == 0


def test_llama_compat_lora_path(files):
    with pyggml.Llama(str(files["qwen3"]), n_ctx=N_CTX, n_threads=2, logits_all=True,
                      flash_attn=True, verbose=False, lora_path=str(files["lora-qwen3-all"]),
                      lora_scale=0.5) as llm:
        assert llm.lora_path == str(files["lora-qwen3-all"]) and llm.lora_scale == 0.5
        logits = llm.eval(TOKENS)
    assert _rms(logits, REFS["qwen3-all-half.fa1.logits"].astype(np.float32)) \
        <= BOUND["qwen3-all-half"]


# ---- bad files -----------------------------------------------------------------------------------
def _adapter(path, arch="qwen3", kind="adapter", atype="lora", tensors=None):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    if kind is not None:
        w.add_type(kind)
    if atype is not None:
        w.add_string("adapter.type", atype)
    w.add_float32("adapter.lora.alpha", 4.0)
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


GOOD = {"blk.0.attn_q.weight.lora_a": np.zeros((4, 256)),
        "blk.0.attn_q.weight.lora_b": np.zeros((256, 4))}


@pytest.mark.parametrize("what,kw,needle", [
    ("model", None, "general.type must be 'adapter'"),
    ("arch", {"arch": "llama"}, "general.architecture is 'llama'"),
    ("type", {"atype": "ia3"}, "adapter.type must be 'lora'"),
    ("unknown tensor", {"tensors": {**GOOD, "blk.9.attn_q.weight.lora_a": np.zeros((4, 256)),
                                    "blk.9.attn_q.weight.lora_b": np.zeros((256, 4))}},
     "'blk.9.attn_q.weight'"),
    ("suffix", {"tensors": {**GOOD, "blk.0.attn_q.weight.lora_c": np.zeros((4, 256))}},
     "'blk.0.attn_q.weight.lora_c'"),
    ("half", {"tensors": {"blk.0.attn_k.weight.lora_a": np.zeros((4, 256))}},
     "'blk.0.attn_k.weight.lora_b' is missing"),
    ("shape", {"tensors": {"blk.0.attn_q.weight.lora_a": np.zeros((4, 128)),
                           "blk.0.attn_q.weight.lora_b": np.zeros((256, 4))}},
     "do not fit 'blk.0.attn_q.weight'"),
    ("rank", {"tensors": {"blk.0.attn_q.weight.lora_a": np.zeros((4, 256)),
                          "blk.0.attn_q.weight.lora_b": np.zeros((256, 8))}},
     "do not fit"),
])
def test_bad_adapter_files(files, tmp_path, monkeypatch, what, kw, needle):
    from pyggml.llm import runtime
    path = files["qwen3"] if kw is None else _adapter(tmp_path / "bad.gguf", **kw)
    built = []
    monkeypatch.setattr(runtime, "build_run", lambda *a, **k: built.append(1))
    # a good adapter first: all or nothing, and nothing allocated
    with pytest.raises(LoraError) as e:
        LLM(files["qwen3"], n_ctx=N_CTX, lora=[files["lora-qwen3-all"], (path, 0.5)])
    assert str(path) in str(e.value) and needle in str(e.value), str(e.value)
    assert not built


def test_bad_lora_arguments(files):
    from pyggml.errors import ArgumentTypeError, ModelError
    with pytest.raises(ArgumentTypeError, match="lora"):
        LLM(files["qwen3"], n_ctx=N_CTX, lora=3)
    with pytest.raises(ModelError, match="finite"):
        LLM(files["qwen3"], n_ctx=N_CTX, lora=[(files["lora-qwen3-all"], float("nan"))])
    with _llm(files, "qwen3-all") as llm:
        with pytest.raises(ModelError, match="1 adapters"):
            llm.set_lora_scales([1.0, 2.0])
        with pytest.raises(ModelError, match="no such adapter"):
            llm.set_lora_scales({3: 1.0})


# ---- command line --------------------------------------------------------------------------------
def _run(capsys, *argv):
    rc = cli_main(["run", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_flags(files, capsys):
    common = ["-m", str(files["qwen3"]), "-p", "ab", "-n", "6", "--temp", "0", "-c", "256",
              "--no-warmup", "-t", "2"]
    rc, base, _ = _run(capsys, *common)
    assert rc == 0
    ad = str(files["lora-qwen3-all"])
    rc, zero, _ = _run(capsys, *common, "--lora-scaled", ad, "0")
    assert rc == 0 and zero == base
    rc, full, _ = _run(capsys, *common, "--lora", ad)
    assert rc == 0 and full != base
    rc, colon, _ = _run(capsys, *common, "--lora-scaled", f"{ad}:1.0")
    assert rc == 0 and colon == full
    rc, off, _ = _run(capsys, *common, "--lora", ad, "--lora-init-without-apply")
    assert rc == 0 and off == base
    rc, _, err = _run(capsys, *common, "--lora-scaled", f"{ad}:x")
    assert rc == 2 and err.count("\n") == 1 and "--lora-scaled" in err
    rc, _, err = _run(capsys, *common, "--lora", str(files["qwen3"]))
    assert rc == 1 and err.count("\n") == 1 and "general.type" in err
    rc, _, err = _run(capsys, *common, "--lor", ad)
    assert rc == 2 and "unknown flag '--lor'" in err


# ---- planning: pyggml plan / pyggml mem --------------------------------------------------------
def _file_tensor_bytes(path) -> int:
    from gguf import GGUFReader
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def test_plan_counts_adapters(files):
    from pyggml.planning.memory import plan_memory
    ad = files["lora-qwen3-all"]
    base = plan_memory(files["qwen3"], n_ctx=N_CTX)
    with_ad = plan_memory(files["qwen3"], n_ctx=N_CTX, lora=[(ad, 0.5)])
    n = _file_tensor_bytes(ad)
    assert n > 0 and with_ad.loras == [(str(ad), 0.5, n)] and with_ad.lora_bytes == n
    # the adapter's bytes are system RAM; the worst-case graphs apply it: no smaller a reserve
    cpu, cpu0 = with_ad.device("CPU"), base.device("CPU")
    assert cpu.weights == cpu0.weights and cpu.compute >= cpu0.compute
    assert with_ad.system_ram == base.system_ram + n + (cpu.compute - cpu0.compute)
    assert "--lora-scaled" in with_ad.llama and f"{ad}:0.5" in with_ad.llama
    assert with_ad.to_dict()["loras"] == [{"path": str(ad), "scale": 0.5, "bytes": n}]
    from pyggml.planning.fit import fit
    res = fit(files["qwen3"], {"CPU": "1GiB"}, lora=[(ad, 1.0)], max_ctx=512)
    assert res.fits and res.plan.lora_bytes == n and "LoRA adapters" in res.summary()


def test_plan_and_mem_cli_take_lora_flags(files, capsys):
    ad = str(files["lora-qwen3-all"])
    n = _file_tensor_bytes(ad)
    from pyggml.units import fmt_bytes
    assert cli_main(["plan", "-m", str(files["qwen3"]), "-c", "256", "--lora", ad]) == 0
    out = capsys.readouterr().out
    assert f"LoRA adapters: {fmt_bytes(n)}" in out and f"--lora {ad}" in out
    assert cli_main(["mem", "-m", str(files["qwen3"]), "-c", "256", "--warmup", "token",
                     "--lora-scaled", ad, "2"]) == 0
    out = capsys.readouterr().out
    assert "LoRA adapters (mapped)" in out and f"LoRA adapters {fmt_bytes(n)}" in out
    # an adapter that is not one: one line naming the file, before anything is planned
    for cmd in ("plan", "mem"):
        assert cli_main([cmd, "-m", str(files["qwen3"]), "--lora", str(files["qwen3"])]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "general.type" in err and str(files["qwen3"]) in err


# ---- server --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(files):
    from starlette.testclient import TestClient

    from pyggml.server import make_server
    llm = LLM(files["qwen3"], n_ctx=512, n_threads=2, n_seq_max=2,
              lora=[(files["lora-qwen3-all"], 1.0), (files["lora-qwen3-attn"], 0.0)])
    server = make_server(llm, 2, "tiny")
    with TestClient(server.app, base_url="http://127.0.0.1") as c:
        yield c, llm
    server.engine.stop()
    llm.close()


def _complete(c, **kw):
    r = c.post("/v1/completions", json={"prompt": TOKENS[:12], "max_tokens": 6,
                                         "temperature": 0, **kw})
    return r


def test_server_lora_adapters(client, files):
    c, llm = client
    r = c.get("/lora-adapters")
    assert r.status_code == 200
    assert [(a["id"], a["path"], a["scale"]) for a in r.json()] == [
        (0, str(files["lora-qwen3-all"]), 1.0), (1, str(files["lora-qwen3-attn"]), 0.0)]
    with_lora = _complete(c).json()["choices"][0]["text"]
    # per request: adapter 0 at 0 (not listed → 0), i.e. the base model
    no_lora = _complete(c, lora=[{"id": 1, "scale": 0}]).json()["choices"][0]["text"]
    assert no_lora != with_lora
    assert _complete(c, lora=[{"id": 0, "scale": 1.0}]).json()["choices"][0]["text"] == with_lora
    # the global scales: not listed → 0
    assert c.post("/lora-adapters", json=[{"id": 1, "scale": 0.0}]).json() == {"success": True}
    assert [a["scale"] for a in c.get("/lora-adapters").json()] == [0.0, 0.0]
    assert _complete(c).json()["choices"][0]["text"] == no_lora
    assert c.post("/lora-adapters", json=[{"id": 0, "scale": 1}]).status_code == 200
    assert _complete(c).json()["choices"][0]["text"] == with_lora
    # the same prompt at each scale in turn: never another scale's cells
    for _ in range(2):
        assert _complete(c, lora=[{"id": 0, "scale": 0}]).json()["choices"][0]["text"] == no_lora
        assert _complete(c).json()["choices"][0]["text"] == with_lora


def test_server_picks_the_slot_computed_under_the_same_scales(client):
    """Two slots holding the same prompt under different scales: a request goes to the one
    whose cells it can reuse (cached_tokens), even when the other was used less recently."""
    c, _ = client
    assert c.post("/lora-adapters", json=[{"id": 0, "scale": 1}]).status_code == 200

    def cached(**kw):
        r = _complete(c, **kw).json()
        return r["usage"]["prompt_tokens_details"]["cached_tokens"]

    off = [{"id": 0, "scale": 0}]
    cached(lora=off)                        # one slot: the prompt without LoRA
    cached()                                # the other: with it
    assert cached() == 10                   # not the less recently used no-LoRA slot
    assert cached(lora=off) == 10
    assert cached() == 10


@pytest.mark.parametrize("body,needle", [
    ([{"id": 5, "scale": 1}], "no LoRA adapter 5"), ([{"id": 0, "scale": "x"}], "finite"),
    ({"id": 0}, "array"), ([{"id": 0, "scale": 1, "x": 2}], "object")])
def test_server_lora_errors(client, body, needle):
    c, _ = client
    r = c.post("/lora-adapters", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]
    if isinstance(body, list):
        r = _complete(c, lora=body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "lora"


@pytest.mark.parametrize("cmd", ["run", "chat", "serve"])
def test_lora_flags_on_every_generating_command(cmd):
    from pyggml.cli import parser
    from pyggml.cmdline import lora_from_args
    p = parser()
    argv = [cmd, "--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf", "-0.5",
            "--lora-scaled", "d.gguf:2,e:f.gguf:0.25", "--lora-init-without-apply"]
    p._subparsers._group_actions[0].choices[cmd].check_flags(argv[1:])
    kw = lora_from_args(p.parse_args(argv))
    assert kw == {"lora": [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", -0.5), ("d.gguf", 2.0),
                           ("e:f.gguf", 0.25)], "lora_init_without_apply": True}
    with pytest.raises(pyggml.errors.UsageError, match="needs --lora"):
        lora_from_args(p.parse_args([cmd, "--lora-init-without-apply"]))
