"""Copy llama.cpp's example GBNF grammars (json, arithmetic, list, c) from the llama-cpp-python
0.3.36 sdist's llama.cpp tree into tests/data/grammars/ (tests/test_grammar.py constrains with
them as llama.cpp does). The sdist is unpacked by `make setup` (tools/build_rpc_server.sh) under
build/llama-cpp-python-0.3.36/. llama.cpp is MIT-licensed; its licence goes along.

    .venv/bin/python tools/copy_llamacpp_grammars.py
"""
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "build" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"
DST = ROOT / "tests" / "data" / "grammars"
NAMES = ("json", "arithmetic", "list", "c")


def main() -> int:
    if not (SRC / "grammars").is_dir():
        print(f"{SRC}/grammars not found: run `make setup` first", file=sys.stderr)
        return 1
    DST.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        shutil.copyfile(SRC / "grammars" / f"{name}.gbnf", DST / f"{name}.gbnf")
    shutil.copyfile(SRC / "LICENSE", DST / "LICENSE-llama.cpp")
    print(f"copied {', '.join(NAMES)} to {DST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
