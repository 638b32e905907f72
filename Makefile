# pipeline: make run | make test | make bench | make serve
# Every target creates the environment it needs (.venv for the pipeline, .venv-serve for Triton).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
SERVE_VENV ?= .venv-serve
PY := $(VENV)/bin/python
PIPELINE := $(VENV)/bin/pipeline
# CPU build of torch, installed first so nothing pulls a multi-GB CUDA build (see README).
TORCH_PIN ?= torch==2.13.0
PIP_FLAGS ?= -q --disable-pip-version-check
# Exact versions of every package of .venv (pip freeze without the project and torch): the install steps below take
# them as pip constraints, so a fresh `make env` gets the environment the suite last passed on. `make lock` refreshes
# the file from the current .venv on purpose (after upgrading a package); docs/reproducibility.md.
CONSTRAINTS ?= constraints.txt
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (one test file per worker, so a module's fixtures are built once); 0 = serial
PYTEST_WORKERS ?= 2
STAMP := $(VENV)/.installed
SERVE_STAMP := $(SERVE_VENV)/.installed

.PHONY: env serve-env test-env trtllm-compat-env run test style typecheck lint bench bench-scale gpu-check gpu-wheels serve plan doctor clean lock

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) $(TORCH_PIN)
	$(PY) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) -e '.[dev]'
	touch $@

env: $(STAMP)

# Refresh constraints.txt from the packages installed in .venv now (the project and torch left out: TORCH_PIN pins it).
# Run it in the full test environment (make test-env) so the test extras are pinned too; it does not reinstall first.
lock:
	@test -x $(PY) || { echo "make lock: no $(VENV) to read versions from; run make test-env first" >&2; exit 1; }
	{ sed -n '/^#/p' $(CONSTRAINTS); $(PY) -m pip freeze --disable-pip-version-check --exclude-editable --exclude torch; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	@touch -c $(STAMP)

# Serving environment for the Triton Python backend: numpy < 2 (2.x corrupts tensors in the 2.51
# backend stub) and the tritonserver binary from the nvidia-pytriton wheel, installed --no-deps.
$(SERVE_STAMP): pipeline/serve/requirements-serve.txt
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(SERVE_VENV)/bin/python -m pip install $(PIP_FLAGS) -r pipeline/serve/requirements-serve.txt
	$(SERVE_VENV)/bin/python -m pip install $(PIP_FLAGS) --no-deps nvidia-pytriton==0.7.0
	touch $@

serve-env: $(SERVE_STAMP)

# What only the test suite needs beyond the pipeline: the SLURM launcher (its docs config is composed), the Ray cluster engine (hydra/launcher=ray_cluster; the launcher
# --no-deps, its cloudpickle<3 pin would break joblib: pyproject.toml) and a real MLflow server in its own venv (full
# mlflow pins pyarrow<26; the pipeline itself only needs the mlflow-skinny client).
MLFLOW_VENV ?= .venv-mlflow
TEST_STAMP := $(VENV)/.installed-test
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) -e '.[dev,mlflow,ray,slurm]'
	$(PY) -m pip install $(PIP_FLAGS) --no-deps hydra-ray-launcher==1.2.2
	touch $@
$(MLFLOW_STAMP):
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(MLFLOW_VENV)/bin/python -m pip install $(PIP_FLAGS) 'mlflow>=3.1,<4'
	touch $@
# The transformers the TensorRT-LLM serving image loads our tensorrt_llm_pytorch package with (4.57.x, no torch), in its
# own venv: tests/package/test_trtllm_compat.py loads every shipped file there (docs/package.md).
TRTLLM_COMPAT_VENV ?= .venv-trtllm-compat
TRTLLM_COMPAT_REQ := pipeline/package/requirements-trtllm-compat.txt
TRTLLM_COMPAT_STAMP := $(TRTLLM_COMPAT_VENV)/.installed
$(TRTLLM_COMPAT_STAMP): $(TRTLLM_COMPAT_REQ)
	$(PYTHON) -m venv $(TRTLLM_COMPAT_VENV)
	$(TRTLLM_COMPAT_VENV)/bin/python -m pip install $(PIP_FLAGS) -r $(TRTLLM_COMPAT_REQ)
	touch $@
trtllm-compat-env: $(TRTLLM_COMPAT_STAMP)
test-env: $(TEST_STAMP) $(MLFLOW_STAMP) $(TRTLLM_COMPAT_STAMP)

run: env serve-env
	$(PIPELINE) $(ARGS)

# The linter, the formatter check (pyproject.toml [tool.ruff]) and the type checker ([tool.mypy], zero errors) run
# first; then the suite, in $(PYTEST_WORKERS) processes (pytest-xdist, whole files per worker).
test: env serve-env test-env style typecheck
	$(PY) -m pytest -q --durations=15 -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

style: env
	$(PY) -m ruff check pipeline tests
	$(PY) -m ruff format --check pipeline tests

typecheck: env
	$(PY) -m mypy pipeline

lint: style typecheck

