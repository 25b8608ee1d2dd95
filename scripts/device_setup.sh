# source this on a GPU machine with no network: put the Jupyter/pytest wheels for its python3 in .whl/ and
# this installs them. NBLIB_COMMIT comes from .nbcommit (git-ignored): write `git rev-parse HEAD > .nbcommit`
# in the checkout and copy it with the tree
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export JUPYTER_PATH=/tmp/site/share/jupyter PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NBLIB_COMMIT=$(cat .nbcommit 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# matplotlib's font cache, built once per machine (about 11 s on the H200 host): here, so a timed run
# measures the suite and not the machine's first use of matplotlib
python3 -c "import matplotlib.font_manager" || echo "matplotlib font cache not built"
