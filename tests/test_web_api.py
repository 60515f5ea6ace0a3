"""The web page's JSON endpoints without a browser (pyggml/server/webapi.py): GET/POST
/v1/pyggml/plan against `pyggml mem` (the same bytes for the same settings, virtual GPUs
included), the per-layer table and the compute-buffer timeline against the planner's own
report, /v1/pyggml/live against the engine, the page's files and the API key. SmolLM2 on
loopback servers; every request is bounded in time."""
import json
import threading
import time

import httpx
import pytest

from pyggml.cli import main
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.offload import VirtualSpec
from pyggml.planning.memory import Planner
from pyggml.server import make_server, start_in_thread
from pyggml.server.engine import PerSecond
from support.http_server import TWO_VIRTUAL_GPUS as TWO_GPUS

REPO = __import__("pathlib").Path(__file__).resolve().parent.parent
T = 60                          # seconds, any request
CAUSES = ("usr", "1.dst", "1.vsrc", "1.inp", "1.wgt", "1.off", "2.gd", "2.gu", "2.rd", "2.ru",
          "3.upg", "3.best", "4.vsrc", "4.cur", "4.sup", "4.leaf", "4.cpy")
DEVICE_FIELDS = ("weights", "weights_by_type", "kv", "compute", "compute_naive",
                 "compute_no_inplace", "compute_lower_bound", "staging", "total", "kind",
                 "experts", "virtual")


@pytest.fixture(scope="module")
def smol():
    return str(ensure_smollm2())


@pytest.fixture(scope="module")
def server(smol):
    # one slot and mem's sizes, so that the running plan is what `pyggml mem` plans
    llm = LLM(smol, n_ctx=2048, n_ubatch=512, n_threads=2, n_seq_max=1)
    rs = start_in_thread(make_server(llm, 1, "smollm2", queue_size=4))
    yield f"http://127.0.0.1:{rs.port}", llm, rs
    rs.stop()
    llm.close()


def mem_plan(tmp_path, smol, args) -> dict:
    out = tmp_path / "mem.json"
    assert main(["mem", "-m", smol] + args + ["--json", str(out)]) == 0
    return json.loads(out.read_text())


def same_devices(page: dict, mem: dict, llama: bool = True) -> None:
    got = {d["device"]: d for d in page["mem"]["plan"]["devices"]}
    want = {d["device"]: d for d in mem["plan"]["devices"]}
    assert list(got) == list(want)
    for name, d in want.items():
        for f in DEVICE_FIELDS:
            assert got[name][f] == d[f], (name, f)
        if name != "CPU":                        # the CPU's free memory moves between reads
            assert got[name]["memory"] == d["memory"], name
    for k in ("n_ctx", "n_ubatch", "type_k", "type_v", "kv_layers", "system_ram") + \
            (("llama", "llama_missing") if llama else ()):
        assert page["mem"]["plan"][k] == mem["plan"][k], k


def test_running_plan_is_the_runs_own_and_what_pyggml_mem_plans(server, smol, tmp_path):
    base, llm, _ = server
    p = httpx.get(f"{base}/v1/pyggml/plan", timeout=T).json()
    assert p["object"] == "pyggml.plan" and p["source"] == {"kind": "running"}
    cpu = p["mem"]["plan"]["devices"][0]
    assert cpu["device"] == "CPU"
    assert cpu["kv"] == llm.kv.n_bytes and cpu["compute"] == llm.compute_buffer_size("CPU")
    # (the served run's llama.cpp flags are not known: it keeps its offload plan, not the
    # command line that made it)
    same_devices(p, mem_plan(tmp_path, smol, ["--plan-only", "-c", "2048", "-ub", "512"]),
                 llama=False)
    m = p["model"]
    assert (m["arch"], m["n_layer"], m["n_ctx_train"]) == ("llama", 30, 8192)
    assert m["n_tensors"] == len(llm.model.tensors)
    assert sum(q["bytes"] for q in m["quant_mix"].values()) == m["weight_bytes"]
    assert list(m["quant_mix"])[0] == "q4_1"
    # cached: the second answer is the same object, made once
    assert httpx.get(f"{base}/v1/pyggml/plan", timeout=T).json() == p


