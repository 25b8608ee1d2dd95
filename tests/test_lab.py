"""`make lab` and the dependency lists: JupyterLab starts on notebooks/ with the project's kernel,
and environment.yml asks for the same packages as pyproject.toml."""

import json
import os
import re
import sys
import time
import urllib.request

import yaml
from lab_driver import TOKEN, Lab

from nblib.core.paths import NOTEBOOK_DIR, ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency reads TOML there
    import tomli as tomllib


def _name(req):
    """A requirement's package name, normalised: 'ray[default]>=2' -> 'ray'."""
    return re.split(r"[\[<>=!~; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins(reqs):
    return {_name(r): r.split("==", 1)[1] for r in reqs if "==" in r}


def test_environment_yml_lists_the_packages_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip = next(d["pip"] for d in conda if isinstance(d, dict) and "pip" in d)
    listed = [r for r in pip if not r.startswith("-e")]
    assert {_name(r) for r in listed} == {_name(r) for r in declared}
    # a version pinned in both must be the same (torch and triton are pinned only where CPU installs are made)
    both = _pins(listed).keys() & _pins(declared).keys()
    assert {k: _pins(listed)[k] for k in both} == {k: _pins(declared)[k] for k in both}


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


def _request(url, method):
    req = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def _cmdline(kernel_id):
    """argv of the process started for the kernel (its connection file names the kernel's id)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:  # the process ended while we looked
            continue
        if any(f"kernel-{kernel_id}.json" in a for a in argv):
            return argv
    return None


def kernel_interpreter(base, token):
    """Start a python3 kernel through the server's REST API and return the interpreter its process
    runs (argv[0]), then shut it down."""
    kernel = json.loads(_request(f"{base}/api/kernels?token={token}", "POST"))["id"]
    try:
        deadline = time.monotonic() + 60
        while (argv := _cmdline(kernel)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert argv is not None, f"no process for kernel {kernel}"
        return argv[0]
    finally:
        _request(f"{base}/api/kernels/{kernel}?token={token}", "DELETE")


def test_make_lab_serves_the_notebooks_with_the_project_kernel(tmp_path):
    lab = Lab(NOTEBOOK_DIR, tmp_path)  # `make lab` on its default folder's notebooks
    base, token = lab.base, TOKEN
    try:
        assert _get(f"{base}/api/status?token={token}")[0] == 200
        assert _get(f"{base}/lab?token={token}")[0] == 200  # the JupyterLab UI itself is served
        listing = json.loads(_get(f"{base}/api/contents?token={token}")[1])
        names = {c["name"] for c in listing["content"]}
        assert {"00_reproduce.ipynb", "05_report.ipynb"} <= names  # rooted at notebooks/
        specs = json.loads(_get(f"{base}/api/kernelspecs?token={token}")[1])
        kernel = specs["kernelspecs"][specs["default"]]["spec"]
        # the notebooks' kernel (python3) is this environment's own interpreter
        nb_kernel = json.loads((ROOT / "notebooks" / "00_reproduce.ipynb").read_text())["metadata"][
            "kernelspec"
        ]
        assert nb_kernel["name"] == specs["default"] == "python3"
        assert "ipykernel_launcher" in kernel["argv"], kernel["argv"]
        # the kernel the server starts for the notebooks runs on this environment's interpreter
        assert kernel_interpreter(base, token) == sys.executable
    finally:
        lab.stop()
