import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=300,
                     help="number of mutated GGUF files the fuzz test tries (make fuzz: 2000)")


@pytest.fixture
def ctx():
    from pyggml import Context
    return Context(no_alloc=True)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny GGUF models made on demand, cached per argument set for the session:
    tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2, n_embd=64, ...) -> TinyModel
    (see tests/fixtures/tiny_models.py)."""
    from fixtures.tiny_models import TinyModelFactory
    return TinyModelFactory(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture
def scalar_path():
    """The forced-scalar kernels for one test (one accumulation order on every machine)."""
    from pyggml import _native
    before = _native.cpu_path()
    _native.set_cpu_path("scalar")
    yield
    _native.set_cpu_path(before)
