"""Timeline, address map and sweep of a tiny model's plan: the pictures are valid images, the CSV
round-trips and describes a placement without overlaps, the sweep grows as it should."""
import pytest

from pyggml.planning import plots as memplot
from pyggml.cli import main
from pyggml.planning.measure import format_sweep, sweep
from pyggml.planning.memory import plan_memory

PIL = pytest.importorskip("PIL.Image")
mpimg = pytest.importorskip("matplotlib.image")


@pytest.fixture(scope="module")
def report(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=3, n_embd=128, n_ff=256,
                         n_vocab=1024)
    return plan_memory(tm.path, n_ctx=512, n_ubatch=128, logits_all=True).reports["prefill"]


def _valid_png(path):
    with PIL.open(path) as im:
        im.verify()
    with PIL.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200
    assert img.std() > 0.01                     # not a blank canvas


def test_timeline_and_address_map_are_valid_images(report, tmp_path):
    memplot.plot_timeline(report, tmp_path / "t.png")
    memplot.plot_address_map(report, tmp_path / "a.png")
    memplot.plot_timeline(report, tmp_path / "t.svg")
    _valid_png(tmp_path / "t.png")
    _valid_png(tmp_path / "a.png")
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


def test_timeline_csv_round_trips_and_has_no_overlaps(report, tmp_path):
    rows = memplot.write_timeline_csv(report, tmp_path / "t.csv")
    back = memplot.read_timeline_csv(tmp_path / "t.csv")
    assert back == rows == memplot.timeline_rows(report)
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header.startswith("tensor,buffer,offset,size,first,last")
    assert any(r.last is None for r in rows) and any(r.placed == "inplace" for r in rows)
    # the CSV alone shows a valid placement: at every node, live byte ranges of a chunk are
    # disjoint, except where a result takes its source's memory in place at that very node
    n = report.n_nodes
    for node in range(-1, n):
        live = [r for r in rows if r.first <= node <= (n - 1 if r.last is None else r.last)]
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                if (a.buffer_id, a.chunk) != (b.buffer_id, b.chunk):
                    continue
                if a.offset < b.offset + b.size and b.offset < a.offset + a.size:
                    new, old = (a, b) if a.first == node and a.placed != "fresh" else (b, a)
                    assert new.first == node and new.placed in ("inplace", "view_parent")
                    assert old.last == node and new.offset == old.offset
    # the biggest tensor alive at the peak is the logits
    b = report.buffers[0]
    at = memplot.peak_node(b.live_bytes)
    assert memplot.alive_at(rows, at, n)[0].tensor == "result_output"
    assert b.live_bytes[at + 1] == b.max_live


def test_sweep_table_plot_and_csv(tiny_models, tmp_path, capsys):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=128, n_ff=256,
                         n_vocab=1024)
    rows = sweep(tm.path, [256, 512, 1024], [32, 128])
    assert len(rows) == 6
    for ub in (32, 128):
        mine = [r for r in rows if r["n_ubatch"] == ub]
        kv = [r["kv"] for r in mine]
        assert kv[1] == 2 * kv[0] and kv[2] == 2 * kv[1]       # KV grows linearly with n_ctx
        assert [r["compute"] for r in mine] == sorted(r["compute"] for r in mine)
    big = {r["n_ctx"]: r["compute"] for r in rows if r["n_ubatch"] == 128}
    small = {r["n_ctx"]: r["compute"] for r in rows if r["n_ubatch"] == 32}
    assert all(big[c] > small[c] for c in big)
    assert "n_ubatch" in format_sweep(rows)
    assert main(["mem", "-m", str(tm.path), "--sweep-ctx", "256,512", "--sweep-ub", "32,64",
                 "--sweep-plot", str(tmp_path / "s.png"), "--sweep-csv",
                 str(tmp_path / "s.csv")]) == 0
    out = capsys.readouterr().out
    assert out.count("MiB") >= 12
    _valid_png(tmp_path / "s.png")
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0].startswith("n_ctx,n_ubatch,compute,kv,system_ram") and len(lines) == 5


def test_cli_writes_timeline_csv_and_address_map(tiny_models, tmp_path, capsys):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0")
    args = ["mem", "-m", str(tm.path), "-c", "128", "-ub", "32", "--plan-only",
            "--timeline", str(tmp_path / "t.png"), "--timeline-csv", str(tmp_path / "t.csv"),
            "--address-map", str(tmp_path / "a.png")]
    assert main(args) == 0
    _valid_png(tmp_path / "t.png")
    _valid_png(tmp_path / "a.png")
    assert len(memplot.read_timeline_csv(tmp_path / "t.csv")) > 10
