# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch is installed first when no GPU is present, so that set-up does not pull a
# multi-GB CUDA build; the package itself does not cap torch. Override with TORCH_SPEC=... if needed.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install test test-fast demo lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || { \
		if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch; \
		else $(PY) -m pip install -q "$(TORCH_SPEC)"; fi; }
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -n 2 --dist loadgroup

test-fast: $(STAMP)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -m "not slow" -n 2

demo: $(STAMP)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(VENV)/bin/sago-train eval

lint: $(STAMP)
	$(VENV)/bin/ruff check sago_train tests benchmarks scripts

bench: $(STAMP)
	$(PY) benchmarks/bench_eval.py

clean:
	rm -rf $(VENV) build dist *.egg-info