def test_what_if_plans_equal_pyggml_mem_on_virtual_gpus(server, smol, tmp_path):
    base, _, _ = server
    args = ["-ngl", "99", "--virtual-device", "laptop=256MiB", "-c", "1024", "-ub", "128"]
    r = httpx.post(f"{base}/v1/pyggml/plan", json={"args": " ".join(args)}, timeout=T)
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["source"]["kind"] == "what-if" and p["source"]["args"] == args
    same_devices(p, mem_plan(tmp_path, smol, args))
    assert p["mem"]["plan"]["devices"][0]["memory"] == [256 << 20, 256 << 20]
    # a config with two planning-only GPUs: sent as text, as a file for pyggml mem
    cfg = tmp_path / "two.yaml"
    cfg.write_text(TWO_GPUS)
    p2 = httpx.post(f"{base}/v1/pyggml/plan", json={"config": TWO_GPUS}, timeout=T).json()
    same_devices(p2, mem_plan(tmp_path, smol, ["-c", str(cfg)]))
    assert [d["device"] for d in p2["mem"]["plan"]["devices"]] == ["laptop", "egpu", "CPU"]
    # flags amend the config as on the command line
    p3 = httpx.post(f"{base}/v1/pyggml/plan", json={"config": TWO_GPUS, "args": ["-nkvo"]},
                    timeout=T).json()
    same_devices(p3, mem_plan(tmp_path, smol, ["-c", str(cfg), "-nkvo"]))
    assert all(x["device"] == "CPU" for x in p3["mem"]["plan"]["kv_layers"])


def test_layers_and_timeline_agree_with_the_planner(server, smol):
    base, _, _ = server
    args = ["-ngl", "12", "--virtual-device", "gpu=1GiB", "-c", "1024", "-ub", "256"]
    p = httpx.post(f"{base}/v1/pyggml/plan", json={"args": args}, timeout=T).json()
    with Planner(smol, virtual=[VirtualSpec("gpu", 1 << 30)]) as planner:
        rp = planner.plan(n_gpu_layers=12, gpu_device="gpu", n_ctx=1024, n_ubatch=256,
                          with_nodes=True)
    n_layer = rp.facts["n_layer"]
    layers = {r["layer"]: r for r in p["layers"]}
    assert set(layers) == set(range(-1, n_layer + 1))
    # every weight once, with its placed bytes; the last 12 layers on the GPU by -ngl
    names = [t for r in p["layers"] for w in r["weights"] for t in w["tensors"]]
    assert len(names) == len(rp.tensor_bytes)
    assert sum(w["bytes"] for r in p["layers"] for w in r["weights"]) == \
        sum(d["weights"] for d in p["mem"]["plan"]["devices"])
    on_gpu = 0
    for il in range(n_layer):
        (w,) = layers[il]["weights"]
        want = rp.offload.weights[f"blk.{il}.attn_q.weight"]
        assert (w["device"], w["rule"]) == (want.device, want.rule)
        assert w["rule"] == ("-ngl 12" if w["device"] == "gpu" else "default: CPU")
        on_gpu += w["device"] == "gpu"
        assert on_gpu == 0 or w["device"] == "gpu"          # the last layers
        assert layers[il]["kv"]["bytes"] == rp.kv_layers[il].bytes
        assert layers[il]["kv"]["device"] == rp.offload.kv[il].device
    assert on_gpu in (11, 12)                    # llama.cpp's -ngl counts the output layer
    assert layers[-1]["weights"][0]["tensors"] == ["token_embd"]
    # ops: every non-view node of the worst-case graph once, with a scheduler cause
    nodes = [n for n in rp.nodes["prefill"] if not n.view]
    ops = [o for r in p["layers"] for o in r["ops"]["prefill"]]
    assert sum(o["n"] for o in ops) == len(nodes)
    assert all(o["cause"].startswith(CAUSES) for o in ops)
    assert any(o["device"] == "gpu" and o["cause"].startswith("1.wgt")
               for o in layers[n_layer - 1]["ops"]["prefill"])
    # the timeline is the allocator's report
    rep = rp.reports["prefill"]
    bufs = {b["name"]: b for b in p["timeline"]["prefill"]["buffers"]}
    assert p["timeline"]["prefill"]["n_nodes"] == rep.n_nodes
    for b in rep.buffers:
        if b.shares is None and b.peak:
            j = bufs[b.name]
            assert j["live_bytes"] == b.live_bytes and len(j["live_bytes"]) == rep.n_nodes + 1
            assert j["peak"] == b.peak >= j["max_live"] == max(b.live_bytes)
            assert j["live_bytes"][j["peak_node"] + 1] == j["max_live"]
            at = j["peak_node"]
            assert j["peak_node_name"] == next(t.name for t in rep.tensors
                                               if t.role == "node" and t.index == at)
            assert p["timeline"]["prefill"]["node_names"][at] == j["peak_node_name"]
            assert sum(x["size"] for x in j["at_peak"]) <= j["at_peak_bytes"] <= j["max_live"]
            assert j["at_peak"] == sorted(j["at_peak"], key=lambda x: -x["size"])
    assert bufs["gpu"]["peak"] == p["mem"]["plan"]["devices"][0]["compute"]


