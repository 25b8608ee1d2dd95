# make suite   the main job: every notebook, headless, on the GPU profile with CUDA, else the simulator
# make test    lint, then the tests (GPU-only tests are skipped without CUDA, saying so)
# make lint    ruff check + ruff format --check (the same as .pre-commit-config.yaml)
# make lab     JupyterLab on notebooks/ with the project's kernel (set INTERACTIVE = True for the panels)
#
# Which torch: TORCH (default torch==2.13.0). On a machine without a local wheel, pip's default index
# serves the CUDA build of torch (several GB with its CUDA packages). For the CPU-only build, point
# TORCH_INDEX at PyTorch's CPU wheel index (the PyTorch install page gives its address):
#   make test TORCH_INDEX=<url of the CPU wheel index>
# On a GPU machine that already has torch and triton: make test TORCH= TRITON= SYSTEM_SITE=1.
PY := .venv/bin/python
PARAMS ?=
LANES ?=
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TRITON ?= triton==3.6.0
SYSTEM_SITE ?=
LAB_ARGS ?=

.venv/.stamp: pyproject.toml
	python3 -m venv $(if $(SYSTEM_SITE),--system-site-packages) .venv
	$(if $(TORCH),$(PY) -m pip install -q '$(TORCH)' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)))
	$(PY) -m pip install -q $(if $(TRITON),'$(TRITON)') -e '.[test]'
	touch $@

suite: .venv/.stamp
	$(PY) -m nblib run $(if $(PARAMS),--params $(PARAMS)) $(if $(LANES),--lanes $(LANES))

lint: .venv/.stamp
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest -q

bench: .venv/.stamp
	$(PY) -m kernels --check --bench --out outputs/bench

# The venv's own python3 kernel runs the notebooks: the same packages as `make suite` and `make test`.
# Containers often run as root, which JupyterLab refuses unless told.
lab: .venv/.stamp
	$(PY) -m jupyterlab --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

.PHONY: suite lint test bench lab
