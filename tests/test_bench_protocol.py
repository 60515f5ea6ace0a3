"""The comparison protocol of the benchmark tools (BENCHMARKS.md, "Decode on AMD Zen 4"): llama.cpp
runs at its defaults — no OpenMP waiting policy, its extra buffer types (repacked and AMX
weights) on, its own polling — or the tool prints what it changed. Earlier tables compared
against a llama.cpp slowed by OMP_WAIT_POLICY=PASSIVE and no repacking without saying so.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from pyggml.llm import bench

ROOT = Path(__file__).resolve().parent.parent

# what moves llama.cpp off its defaults, as it appears in a tool's source
NONDEFAULT = re.compile(r"OMP_WAIT_POLICY|GOMP_SPINCOUNT|KMP_BLOCKTIME|use_extra_bufts\s*=\s*False"
                        r"|\"-nr\"|--no-repack|\"--repack\"|\"--poll\"")
# files that match but print no llama.cpp speed: why each is exempt
EXEMPT = {
    "tools/make_arch_refs.py": "reference logits for tests, not a benchmark",
    "tools/make_embed_refs.py": "reference embeddings for tests, not a benchmark",
    "tools/make_lora_refs.py": "reference logits for tests (as make_arch_refs.py, in the "
                               "llama-cpp-python venv, which has no pyggml), not a benchmark",
    "tools/llamacpp_bench_worker.py": "the worker of bench_llamacpp, which announces for it",
    "pyggml/llm/bench.py": "defines llamacpp_nondefaults/announce_llamacpp (tested below)",
}


def _sources():
    return sorted(list((ROOT / "tools").glob("*.py"))
                  + [ROOT / "pyggml/llm/bench.py", ROOT / "pyggml/cli/bench.py"])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_tool_prints_what_it_changes_in_llamacpp(path):
    """A benchmark tool that sets a waiting policy, turns off repacking/extra buffer types or
    sets --poll for llama.cpp calls announce_llamacpp (which prints it)."""
    rel = str(path.relative_to(ROOT))
    src = path.read_text()
    hits = sorted(set(NONDEFAULT.findall(src)))
    if not hits or rel in EXEMPT:
        return
    assert "announce_llamacpp(" in src or "format_table(" in src and "ref_notes" in src, (
        f"{rel} changes llama.cpp's defaults ({', '.join(hits)}) without printing it: call "
        f"pyggml.llm.bench.announce_llamacpp(llamacpp_nondefaults(...))")


def test_no_tool_recommends_a_waiting_policy():
    """No usage line tells the user to run llama.cpp under OMP_WAIT_POLICY."""
    for path in _sources():
        for line in path.read_text().splitlines():
            assert not re.search(r"OMP_WAIT_POLICY=\w+\s+\S*python", line), (path, line)


def test_nondefaults_listed():
    assert bench.llamacpp_nondefaults(env={}) == []
    notes = bench.llamacpp_nondefaults(no_extra_bufts=True, no_repack=True, poll=0,
                                       env={"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"})
    text = "; ".join(notes)
    assert "OMP_WAIT_POLICY=PASSIVE" in text and "extra buffer types off" in text
    assert "repacking off" in text and "--poll 0" in text and "PATH" not in text


def _fake_python(tmp_path):
    """An 'interpreter' that ignores the worker and prints one llama.cpp row."""
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\necho '[{\"test\": \"tg8\", \"n_threads\": 2, \"tps\": [10.0]}]'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


@pytest.mark.parametrize("no_extra, env, said", [
    (False, None, None),
    (True, None, "extra buffer types off"),
    (False, "PASSIVE", "OMP_WAIT_POLICY=PASSIVE"),
])
def test_bench_llamacpp_prints_its_departures(tmp_path, monkeypatch, capsys, no_extra, env, said):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if env:
        monkeypatch.setenv("OMP_WAIT_POLICY", env)
    rows = bench.bench_llamacpp("m.gguf", [], [8], [2], 1, _fake_python(tmp_path),
                                no_extra_bufts=no_extra)
    assert rows[0].tps == [10.0]
    err = capsys.readouterr().err
    if said is None:
        assert "NOT at its defaults" not in err
    else:
        assert "llama.cpp NOT at its defaults" in err and said in err
    table = bench.format_table(rows, rows, "m", ref_notes=bench.llamacpp_nondefaults(no_extra))
    assert ("NOT at its defaults" in table) == (said is not None)
