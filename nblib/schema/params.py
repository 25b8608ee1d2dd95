"""Profiles (params/*.yaml) and the one schema behind them: every key a profile or a notebook's
parameters cell may hold, with its type, its allowed values, its default and its help.

    profile = params.load("params/ci.yaml")   # validated, defaults applied; one-line error if not
    params.DECLARES["01_canary"]               # the keys notebook 01 declares (and is passed)
    print(params.parameters_cell("01_canary")) # that notebook's parameters cell, from the schema

The model's and the workload's keys come from the engine's own dataclasses (ModelConfig,
WorkloadConfig), so a field added there is a profile key here with no second list to keep.
The defaults are the ci profile's, the smallest that still shows every finding.
A bad profile fails in one line that names the key and what it may be, before anything runs.
"""

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from nblib.backends import device
from nblib.core.paths import NOTEBOOKS, ROOT
from nblib.engine.model import INDEX_DTYPES, LOGITS_POLICIES, OVERLAPS, ModelConfig
from nblib.engine.runner import MODES
from nblib.engine.workload import WorkloadConfig

__all__ = [
    "CI_MODEL",
    "CI_WORKLOAD",
    "DECLARES",
    "NOT_IN_PROFILES",
    "PROFILES",
    "STRICT",
    "Positive",
    "Profile",
    "ProfileError",
    "Shapes",
    "Workload",
    "annotation",
    "default",
    "default_profile",
    "explain",
    "load",
    "parameters_cell",
    "resolve_backend",
    "validate",
]

PROFILES = ("gpu", "gpu-long", "sim", "ci")
STRICT = ConfigDict(extra="forbid", strict=True)


def _from_dataclass(cls, exclude, name):
    """A strict pydantic model with the dataclass's fields and defaults, less `exclude`."""
    fields = {f.name: (f.type, f.default) for f in dataclasses.fields(cls) if f.name not in exclude}
    return create_model(name, __config__=STRICT, **fields)


# The knobs are profile keys of their own (lists the studies loop over); seed is the profile's.
_Shapes = _from_dataclass(ModelConfig, ("index_dtype", "overlap", "logits_policy", "seed"), "Shapes")
# concurrency is each row's bucket; seed is the profile's.
_Workload = _from_dataclass(WorkloadConfig, ("concurrency", "seed"), "Workload")


class Shapes(_Shapes):
    @model_validator(mode="after")
    def _engine_accepts(self):
        ModelConfig(**self.model_dump())  # its own checks (max_ctx a whole number of pages)
        return self


class Workload(_Workload):
    @model_validator(mode="after")
    def _ranges(self):
        for lo in ("ctx_min", "out_min", "think_min", "think_ms_min"):
            hi = lo.replace("_min", "_max")
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"{lo} {getattr(self, lo)} is above {hi} {getattr(self, hi)}")
        if self.sessions < 1 or self.rounds < 1:
            raise ValueError("sessions and rounds must be at least 1")
        return self


CI_MODEL = dict(
    heads=4,
    dim=128,
    topk=16,
    max_ctx=4096,
    d_model=256,
    ffn=1024,
    num_pages=1200,
    vocab=512,
    trunk_layers=5,
    trunk_width=256,
    indexer_programs=1,
)
CI_WORKLOAD = dict(
    sessions=16,
    rounds=2,
    ctx_min=64,
    ctx_max=2048,
    turn_ctx=1024,
    out_min=4,
    out_max=12,
    think_min=1,
    think_max=4,
)
Positive = Annotated[int, Field(ge=1)]


