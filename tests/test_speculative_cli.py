"""Speculative decoding on the command line: run, chat and plan take -md / --lookup and say
what was drafted and accepted; bad combinations are usage errors."""
import io
import sys

from pyggml.cli import main


def test_run_with_lookup_and_draft_model_prints_draft_stats(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    base = ["run", "-m", str(tm.path), "-p", "hello world! hello world! hello", "-n", "12",
            "--temp", "0", "-c", "128", "-t", "1", "--ignore-eos"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    for extra in (["--lookup", "--draft-max", "4"], ["-md", str(tm.path), "--draft", "3"]):
        assert main(base + extra) == 0
        out, err = capsys.readouterr()
        assert out == plain                             # greedy: the same text
        assert "draft (" in err and "drafted" in err and "accepted" in err, err


def test_chat_with_lookup(tiny_models, capsys, monkeypatch):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello hello hello\n"))
    assert main(["chat", "-m", str(tm.path), "--chat-template", "chatml", "-n", "8", "--temp",
                 "0", "-c", "256", "-t", "1", "--lookup", "-v"]) == 0
    err = capsys.readouterr().err
    assert "draft (prompt lookup" in err and "drafted" in err, err


def test_draft_flag_errors(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    assert main(["run", "-m", str(tm.path), "--lookup", "-md", str(tm.path)]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert main(["run", "-m", str(tm.path), "--draft-max", "4"]) == 2
    assert "need a draft" in capsys.readouterr().err
    big = tiny_models.get(arch="llama", weight_type="q8_0", n_vocab=900)
    assert main(["run", "-m", str(tm.path), "-md", str(big.path), "-n", "2", "-c", "64"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyggml: error:") and "cannot draft" in err


def test_plan_with_draft_model(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    dm = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=1)
    assert main(["plan", "-m", str(tm.path), "-md", str(dm.path), "-c", "256"]) == 0
    out = capsys.readouterr().out
    assert "draft model" in out and "KV cache" in out and "16 + 1 rows" in out
