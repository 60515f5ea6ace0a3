"""`pyggml bench` as llama-bench: -d (depth), -pg, -b/-ub, -ctk/-ctv lists, -o md|csv|json|jsonl,
the model/size/params/backend/threads columns, one thread count by default; and the llama-bench
command line used for --compare-llamacpp, read back from its JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest

from pyggml.cli import main
from pyggml.llm import bench


def _bench(capsys, tm, *argv):
    assert main(["bench", "-m", str(tm.path), "-r", "2", *argv]) == 0
    return capsys.readouterr().out


def test_depth_pg_lists_and_json(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64, head_dim=32)
    out = _bench(capsys, tm, "-p", "8", "-n", "4", "-pg", "8,2", "-d", "0,16", "-ctk",
                 "f16,q4_0", "-ctv", "q8_0", "-ub", "4", "-b", "8", "-t", "1", "-o", "json")
    recs = json.loads(out)
    tests = [(r["type_k"], r["n_depth"], r["n_prompt"], r["n_gen"]) for r in recs]
    # llama-bench's order: settings (type_k), then depth, then pp, tg, pg
    assert tests == [(tk, d, p, g) for tk in ("f16", "q4_0") for d in (0, 16)
                     for p, g in ((8, 0), (0, 4), (8, 2))]
    for r in recs:
        assert (r["type_v"], r["n_batch"], r["n_ubatch"], r["n_threads"]) == ("q8_0", 8, 4, 1)
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 and r["engine"] == "pyggml"
        n = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"][0] == pytest.approx(1e9 * n / r["samples_ns"][0], rel=1e-6)
        assert r["model_n_params"] > 0 and r["model_size"] > 0 and r["backends"] == "CPU"


def test_markdown_shows_what_is_not_default_and_depth_names(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64, head_dim=32)
    out = _bench(capsys, tm, "-p", "8", "-n", "0", "-d", "16", "-ctk", "q4_0", "-t", "1")
    head, sep, row = [line for line in out.splitlines() if line.startswith("|")]
    assert head == "| model | size | params | backend | threads | type_k | test | t/s |"
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0].startswith("llama ") and cells[1].endswith("MiB")
    assert cells[2].endswith(" M") and cells[3:7] == ["CPU", "1", "q4_0", "pp8 @ d16"]


def test_csv_and_jsonl(tiny_models, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64, head_dim=32)
    rows = list(csv.DictReader(io.StringIO(_bench(capsys, tm, "-p", "8", "-n", "2", "-t", "1",
                                                  "-o", "csv"))))
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [("8", "0"), ("0", "2")]
    assert set(bench.FIELDS) <= set(rows[0])
    lines = _bench(capsys, tm, "-p", "0", "-n", "2", "-t", "1", "-o", "jsonl").splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["n_gen"] == 2


def test_one_thread_count_by_default(tiny_models, capsys, monkeypatch):
    import pyggml.backend.cpu as cpu
    monkeypatch.setattr(cpu, "default_n_threads", lambda: 1)
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64, head_dim=32)
    recs = json.loads(_bench(capsys, tm, "-p", "8", "-n", "0", "-o", "json"))
    assert [r["n_threads"] for r in recs] == [1]


@pytest.mark.parametrize("argv,msg", [
    (["-ctk", "q4_k"], "-ctk q4_k: expected one of"), (["-pg", "8"], "PP,TG"),
    (["-d", "-4"], ">= 0"), (["-ub", "0"], ">= 1"), (["-o", "xml"], "invalid choice"),
    (["-p", "0", "-n", "0"], "nothing to measure"), (["-fa", "maybe"], "-fa maybe")])
def test_bad_flags_are_one_line(tiny_models, capsys, argv, msg):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64, head_dim=32)
    assert main(["bench", "-m", str(tm.path), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err


def test_ranges_as_llama_bench():
    parse = bench_cli_ints()
    assert parse("1,4-6") == [1, 4, 5, 6]
    assert parse("128-512*2") == [128, 256, 512] and parse("0-8+4") == [0, 4, 8]


def bench_cli_ints():
    from pyggml.cli.bench import _ints
    return _ints(0, "token counts")


def test_llama_bench_command_and_its_json_read_back():
    s = [bench.Setting(2048, 512, "q4_0", "q4_0", 2, True)]
    argv = bench.llama_bench_argv("lb", "m.gguf", bench.tests_of([512], [128], [(512, 32)]),
                                  [0, 4096], s, 3)
    assert argv[:7] == ["lb", "-m", "m.gguf", "-r", "3", "-o", "json"]
    flags = dict(zip(argv[7::2], argv[8::2]))
    assert flags == {"-p": "512", "-n": "128", "-d": "0,4096", "-b": "2048", "-ub": "512",
                     "-ctk": "q4_0", "-ctv": "q4_0", "-t": "2", "-fa": "on", "-pg": "512,32"}
    rec = {"n_batch": 2048, "n_ubatch": 512, "type_k": "q4_0", "type_v": "q4_0",
           "n_threads": 2, "flash_attn": 1, "n_prompt": 512, "n_gen": 0, "n_depth": 4096,
           "samples_ns": [2_000_000_000], "samples_ts": [256.0]}
    ref = bench.rows_from_llama_bench_json([rec])
    ours = [bench.BenchRow("pp512 @ d4096", 2, [512.0], 512, 0, 4096, s[0])]
    table = bench.format_table(ours, ref, model=bench.ModelFacts("m", "m.gguf", 2**30, 10**9))
    assert "| 256.00 ± 0.00 | 2.00 |" in table and "type_k" in table
