# make suite   the main job: every notebook, headless, on the GPU profile with CUDA, else the simulator
# make test    the tests (GPU-only tests are skipped without CUDA, with the reason)
# make lab     JupyterLab on notebooks/ with the project's kernel (set INTERACTIVE = True for the panels)
PY := .venv/bin/python
PARAMS ?=
LAB_ARGS ?=

.venv/.stamp: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q torch==2.13.0 triton==3.6.0 -e '.[test]'
	touch $@

suite: .venv/.stamp
	$(PY) -m nblib run $(if $(PARAMS),--params $(PARAMS))

test: .venv/.stamp
	$(PY) -m pytest -q

bench: .venv/.stamp
	$(PY) -m kernels.indexer --bench --out outputs/bench

# The venv's own python3 kernel runs the notebooks: the same packages as `make suite` and `make test`.
# Containers often run as root, which JupyterLab refuses unless told.
lab: .venv/.stamp
	$(PY) -m jupyterlab --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

.PHONY: suite test bench lab