# The standard benchmarks (docs/benchmark.md), int4 engines on onnxruntime_genai:
# 1. the default model: engine in-process, Triton over gRPC streaming, transformers baseline -> bench/results/default.*
# 2. the 80M memory-bound Llama shape (deterministic random weights, generated here, gitignored): engine, onnxruntime-genai's
#    own int4 build of the same checkpoint, Triton -> bench/results/llama80m.*. Random weights make its release gate
#    meaningless: it is run and reported, and its exit code 3 (gate failed) is accepted as long as the benchmark itself
#    wrote its results (checked against a stamp); any other failure stops make. Random weights also give near-tied
#    logits, so a batched (evaluate) and a single-request (served) decode part ways after tens of tokens: the serving
#    parity check is off for this shape (package.parity=false, recorded) and runs on the default model.
# Then both reports (tables + target ratios, met or not) are printed.
BENCH_80M ?= bench/models/llama80m
# every level runs this many times (fresh seeded workloads, interleaved across modes); ratios use the mean, and the
# reports show the spread: single runs on a shared 2-core host moved the 80 M roofline fraction from 0.40 to 0.69
BENCH_REPEATS ?= 3
bench: env serve-env
	$(PIPELINE) stages=[benchmark] quant=int4_awq target=onnxruntime_genai benchmark=default benchmark.repeats=$(BENCH_REPEATS) $(ARGS)
	$(PY) -m pipeline.bench.shapes llama80m $(BENCH_80M)
	@touch $(BENCH_80M).stamp
	$(PIPELINE) stages=[benchmark] model.path=$(BENCH_80M) model.name=llama80m quant=int4_awq target=onnxruntime_genai \
	  benchmark=llama80m benchmark.repeats=$(BENCH_REPEATS) calibration.calib_size=16 calibration.min_samples=16 calibration.calib_max_seq_length=64 eval.limit=16 \
	  eval.gate.mode=exploratory package.allow_failed_gate=true package.parity=false $(ARGS) || [ $$? -eq 3 ]
	@test bench/results/llama80m.json -nt $(BENCH_80M).stamp || { echo "make bench: the llama80m benchmark wrote no results (see above)" >&2; exit 1; }
	$(PIPELINE) benchmark show bench/results/default.json
	$(PIPELINE) benchmark show bench/results/llama80m.json

# The scale ladder (docs/memory.md): deterministic random Llama shapes of 80 M, 412 M, 1 B and 3 B parameters
# (bf16 weights generated under bench/models/, gitignored), export -> quantize (int4 AWQ, 32 x 128 calibration
# tokens) -> build on onnxruntime_genai, 1 B also evaluate + package; per-stage wall time and peak RSS (the pipeline
# process and the engine builder), bytes per parameter, seconds per billion parameters; a shape the host cannot hold
# is refused by the planner before any work -> bench/results/scale.json + scale.png. SCALE_SHAPES picks the ladder.
SCALE_SHAPES ?= llama80m,llama400m,llama1b,llama3b
bench-scale: env serve-env
	$(PY) -m pipeline.bench.scale --shapes $(SCALE_SHAPES)

# The quantize stage's placements on one device (docs/memory.md "GPU check"): whole, layer by layer, offloaded to host
# memory and to disk, killed and resumed; peaks against the plan; placements compared (bytes, else KLD / top token)
# -> bench/results/gpu.json + .md (gpu-cpu.* for DEVICE=cpu). DEVICE=cuda runs on the GPU host's own python3 and
# torch (its CUDA build), with what the pipeline needs beyond them installed from .whl/ (no network needed there:
# run `make gpu-wheels` on a machine with network first and bring .whl/ along); DEVICE=cpu uses .venv.
DEVICE ?= cuda
GPU_SHAPES ?=
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/pipeline-gpu-site
ifeq ($(DEVICE),cpu)
gpu-check: env
	$(PY) -m pipeline.bench.gpu_check --device cpu $(if $(GPU_SHAPES),--shapes $(GPU_SHAPES)) $(ARGS)
else
gpu-check:
	@ls .whl/*.whl >/dev/null 2>&1 || { echo "make gpu-check: no wheels in .whl/. Fix: run 'make gpu-wheels' on a machine with network, then bring .whl/ here." >&2; exit 2; }
	$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) -m pipeline.bench.gpu_check --device $(DEVICE) $(if $(GPU_SHAPES),--shapes $(GPU_SHAPES)) $(ARGS)
endif

# Wheels for a GPU host without network (Python 3.12, manylinux x86_64): what `pipeline export/quantize` needs beyond
# the torch, transformers, accelerate and safetensors a CUDA image ships. antlr4 4.9.3 (Hydra's parser) has no wheel
# on the index: built here from its sdist (pure Python).
GPU_WHEEL_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64,--platform $(p))
gpu-wheels:
	mkdir -p .whl
	$(PYTHON) -m pip download $(PIP_FLAGS) --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(GPU_WHEEL_PLATFORMS) -d .whl \
	  nvidia-modelopt==0.47.0 pulp==3.3.2 pydantic pydantic-core annotated-types typing-inspection hydra-core==1.3.2 omegaconf==2.3.0 \
	  hydra-joblib-launcher onnxruntime-genai==0.18.0
	$(PYTHON) -m pip wheel $(PIP_FLAGS) --no-deps -w .whl antlr4-python3-runtime==4.9.3

serve: env serve-env
	$(PIPELINE) serve $(ARGS)

plan: env
	$(PIPELINE) plan $(ARGS)

doctor: env
	$(PIPELINE) doctor

clean:
	rm -rf artifacts runs multirun .pytest_cache