@pytest.mark.parametrize("body, param, words", [
    ({"args": "-m other.gguf"}, "args", "the model is the one being served"),
    ({"args": ["--rpc", "10.0.0.1:50052"]}, "args",
     "rpc-server 10.0.0.1:50052: this server is not connected to it (connected: "),
    ({"config": "rpc: ['10.0.0.1:50052']\n"}, "config", "10.0.0.1:50052: this server is not"),
    ({"args": "--rpc nohost"}, "args", "'nohost'"),
    ({"args": "-c /etc/pyggml.yaml"}, "args", "send the config as text"),
    ({"args": "--no-such-flag"}, "args", "--no-such-flag"),
    ({"args": "-ngl x"}, "args", "-ngl"),
    ({"args": 7}, "args", "a string or a list of strings"),
    ({"args": "'unclosed"}, "args", "quotation"),
    ({"config": "extends: base.yaml\n"}, "config", "extends"),
    ({"config": "gpu_layers: [1\n"}, "config", "not valid YAML"),
    ({"config": "gpu_layerz: 3\n"}, "config", "gpu_layerz"),
    ({"config": 5}, "config", "YAML text"),
    ({"args": "-ngl 99 -dev nosuchgpu"}, "args", "nosuchgpu"),
])
def test_what_if_errors_are_400_naming_the_problem(server, body, param, words):
    base, _, _ = server
    r = httpx.post(f"{base}/v1/pyggml/plan", json=body, timeout=T)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"] == param
    assert httpx.get(f"{base}/health", timeout=T).status_code == 200


def test_live_follows_the_engine(server):
    base, llm, rs = server
    L = httpx.get(f"{base}/v1/pyggml/live", timeout=T).json()
    assert L["object"] == "pyggml.live" and L["slots_total"] == 1 and L["kv_cells_total"] == 2048
    assert len(L["tokens_per_second"]["generated"]) == L["tokens_per_second"]["window_s"] == 60
    before = L["totals"]["generated_tokens"]
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(httpx.get(f"{base}/v1/pyggml/live", timeout=T).json())
            time.sleep(0.05)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = httpx.post(f"{base}/v1/completions", timeout=T, json={
            "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
            "ignore_eos": True}).json()
    finally:
        stop.set()
        t.join(T)
    assert r["usage"]["completion_tokens"] == 40
    busy = [x for x in seen if x["slots_busy"] == 1]
    assert busy and all(x["slots"][0]["state"] in ("prompt", "generating") for x in busy)
    assert any(x["slots"][0]["state"] == "generating" and x["slots"][0]["generated"] > 0
               for x in busy)
    after = httpx.get(f"{base}/v1/pyggml/live", timeout=T).json()
    assert after["totals"]["generated_tokens"] == before + 40
    # the window saw those tokens (they fell in the last minute)
    assert sum(after["tokens_per_second"]["generated"]) >= 40
    assert sum(after["tokens_per_second"]["prompt"]) >= 1
    sl = after["slots"][0]
    assert sl["state"] == "idle" and sl["kv_cells"] == len(llm.seq_tokens(0)) > 40


def test_per_second_window():
    now = [1000.3]
    w = PerSecond(4, clock=lambda: now[0])
    w.add(3)
    now[0] = 1001.9
    w.add(2)
    w.add(1)
    assert w.last() == [0, 0, 3, 3]
    now[0] = 1003.0
    assert w.last() == [3, 3, 0, 0]              # seconds without tokens count 0
    now[0] = 1100.0
    assert w.last() == [0, 0, 0, 0]              # a long gap clears everything


def test_page_files_and_the_api_key(smol, server):
    base, llm, rs = server
    r = httpx.get(f"{base}/", timeout=T)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="/web/app.js"' in r.text and "http" not in r.text.split("<body>")[0]
    sizes = {}
    for name, kind in (("app.js", "javascript"), ("app.css", "text/css")):
        a = httpx.get(f"{base}/web/{name}", timeout=T)
        assert a.status_code == 200 and kind in a.headers["content-type"]
        sizes[name] = len(a.content)
    assert sum(sizes.values()) + len(r.content) < 300_000
    assert httpx.get(f"{base}/web/index.html", timeout=T).status_code == 404
    assert httpx.get(f"{base}/web/../app.py", timeout=T).status_code == 404
    # with a key: the page and its files load without it, the JSON needs it
    server_obj = rs.server
    server_obj.api_key = "sesame"
    try:
        assert httpx.get(f"{base}/", timeout=T).status_code == 200
        assert httpx.get(f"{base}/web/app.js", timeout=T).status_code == 200
        for path in ("/v1/pyggml/plan", "/v1/pyggml/live", "/v1/models"):
            assert httpx.get(f"{base}{path}", timeout=T).status_code == 401, path
            ok = httpx.get(f"{base}{path}", timeout=T,
                           headers={"Authorization": "Bearer sesame"})
            assert ok.status_code == 200, path
        assert httpx.post(f"{base}/v1/pyggml/plan", json={"args": "-c 512"},
                          timeout=T).status_code == 401
    finally:
        server_obj.api_key = None