class Profile(BaseModel):
    """Every key, its type and allowed values (the annotation), its default and its help."""

    model_config = STRICT

    backend: Literal["auto", "cuda", "sim"] = Field(
        "auto", description="cuda | sim | auto (cuda if present, else sim)"
    )
    model: Shapes = Field(
        default_factory=lambda: Shapes(**CI_MODEL),
        description="the shapes: ModelConfig's fields less the knobs",
    )
    buckets: list[Positive] = Field(
        [1, 2, 4, 8], min_length=1, description="decode batch sizes captured, one graph each"
    )
    workload: Workload = Field(
        default_factory=lambda: Workload(**CI_WORKLOAD),
        description="the agentic sessions: WorkloadConfig's fields less concurrency and seed",
    )
    index_dtypes: list[Literal[INDEX_DTYPES]] = Field(
        list(INDEX_DTYPES), min_length=1, description=" | ".join(INDEX_DTYPES) + ": index-K cache layouts"
    )
    modes: list[Literal[MODES]] = Field(
        list(MODES), min_length=1, description=" | ".join(MODES) + ": replay graphs, or run eagerly"
    )
    overlaps: list[Literal[OVERLAPS]] = Field(
        list(OVERLAPS), min_length=1, description='"on" | "off": indexer on a side stream while capturing'
    )
    logits_policy: Literal[LOGITS_POLICIES] = Field(
        "transient", description=" | ".join(LOGITS_POLICIES) + ": the indexer's logits buffer"
    )
    seed: int = Field(0, description="workload and replay-timing seed")
    protocol_runs: Annotated[int, Field(ge=2)] = Field(
        5, description="runs (seeds) of the campaign's protocol per configuration"
    )
    seed_blocks: list[Annotated[int, Field(ge=0)]] = Field(
        [], description="base seeds of the protocol's seed blocks, protocol_runs runs each"
    )
    replays: Positive = Field(50, description="timed replays per instrument for the overhead")
    fix_target: float = Field(
        0.05, gt=0, lt=1, description="the fix's 95% upper bound on its rate must fall below this"
    )
    confirm_replays: int = Field(
        20, ge=1, description="forced replays per schedule (notebooks 02, 03 and 07: the audit's --confirm)"
    )
    timing_replays: int = Field(20, ge=2, description="timed replays per bucket and variant")
    timing_ctx: int = Field(
        0, ge=0, description="entries a request in the timed full batches; 0: half the longest context"
    )
    output_dir: str = Field("../outputs/local", description="where results go (the suite sets it)")
    INTERACTIVE: bool = Field(False, description="True: ipywidgets controls for a live session")

    @model_validator(mode="after")
    def _blocks_apart(self):
        bases = sorted(set(self.seed_blocks))
        close = [(a, b) for a, b in zip(bases, bases[1:]) if b - a < self.protocol_runs]
        if close:
            a, b = close[0]
            raise ValueError(
                f"seed_blocks {a} and {b} share seeds: each block runs protocol_runs ({self.protocol_runs}) "
                f"seeds from its base, so bases must be at least that far apart"
            )
        return self


NOT_IN_PROFILES = ("output_dir", "INTERACTIVE")  # notebook-only: `--out` sets one, a live session the other
_RUN = ("backend", "model", "buckets", "workload", "seed")
_NB = ("output_dir", "INTERACTIVE")
DECLARES = {
    "00_reproduce": (
        *_RUN,
        "index_dtypes",
        "modes",
        "overlaps",
        "logits_policy",
        "protocol_runs",
        "seed_blocks",
        *_NB,
    ),
    "01_canary": (*_RUN, "overlaps", "logits_policy", *_NB),
    "02_graph_vs_eager": (
        *_RUN,
        "logits_policy",
        "protocol_runs",
        "replays",
        "timing_ctx",
        "confirm_replays",
        *_NB,
    ),
    "03_stream_overlap": (*_RUN, "index_dtypes", "overlaps", "logits_policy", "confirm_replays", *_NB),
    "04_persistent_buffer_fix": (*_RUN, "index_dtypes", "fix_target", "timing_replays", "timing_ctx", *_NB),
    "05_report": ("backend", *_NB),
    "06_audit_your_engine": ("backend", "seed", *_NB),
    "07_method_on_your_engine": ("backend", "seed", "confirm_replays", *_NB),
}
assert tuple(DECLARES) == NOTEBOOKS, "one DECLARES entry per notebook, in order"


class ProfileError(ValueError):
    """A profile or a parameters cell that the schema refuses; the message is one line."""


def validate(
    values: Mapping[str, Any], source: str = "profile", allowed: Iterable[str] | None = None
) -> dict[str, Any]:
    """The applied parameters (defaults filled in, nested ones too) for `values`, restricted to
    `allowed` keys (default: all); raises ProfileError naming the first bad key."""
    allowed = tuple(allowed or Profile.model_fields)
    extra = [k for k in values if k not in allowed]
    if extra:
        raise ProfileError(f"{source}: {_unknown(extra[0], allowed)}")
    try:
        applied = Profile.model_validate(values).model_dump()
    except ValidationError as e:
        raise ProfileError(f"{source}: {explain(e.errors()[0])}") from None
    return {k: applied[k] for k in allowed}


