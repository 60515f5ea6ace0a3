"""The layers of the model runtime (docs/ARCHITECTURE.md): only pyggml/llm/context.py keeps a
sequence's cells, every caller uses public calls, and the one generation loop is the only one.

Read from the source (ast), so a new module that reaches into `Context`'s or `LLM`'s private
state fails here, not later in a subtle cache bug."""
import ast
from pathlib import Path

import pyggml
from pyggml.llm import context as context_mod, runtime as runtime_mod

PKG = Path(pyggml.__file__).parent
OWNERS = {Path(context_mod.__file__).resolve(), Path(runtime_mod.__file__).resolve()}


def _private_attrs(path: Path, class_name: str) -> set[str]:
    """Names `self._x` that a class assigns or defines (its private state and helpers)."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)
             and n.name.startswith("_") and not n.name.startswith("__")}
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and \
                n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__"):
            names.add(n.attr)
    return names


def _foreign_reads(path: Path, names: set[str], root: Path = PKG.parent) -> list[str]:
    """`x._name` for a private name of Context / LLM, where x is not `self` (or `cls`)."""
    hits = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Attribute) and n.attr in names and \
                not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            hits.append(f"{path.relative_to(root)}:{n.lineno}: .{n.attr}")
    return hits


def test_the_private_state_of_context_and_llm_is_what_the_test_looks_for():
    ctx = _private_attrs(Path(context_mod.__file__), "Context")
    llm = _private_attrs(Path(runtime_mod.__file__), "LLM")
    # the sequence bookkeeping and the graph cache: the names this test exists for
    assert {"_seq_tokens", "_seq_epoch", "_graphs", "_decode_ubatch", "_closed"} <= ctx
    assert "_speculators" in llm


def test_no_module_reads_private_sequence_state_of_context_or_llm():
    names = _private_attrs(Path(context_mod.__file__), "Context") | \
        _private_attrs(Path(runtime_mod.__file__), "LLM")
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        if path.resolve() not in OWNERS:
            hits += _foreign_reads(path, names)
    assert hits == [], "private state of Context / LLM read from outside:\n" + "\n".join(hits)


def test_the_check_finds_a_reach_into_private_state(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(llm):\n    llm.context._seq_tokens[0].clear()\n")
    names = _private_attrs(Path(context_mod.__file__), "Context")
    assert _foreign_reads(bad, names, tmp_path) == ["bad.py:2: ._seq_tokens"]


def test_only_the_context_edits_the_kv_cache_bookkeeping():
    """KVCache's sequence edits (seq_rm, clear, place, restore) are called by context.py only:
    everything else keeps or drops cells through Context's public sequence API."""
    edits = {"seq_rm", "clear", "place", "restore"}
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if str(rel) in ("llm/context.py", "llm/kv_cache.py") or rel.parts[0] in ("planning",):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                    n.func.attr in edits and isinstance(n.func.value, ast.Attribute) and \
                    n.func.value.attr == "kv":
                hits.append(f"{rel}:{n.lineno}: kv.{n.func.attr}")
    assert hits == [], "KV cells changed outside pyggml/llm/context.py:\n" + "\n".join(hits)


def test_one_generation_loop():
    """Sampling happens in generate.py only (the speculative rule and the draft's own
    sampler aside): no second loop appears in the runtime, completions or the server."""
    for rel in ("llm/runtime.py", "llm/completion.py", "server/engine.py", "server/app.py",
                "cli/chat.py", "cli/run.py", "llm/embedding.py"):
        src = (PKG / rel).read_text()
        assert ".sample(" not in src and "Sampler(" not in src, rel
