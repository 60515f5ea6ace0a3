"""The command line on a tiny model: run streams text and prints timings; bench prints the table;
bad flags and files give clear errors."""
import subprocess
import sys

import pytest

from pyggml.cli import main


def test_run_greedy_prints_text_and_timings(tiny_models, capsys):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0")
    assert main(["run", "-m", str(tm.path), "-p", "hello world", "-n", "6", "--temp", "0",
                 "-c", "64", "-t", "1", "--ignore-eos"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello world")
    assert "generation 6 tokens" in err and "load time" in err and "t/s" in err


def test_bench_table(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    assert main(["bench", "-m", str(tm.path), "-p", "8", "-n", "4", "-t", "1", "-r", "2"]) == 0
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if l.startswith("| ")]
    assert lines[0] == "| model | size | params | backend | threads | test | t/s |"
    assert any("| CPU | 1 | pp8 |" in l for l in lines)
    assert any("| CPU | 1 | tg4 |" in l for l in lines)


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    assert main(["run", "-m", str(bad), "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyggml: error:") and "bad.gguf" in err


def test_info_and_graph(capsys, tmp_path):
    assert main(["info"]) == 0
    assert "kernel path" in capsys.readouterr().out
    dot = tmp_path / "g.dot"
    assert main(["graph", "--dot", str(dot)]) == 0
    assert dot.read_text().startswith("digraph")


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "pyggml.cli", "info"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "libpyggml" in out.stdout
