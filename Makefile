# make suite   the main job: every notebook, headless, on the GPU profile with CUDA, else the simulator
# make test    the tests (GPU-only tests are skipped without CUDA, with the reason)
PY := .venv/bin/python
PARAMS ?=

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

.PHONY: suite test bench
