# make suite   the main job: every notebook, headless, on the GPU profile with CUDA, else the simulator;
#              LANES=auto (one process per GPU, or per CPU core on the simulator), LANES=1 for one by one
# make test    lint, then the tests, one worker per core (GPU-only tests are skipped without CUDA, saying so)
# make test-newest  the version-sensitive tests on the newest torch and Triton (see the target)
# make lint    ruff check + ruff format --check (the same as .pre-commit-config.yaml), then mypy on
#              the typed modules (MYPY_FILES)
# make lab     JupyterLab on notebooks/ with the project's kernel (set INTERACTIVE = True for the panels)
#
# Which torch: TORCH (default torch==2.13.0). On a machine without a local wheel, pip's default index
# serves the CUDA build of torch (several GB with its CUDA packages). For the CPU-only build, point
# TORCH_INDEX at PyTorch's CPU wheel index (the PyTorch install page gives its address):
#   make test TORCH_INDEX=<url of the CPU wheel index>
# On a GPU machine that already has torch and triton: make test TORCH= TRITON= SYSTEM_SITE=1.
PY := .venv/bin/python
PARAMS ?=
LANES ?= auto
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TRITON ?= triton==3.6.0
SYSTEM_SITE ?=
LAB_ARGS ?=
# the folder JupyterLab opens on
LAB_ROOT ?= notebooks
# pytest-xdist workers for make test: one per core (auto); TEST_WORKERS=0 runs the tests in one process
TEST_WORKERS ?= auto

.venv/.stamp: pyproject.toml
	python3 -m venv $(if $(SYSTEM_SITE),--system-site-packages) .venv
	$(if $(TORCH),$(PY) -m pip install -q '$(TORCH)' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)))
	$(PY) -m pip install -q $(if $(TRITON),'$(TRITON)') -e '.[test,engines]'
	touch $@

suite: .venv/.stamp
	$(PY) -m nblib run $(if $(PARAMS),--params $(PARAMS)) $(if $(LANES),--lanes $(LANES))

# mypy checks kernels/ and the modules tests/test_public_api.py holds to annotated signatures (its
# COVERED, less its MYPY_PENDING: the test keeps this list and that one in step). The modules they
# import are read for their types only (--follow-imports=silent): mypy still finds errors in the
# rest of nblib/ (`$(PY) -m mypy` lists them). Its cache: .mypy_cache.
MYPY_FILES := kernels nblib/core nblib/lab \
	nblib/engine/buffers.py nblib/engine/build.py nblib/engine/references.py nblib/engine/runner.py \
	nblib/engine/workload.py \
	nblib/instruments/canary.py nblib/instruments/canary_graph.py nblib/instruments/csan.py \
	nblib/instruments/gediff.py nblib/instruments/overhead.py nblib/instruments/probes.py \
	nblib/studies/counts.py nblib/studies/designs.py nblib/studies/design_evidence.py \
	nblib/studies/fix.py nblib/studies/forced.py nblib/studies/method.py nblib/studies/microbatch.py \
	nblib/studies/protocol.py \
	nblib/schema/speed.py \
	nblib/publish/browse.py nblib/publish/caveats.py nblib/publish/pages.py nblib/publish/results_runs.py \
	nblib/publish/runindex.py nblib/publish/show.py nblib/publish/site.py nblib/publish/sweep_site.py

lint: .venv/.stamp
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --follow-imports=silent $(MYPY_FILES)

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# make test-newest   the newest torch and Triton that pyproject.toml's bounds admit, in a venv of
# their own (.venv-newest), on the tests of the version-sensitive code (NEWEST_TESTS): the private-API
# checks, the kernels in Triton's interpreter and their compile checks for every target, the device
# facade, the simulator, the recorder and the audit, one worker per core as make test (TEST_WORKERS;
# pytest below 9.2 for --dist loadgroup, as pyproject.toml's test extra). The notebook suite, the
# site, the lab and the sweeps use nothing of torch or Triton that these do not, and take minutes,
# so they run on the pinned versions only (make test); the venv gets the packages these tests
# import, not Jupyter.
# pip's default index serves the CUDA build of torch (several GB with its CUDA packages).
# NEWEST_PIP_ENV lifts a machine-wide pip constraint (a pip.conf `constraint`) that caps torch
# below the newest, for this venv only, and keeps the machine's other pip settings (its indexes);
# NEWEST_PIP_ENV=PIP_CONFIG_FILE=/dev/null ignores every pip.conf instead.
NEWEST_PY := .venv-newest/bin/python
NEWEST_TORCH ?= torch==2.15.0
NEWEST_TRITON ?= triton==3.9.0
NEWEST_PIP_ENV ?= PIP_CONSTRAINT=/dev/null
NEWEST_DEPS := numpy scipy matplotlib pyyaml 'pydantic>=2' pandas jinja2 tqdm 'pytest<9.2' pytest-xdist
NEWEST_TESTS ?= test_private_api.py test_topk.py test_instrument_kernels.py test_indexer.py \
	test_kernel_compile.py test_device.py test_sim.py test_recorder.py test_audit.py test_audit_cli.py

# in two steps: the packages (.deps) write nothing into the checkout, so they can be installed while
# another venv installs this package; the package itself (.stamp) writes its egg-info here
.venv-newest/.deps: pyproject.toml
	python3 -m venv .venv-newest
	$(NEWEST_PIP_ENV) $(NEWEST_PY) -m pip install -q '$(NEWEST_TORCH)' '$(NEWEST_TRITON)' $(NEWEST_DEPS)
	touch $@

.venv-newest/.stamp: .venv-newest/.deps
	$(NEWEST_PY) -m pip install -q --no-deps -e .
	touch $@

test-newest: .venv-newest/.stamp
	$(NEWEST_PY) -c "import torch, triton; print('test-newest: torch', torch.__version__, 'triton', triton.__version__)"
	$(NEWEST_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(addprefix tests/,$(NEWEST_TESTS))

# the suite, then its speed table (each notebook's wall and phase times) beside the previous one of
# this machine: outputs/bench-suite/<machine>-<profile>-<commit>/speed.md
bench-suite: .venv/.stamp
	$(PY) -m nblib run --bench $(if $(PARAMS),--params $(PARAMS)) $(if $(LANES),--lanes $(LANES))

bench: .venv/.stamp
	$(PY) -m kernels --check --bench --out outputs/bench

# The venv's own python3 kernel runs the notebooks: the same packages as `make suite` and `make test`.
# Containers often run as root, which JupyterLab refuses unless told.
lab: .venv/.stamp
	$(PY) -m jupyterlab --ServerApp.root_dir=$(LAB_ROOT) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

.PHONY: suite lint test test-newest bench bench-suite lab
