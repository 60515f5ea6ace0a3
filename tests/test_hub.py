"""`pyggml pull` / `-hf` / `ls` against a loopback fake of the Hugging Face hub (tests/support/
fake_hub.py; no network): the default quant, an explicit one, split files, resume after a dropped
connection, cache reuse, offline mode, one-line errors for a missing repo or quant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyggml.models.hub import choose_files, parse_spec
from support.fake_hub import FakeHub

PYGGML = [sys.executable, "-m", "pyggml.cli"]


@pytest.fixture(scope="module")
def gguf(tiny_models) -> bytes:
    return Path(os.fspath(tiny_models.get("llama"))).read_bytes()


def _env(hub: FakeHub, home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_XET": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"},
               **extra)
    return env


def _pyggml(args, env, **kw):
    return subprocess.run(PYGGML + args, env=env, capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


def test_choice_as_llamacpp():
    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-F16.gguf",
             "big/m-Q6_K-00002-of-00002.gguf", "big/m-Q6_K-00001-of-00002.gguf"]
    assert choose_files(files, parse_spec("u/r")) == ["m-Q4_K_M.gguf"]
    assert choose_files(files, parse_spec("u/r:q8_0")) == ["m-Q8_0.gguf"]
    assert choose_files(files, parse_spec("hf.co/u/r:Q6_K")) == [
        "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]
    assert choose_files(["only.gguf", "mmproj.gguf"], parse_spec("u/r")) == ["only.gguf"]
    with pytest.raises(Exception, match=r"no Q2_K GGUF \(it has: Q4_K_M, Q6_K, Q8_0\)"):
        choose_files(files, parse_spec("u/r:Q2_K"))
    with pytest.raises(Exception, match="user/repo"):
        parse_spec("not a repo")


def test_pull_run_ls_and_cache_reuse(gguf, tmp_path):
    other = gguf + b"\0" * 64               # another file of the repo (never chosen)
    repos = {"me/tiny-GGUF": {"tiny-Q8_0.gguf": other, "tiny-Q4_K_M.gguf": gguf,
                              "README.md": b"hi"}}
    with FakeHub(repos) as hub:
        env = _env(hub, tmp_path)
        r = _pyggml(["pull", "me/tiny-GGUF"], env)
        assert r.returncode == 0, r.stderr
        path = Path(r.stdout.strip())
        assert path.read_bytes() == gguf
        assert str(path).startswith(str(tmp_path / "hub" / "models--me--tiny-GGUF"))
        assert hub.downloads("tiny-Q4_K_M.gguf") == 1 and hub.downloads("tiny-Q8_0.gguf") == 0
        # -hf on run: the cached file, no second download
        r = _pyggml(["run", "-hf", "me/tiny-GGUF", "-p", "a b", "-n", "2", "--temp", "0",
                     "-c", "64", "-t", "1"], env)
        assert r.returncode == 0, r.stderr
        assert hub.downloads("tiny-Q4_K_M.gguf") == 1
        r = _pyggml(["ls"], env)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if "me/tiny-GGUF" in x)
        assert "llama" in line and str(path) in line
    # offline: the hub is gone; the cache answers, a missing one is one line
    off = {**env, "HF_HUB_OFFLINE": "1"}
    r = _pyggml(["pull", "me/tiny-GGUF"], off)
    assert r.returncode == 0 and Path(r.stdout.strip()) == path, r.stderr
    r = _pyggml(["pull", "me/absent"], off)
    assert r.returncode == 1 and "offline" in r.stderr and r.stderr.count("\n") == 1


def test_a_dropped_connection_resumes(tmp_path):
    """huggingface_hub resumes with a Range request from the bytes it has (it writes in 10 MB
    chunks, so the file is bigger than one)."""
    data = os.urandom(3 << 20) * 8                                  # 24 MiB
    cut = 14 << 20
    with FakeHub({"me/big": {"big-Q4_K_M.gguf": data}},
                 drop_once={"big-Q4_K_M.gguf": cut}) as hub:
        r = _pyggml(["pull", "me/big", "-q"], _env(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        assert Path(r.stdout.strip()).read_bytes() == data
        gets = [rng for m, p, rng in hub.requests if m == "GET" and p.endswith("/big-Q4_K_M.gguf")]
        assert len(gets) == 2 and gets[0] is None and gets[1] is not None, gets
        start = int(gets[1].split("=")[1].rstrip("-"))
        assert 0 < start <= cut                                      # not from the start


def test_split_models_come_whole(gguf, tmp_path):
    a, b = gguf[:1000], gguf[1000:]
    repos = {"me/split": {"s-Q4_K_M-00001-of-00002.gguf": a, "s-Q4_K_M-00002-of-00002.gguf": b}}
    with FakeHub(repos) as hub:
        r = _pyggml(["pull", "me/split:Q4_K_M", "-q"], _env(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        first = Path(r.stdout.strip())
        assert first.name == "s-Q4_K_M-00001-of-00002.gguf" and first.read_bytes() == a
        assert (first.parent / "s-Q4_K_M-00002-of-00002.gguf").read_bytes() == b


def test_missing_repo_or_quant_is_one_line(gguf, tmp_path):
    with FakeHub({"me/tiny": {"t-Q8_0.gguf": gguf}, "me/two": {"t-Q8_0.gguf": gguf,
                                                               "t-Q5_0.gguf": gguf}}) as hub:
        env = _env(hub, tmp_path)
        r = _pyggml(["pull", "me/nope"], env)
        assert r.returncode == 1 and "no such model repository" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1
        r = _pyggml(["pull", "me/two:Q2_K"], env)
        assert r.returncode == 1 and "no Q2_K GGUF (it has: Q5_0, Q8_0)" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1
        r = _pyggml(["pull", "me/tiny"], env)                # one GGUF: no quant needed
        assert r.returncode == 0, r.stderr
        r = _pyggml(["run", "-m", "x.gguf", "-hf", "me/tiny", "-p", "a"], env)
        assert r.returncode == 2 and "-m and -hf" in r.stderr