def test_the_page_ships_in_the_package():
    from importlib.resources import files
    web = files("pyggml.server") / "web"
    for name in ("index.html", "app.js", "app.css"):
        assert (web / name).is_file(), name
    text = "".join((web / n).read_text() for n in ("index.html", "app.js", "app.css"))
    for remote in ("cdn.", "googleapis", "unpkg", "jsdelivr", "@import url(http"):
        assert remote not in text


def test_a_cpu_only_servers_plan_loads_no_gpu_driver(smol):
    from support.serve_process import ServeProcess
    with ServeProcess(["-m", smol, "-np", "1", "-c", "512", "-t", "2"]) as srv:
        p = httpx.get(f"{srv.base}/v1/pyggml/plan", timeout=T).json()
        assert [d["device"] for d in p["mem"]["plan"]["devices"]] == ["CPU"]
        maps = open(f"/proc/{srv.proc.pid}/maps").read()
        assert "libvulkan" not in maps            # planning listed no device but the CPU


def test_what_if_plans_beyond_the_waiting_bound_get_503(server):
    base, _, _ = server
    bodies = [{"args": f"-c {512 + 64 * k} -ub 64"} for k in range(12)]   # all different
    codes: list[int] = []

    def post(b):
        codes.append(httpx.post(f"{base}/v1/pyggml/plan", json=b, timeout=T).status_code)
    threads = [threading.Thread(target=post, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    assert len(codes) == 12 and set(codes) <= {200, 503}
    assert codes.count(200) >= 1 and codes.count(503) >= 1
    assert httpx.post(f"{base}/v1/pyggml/plan", json=bodies[0], timeout=T).status_code == 200


def test_a_config_with_phase_rules_gives_both_phases(server, smol, tmp_path):
    # the repository's example: attention on a GPU for prompts only, decode on the CPU; planned
    # against a planning-only Vulkan0 of 1 GiB
    base, _, _ = server
    text = (REPO / "configs" / "prefill-on-gpu-decode-on-cpu.yaml").read_text()
    text += "virtual_devices:\n  - {name: Vulkan0, memory: 1GiB}\n"
    r = httpx.post(f"{base}/v1/pyggml/plan", json={"config": text, "args": "-c 1024"},
                   timeout=T)
    assert r.status_code == 200, r.text
    p = r.json()
    cfg = tmp_path / "phases.yaml"
    cfg.write_text(text)
    mem = mem_plan(tmp_path, smol, ["-c", str(cfg), "-c", "1024"])
    # the rules name where they come from: the file there, the request here
    mem["plan"]["llama_missing"] = [x.replace(str(cfg), "<request config>")
                                    for x in mem["plan"]["llama_missing"]]
    same_devices(p, mem)
    assert set(p["timeline"]) == {"prefill", "decode"}
    rows = {r["layer"]: r for r in p["layers"]}
    prefill = {o["device"] for o in rows[3]["ops"]["prefill"]}
    decode = {o["device"] for o in rows[3]["ops"]["decode"]}
    assert "Vulkan0" in prefill and decode == {"CPU"}
    assert rows[3]["weights"][0]["device"] == "CPU"          # the weights stay in host memory


def test_a_plan_that_does_not_fit_lists_the_changes_pyggml_plan_suggests(server, smol, capsys):
    from pyggml.units import fmt_bytes
    base, _, _ = server
    args = ["-ngl", "99", "--virtual-device", "laptop=128MiB", "-c", "4096"]
    p = httpx.post(f"{base}/v1/pyggml/plan", json={"args": args}, timeout=T).json()
    assert p["not_fitting"] == ["laptop"] and p["fit_changes"]
    capsys.readouterr()
    assert main(["plan", "-m", smol] + args + ["--check-fit"]) == 2      # 2: does not fit
    text = capsys.readouterr().out
    for c in p["fit_changes"]:
        sets = " ".join(f"--set {x}" for x in c["sets"])
        assert f"{c['what']}: moves {fmt_bytes(c['moved'])} off laptop  ({sets})" in text
        fixed = httpx.post(f"{base}/v1/pyggml/plan", timeout=T,
                           json={"args": args + sets.split()}).json()
        assert fixed["not_fitting"] == [] and fixed["fit_changes"] is None
    assert httpx.get(f"{base}/v1/pyggml/plan", timeout=T).json()["fit_changes"] is None
