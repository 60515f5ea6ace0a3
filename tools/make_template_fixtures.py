"""Copy the chat templates the tool-call and reasoning tests render (tests/data/templates/) from
llama.cpp's models/templates/ (the vendored tree of the llama-cpp-python sdist that setup unpacks
under build/). The copies are byte-for-byte, so a template's own licence comment stays in it; the
folder's NOTICE says where each came from.

    python tools/make_template_fixtures.py [--src LLAMA_CPP_DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEST = REPO / "tests" / "data" / "templates"
DEFAULT_SRC = REPO / "build" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"

# file in models/templates -> the Hugging Face model it was taken from (llama.cpp's README there)
TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "Qwen/Qwen2.5-7B-Instruct",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "NousResearch/Hermes-3-Llama-3.1-8B",
    "Qwen-Qwen3-0.6B.jinja": "Qwen/Qwen3-0.6B",
    "Qwen-QwQ-32B.jinja": "Qwen/QwQ-32B",
    "Qwen3-Coder.jinja": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "meta-llama/Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "meta-llama/Llama-3.3-70B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistralai/Mistral-Nemo-Instruct-2407",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistralai/Ministral-3-14B-Reasoning-2512",
    "unsloth-mistral-Devstral-Small-2507.jinja": "unsloth/Devstral-Small-2507",
    "openai-gpt-oss-120b.jinja": "openai/gpt-oss-120b",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "HuggingFaceTB-SmolLM3-3B.jinja": "HuggingFaceTB/SmolLM3-3B",
    "google-gemma-2-2b-it.jinja": "google/gemma-2-2b-it",
    "microsoft-Phi-3.5-mini-instruct.jinja": "microsoft/Phi-3.5-mini-instruct",
    "google-gemma-4-31B-it.jinja": "google/gemma-4-31B-it",
    "Qwen3.5-4B.jinja": "Qwen/Qwen3.5-4B",
    "LFM2-8B-A1B.jinja": "LiquidAI/LFM2-8B-A1B",
    "LFM2.5-Instruct.jinja": "LiquidAI/LFM2.5-1.2B-Instruct",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC,
                    help="a llama.cpp source tree (default: the vendored one under build/)")
    args = ap.parse_args(argv)
    folder = args.src / "models" / "templates"
    if not folder.is_dir():
        print(f"{folder}: not found (run make setup, or pass --src)", file=sys.stderr)
        return 1
    DEST.mkdir(parents=True, exist_ok=True)
    lines = ["Chat templates copied unchanged from llama.cpp's models/templates/ (MIT; see",
             "llama.cpp's LICENSE) by tools/make_template_fixtures.py. Each template is the chat",
             "template of the model named below and stays under that model's licence; licence",
             "comments inside a template are kept as they are.", ""]
    for name, model in TEMPLATES.items():
        shutil.copyfile(folder / name, DEST / name)
        lines.append(f"{name}: https://huggingface.co/{model}")
    (DEST / "NOTICE").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"copied {len(TEMPLATES)} templates to {DEST.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
