import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=300,
                     help="number of mutated GGUF files the fuzz test tries (make fuzz: 2000)")


@pytest.fixture
def ctx():
    from pyggml import Context
    return Context(no_alloc=True)