def load(path: str | Path) -> dict[str, Any]:
    """A profile file, validated whole (every key, nested ones too) before anything runs."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no params file {path}: use one of params/{{{','.join(PROFILES)}}}.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path} must hold a mapping of parameter names to values")
    keys = [k for k in Profile.model_fields if k not in NOT_IN_PROFILES]
    return validate(data, str(path), keys)


def _loc(loc):
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _unknown(key, valid):
    near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"unknown key {key!r}: {hint}valid keys: {', '.join(valid)}"


def explain(err: Mapping[str, Any]) -> str:
    """One line from one pydantic error: the key, what it may be, and what it got."""
    where, got, kind = _loc(err["loc"]), err.get("input"), err["type"]
    if kind == "extra_forbidden":
        parent: Any = Profile  # then each nested model's class, by the error's path
        for part in err["loc"][:-1]:
            parent = parent.model_fields[part].annotation
        return f"{'.'.join(map(str, err['loc'][:-1]))}: " * (len(err["loc"]) > 1) + _unknown(
            err["loc"][-1], list(parent.model_fields)
        )
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", err["ctx"]["expected"])
        near = difflib.get_close_matches(str(got), choices, n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        if isinstance(got, bool):
            hint = ' (YAML reads on/off/yes/no unquoted as booleans: quote them, "on")'
        return f"{where}: {got!r} is not one of {', '.join(choices)}{hint}"
    field = Profile.model_fields.get(err["loc"][0]) if err["loc"] else None
    help_ = f" ({field.description})" if field is not None and field.description else ""
    if kind.endswith("_type"):
        return f"{where}: expected {_type_name(err)}, got {got!r}{help_}"
    if kind == "value_error":  # a check of our own: its message names the values
        return f"{where}: {err['msg'].removeprefix('Value error, ')}"
    return f"{where}: {err['msg'][0].lower() + err['msg'][1:]}, got {got!r}{help_}"


def _type_name(err):
    """The annotation the key expects, as a parameters cell writes it."""
    key = err["loc"][0]
    if key not in Profile.model_fields:
        return "a value"
    t = annotation(key)
    if len(err["loc"]) > 1 and t.startswith("list["):
        return t[5:-1]
    return "int" if len(err["loc"]) > 1 and t == "dict" else t


def annotation(key: str) -> str:
    """The key's type as papermill shows it (str, int, float, bool, list[str], list[int], dict)."""
    t: Any = Profile.model_fields[key].annotation  # a type, or a typing form (Literal, list)
    name = getattr(t, "__name__", str(t))
    origin = getattr(t, "__origin__", None)
    if isinstance(t, type) and issubclass(t, BaseModel):
        return "dict"
    if origin is Literal:
        return type(t.__args__[0]).__name__
    if origin is list:
        inner = t.__args__[0]
        inner = type(inner.__args__[0]).__name__ if getattr(inner, "__origin__", None) is Literal else "int"
        return f"list[{inner}]"
    return name


def default(key: str) -> Any:
    f: Any = Profile.model_fields[key]  # its default_factory takes no argument (pydantic allows one)
    value = f.default_factory() if f.default_factory else f.default
    return value.model_dump() if isinstance(value, BaseModel) else value


def _literal(value, width=100):
    """A Python literal for a parameters cell: a dict's items wrapped a few to a line."""
    if not isinstance(value, dict):
        return f'"{value}"' if isinstance(value, str) else repr(value).replace("'", '"')
    lines, line = [], "   "
    for k, v in value.items():
        item = f' "{k}": {_literal(v)},'
        if len(line) + len(item) > width:
            lines.append(line)
            line = "   "
        line += item
    return "{\n" + "\n".join([*lines, line]) + "\n}"


def parameters_cell(notebook: str) -> str:
    """The notebook's parameters cell, written from the schema (tests check each notebook's cell).
    ruff's formatter leaves it as written (fmt: off), so a dict keeps a few items a line."""
    lines = [
        "# Parameters: papermill overrides them (python -m nblib run passes a validated profile).",
        "# Names, types, defaults and help come from the schema, nblib.schema.params.Profile.",
        "# fmt: off",
    ]
    for key in DECLARES[notebook]:
        lines.append(
            f"{key}: {annotation(key)} = {_literal(default(key))}  # {Profile.model_fields[key].description}"
        )
    return "\n".join([*lines, "# fmt: on"])


def resolve_backend(name: str) -> device.Device:
    """The device for a profile's backend, failing in one line when this machine can't give it."""
    return device.get(name)


def default_profile() -> Path:
    """The README's main command: the GPU profile where there is CUDA, the simulator elsewhere."""
    return ROOT / "params" / ("gpu.yaml" if device.has_cuda() else "sim.yaml")
