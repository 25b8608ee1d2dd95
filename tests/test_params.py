"""The profile schema: every profile key checked before anything runs, in one line that names the
key and its valid values; the notebooks' parameters cells agree with it, key by key."""

import ast

import papermill as pm
import pytest
import yaml

from nblib.core.paths import NOTEBOOK_DIR, NOTEBOOKS, ROOT
from nblib.run import cli, notebook
from nblib.schema import params as P

CI = ROOT / "params" / "ci.yaml"

BAD = [  # (what the profile says, what the one-line error must say)
    ({"bukets": [1, 2]}, "unknown key 'bukets': did you mean 'buckets'?"),
    ({"index_dtype": "bf17"}, "unknown key 'index_dtype': did you mean 'index_dtypes'?"),
    ({"index_dtypes": ["bf17"]}, "index_dtypes[0]: 'bf17' is not one of bf16, fp8 (did you mean 'bf16'?)"),
    ({"logits_policy": "persistant"}, "'persistant' is not one of transient, persistent, record_stream"),
    ({"overlaps": [True, False]}, "overlaps[0]: True is not one of on, off (YAML reads on/off"),
    ({"workload": {"sessions": "many"}}, "workload.sessions: expected int, got 'many'"),
    ({"model": {"hedas": 4}}, "model: unknown key 'hedas': did you mean 'heads'?"),
    ({"model": {"max_ctx": 1000}}, "model: max_ctx must be a multiple of the page size 64"),
    ({"buckets": 8}, "buckets: expected list[int], got 8"),
    ({"buckets": [0, 2]}, "buckets[0]: input should be greater than or equal to 1"),
    ({"fix_target": 1.5}, "fix_target: input should be less than 1, got 1.5"),
    ({"backend": "gpu"}, "backend: 'gpu' is not one of auto, cuda, sim"),
    ({"output_dir": "x"}, "unknown key 'output_dir'"),  # --out sets it, never a profile
]


@pytest.mark.parametrize("change,message", BAD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(BAD)])
def test_a_bad_profile_fails_in_one_line_before_anything_is_created(tmp_path, change, message):
    bad = tmp_path / "bad.yaml"
    prof = yaml.safe_load(CI.read_text())
    for k, v in change.items():
        prof[k] = {**prof[k], **v} if isinstance(v, dict) and isinstance(prof.get(k), dict) else v
    bad.write_text(yaml.safe_dump(prof))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--params", str(bad), "--out", str(out)])
    text = str(e.value.code)
    assert text.startswith(f"error: {bad}: ") and message in text and "\n" not in text, text
    assert not out.exists()


def test_the_command_line_exits_non_zero_with_one_line(tmp_path, capsys):
    # cli.main is `python -m nblib`: a string given to sys.exit is what the interpreter prints to
    # stderr, alone, before it exits with status 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(CI.read_text().replace("buckets:", "bukets:"))
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--params", str(bad), "--out", str(tmp_path / "out")])
    assert isinstance(e.value.code, str) and e.value.code.splitlines() == [
        f"error: {bad}: unknown key 'bukets': did you mean 'buckets'? valid keys: "
        + ", ".join(k for k in P.Profile.model_fields if k not in P.NOT_IN_PROFILES)
    ]
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "out").exists()


def test_a_bad_only_fails_before_anything_is_created(tmp_path):
    with pytest.raises(SystemExit, match="unknown notebook '99': choose among 00_reproduce, "):
        cli.main(["run", "--params", str(CI), "--out", str(tmp_path / "out"), "--only", "00", "99"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", P.PROFILES)
def test_every_shipped_profile_is_valid(name):
    prof = P.load(ROOT / "params" / f"{name}.yaml")
    assert set(prof) == set(P.Profile.model_fields) - set(P.NOT_IN_PROFILES)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_cell_matches_the_schema(name):
    """What `papermill --help-notebook` shows: each declared key with the schema's type, default
    and help, in the schema's order, and nothing else."""
    declared = pm.inspect_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb"))
    assert list(declared) == list(P.DECLARES[name])
    for key, p in declared.items():
        assert p["inferred_type_name"] == P.annotation(key), key
        assert p["help"] == P.Profile.model_fields[key].description, key
        assert ast.literal_eval(p["default"]) == P.default(key), key


def test_every_schema_key_is_some_notebooks_parameter():
    used = {k for keys in P.DECLARES.values() for k in keys}
    assert used == set(P.Profile.model_fields)


def test_the_schema_takes_the_engines_own_fields():
    from dataclasses import fields

    from nblib.engine.model import ModelConfig
    from nblib.engine.workload import WorkloadConfig

    knobs = {"index_dtype", "overlap", "logits_policy", "seed"}
    assert set(P.Shapes.model_fields) == {f.name for f in fields(ModelConfig)} - knobs
    assert set(P.Workload.model_fields) == {f.name for f in fields(WorkloadConfig)} - {"concurrency", "seed"}
    # a partial model dict gets the engine's defaults, as ModelConfig(**model) would
    applied = P.validate({"model": {"heads": 8}})["model"]
    assert applied == {**{f.name: f.default for f in fields(ModelConfig) if f.name not in knobs}, "heads": 8}


def test_setup_refuses_a_bad_parameter_before_results_exist(tmp_path):
    ns = {k: P.default(k) for k in P.DECLARES["01_canary"]}
    ns.update(backend="sim", output_dir=str(tmp_path), overlaps=["on", "of"])
    with pytest.raises(
        P.ProfileError, match=r"notebook 01_canary: overlaps\[1\]: 'of' is not one of on, off"
    ):
        notebook.setup("01_canary", ns)
    assert not any(tmp_path.iterdir())
    ns["overlaps"] = ["off"]
    dev, res = notebook.setup("01_canary", ns, fixed=dict(index_dtype="bf16"))
    assert (
        dev.name == "sim" and res["params"]["overlaps"] == ["off"] and res["fixed"] == {"index_dtype": "bf16"}
    )
    assert res["params"]["workload"]["out_tol"] == 0.01  # applied: the default the cell left out


def test_seed_blocks_that_share_seeds_are_refused_in_one_line():
    from nblib.schema import params as P

    with pytest.raises(
        ValueError, match="seed_blocks 0 and 3 share seeds: each block runs protocol_runs"
    ) as e:
        P.validate({"seed_blocks": [0, 3], "protocol_runs": 5})
    assert "\n" not in str(e.value).strip().splitlines()[0]
