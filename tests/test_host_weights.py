"""Where the CPU's weights live (pyggml.llm.setup.host_weights_copied): mapped from the GGUF
(use_mmap=True, llama.cpp's --mmap) or read into a host buffer, huge pages where the kernel has
them (use_mmap=False, --no-mmap; None: when that gives huge pages and fits). Same bits either
way; the file's pages are never mapped by the copy."""

import numpy as np
import pytest

from pyggml import LLM
from pyggml.backend.cpu import HostBuffer, transparent_huge_pages
from pyggml.cmdline import run_options
from pyggml.gguf import MappedBuffer
from pyggml.llm.setup import host_weights_copied


@pytest.fixture(scope="module")
def model(tiny_models):
    return str(tiny_models.get("llama").path)


def _weight_buffers(llm):
    return {type(t.buffer) for t in llm.run.weights.values()}


def test_mapped_and_copied_weights_give_the_same_logits(model):
    ids = [1, 5, 9, 13, 17, 21]
    out = {}
    for use_mmap in (True, False, None):
        with LLM(model, n_ctx=64, n_threads=2, use_mmap=use_mmap, logits_all=True) as llm:
            kinds = _weight_buffers(llm)
            if use_mmap is False or (use_mmap is None and host_weights_copied(None, 1)):
                assert kinds == {HostBuffer}
                # the copy's bytes are the file's bytes
                name = "blk.0.attn_q.weight"
                t = llm.run.weights[name]
                got = np.frombuffer(t.buffer.array, np.uint8)[t.data - t.buffer.base:][:t.nbytes()]
                assert np.array_equal(got, llm.run.model.model.tensor_bytes(name))
            else:
                assert kinds == {MappedBuffer}
            out[use_mmap] = np.array(llm.eval(ids))
    assert np.array_equal(out[True], out[False]) and np.array_equal(out[True], out[None])


def test_the_default_follows_huge_pages_and_the_free_memory():
    assert host_weights_copied(True, 1) is False and host_weights_copied(False, 1 << 60) is True
    huge = transparent_huge_pages() in ("always", "madvise")
    assert host_weights_copied(None, 1 << 20) is huge
    assert host_weights_copied(None, 1 << 60) is False     # never more than the machine has


def test_weight_buffers_are_advised_for_huge_pages_where_the_kernel_has_them():
    from pyggml.backend.base import BufferUsage
    from pyggml.backend.cpu import cpu_buffer_type
    big = cpu_buffer_type().alloc_buffer(8 << 20, BufferUsage.WEIGHTS)
    compute = cpu_buffer_type().alloc_buffer(8 << 20, BufferUsage.COMPUTE)
    small = cpu_buffer_type().alloc_buffer(1 << 20, BufferUsage.WEIGHTS)
    assert big.huge_pages is (transparent_huge_pages() in ("always", "madvise"))
    assert not compute.huge_pages and not small.huge_pages
    assert big.base % 64 == 0 and not big.array.any()          # aligned, zeroed


@pytest.mark.parametrize("argv, want", [([], None), (["--mmap"], True), (["--no-mmap"], False)])
def test_cli_mmap_flags(argv, want):
    import argparse
    from pyggml.cmdline import add_model_args
    p = argparse.ArgumentParser()
    add_model_args(p)
    opts = run_options(p.parse_args(argv))
    assert opts.get("use_mmap") is want
    with pytest.raises(SystemExit):
        p.parse_args(["--mmap", "--no-mmap"])


def test_a_file_cut_short_after_opening_is_named_with_its_tensor(model, tmp_path):
    import shutil
    from pyggml.errors import GGUFError
    from pyggml.gguf import GGUFModel
    path = tmp_path / "cut.gguf"
    shutil.copy(model, path)
    m = GGUFModel.open(path)
    last = max(m.tensors.values(), key=lambda i: i.offset)
    with open(path, "r+b") as f:                    # changed on disk after it was opened
        f.truncate(last.offset + last.nbytes // 2)
    buf = np.zeros(last.nbytes, np.uint8)
    with pytest.raises(GGUFError, match=f"cut.gguf: tensor '{last.name}': the file ends"):
        m.read_tensors_into(lambda info: buf, names=[last.name], progress=False)


def test_use_mmap_must_be_a_bool_or_none(model):
    from pyggml.errors import ArgumentTypeError
    with pytest.raises(ArgumentTypeError, match="use_mmap must be True or False or None"):
        LLM(model, use_mmap="yes")
