"""A job notebook and its parameters: finding and reading it, its ``parameters`` cell (read,
evaluated under a profile, generated from its config classes), and the types of the values a
run passes (:func:`check_parameter_types`, ``-p NAME VALUE`` as :func:`cli_parameters`)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from tutorial_utils import paths, profiles
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import atomic_write_text
from tutorial_utils.jobs import registry
from tutorial_utils.jobs.records import JobError
from tutorial_utils.secrets import redact

__all__ = [
    "RUN_DIR_PARAM",
    "JobParameterError",
    "resolve_notebook",
    "read_notebook",
    "parameters_cell",
    "declared_parameters",
    "default_parameters",
    "JOB_METADATA",
    "job_entry",
    "extra_parameters",
    "config_classes",
    "nullable_parameters",
    "generated_parameters",
    "write_parameters",
    "check_parameter_types",
    "cli_parameters",
]

#: the parameter a job notebook's ``parameters`` cell ends with: the run directory the runner gives it
RUN_DIR_PARAM = "run_dir"


class JobParameterError(JobError, ConfigError):
    """A job parameter whose type differs from the type of its default in the ``parameters`` cell."""


# --- notebooks and their parameters cell ------------------------------------------------------------


def resolve_notebook(path: str | os.PathLike) -> Path:
    """The job notebook ``path`` names: a path, or a job's name under ``notebooks/jobs/``."""
    p = Path(path)
    candidates = [p, paths.REPO / p, paths.JOBS / p, paths.JOBS / f"{p}.md"]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = sorted(x.relative_to(paths.REPO).as_posix() for x in paths.JOBS.glob("*.md"))
    raise JobError(
        f"job notebook {os.fspath(path)!r} not found (looked in ., {paths.REPO}, {paths.JOBS}). "
        f"Known jobs: {', '.join(known) or 'none yet'}."
    )


def read_notebook(path: Path):
    """The notebook as an nbformat node, from a MyST/percent source (jupytext) or an .ipynb."""
    import jupytext

    return jupytext.read(path)


def parameters_cell(nb) -> tuple[int, str]:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return i, cell.source
    raise JobError("notebook has no code cell tagged `parameters`: add `:tags: [parameters]` to its first code cell")


def declared_parameters(nb) -> list[str]:
    """Names assigned at top level in the ``parameters`` cell, in order."""
    _, src = parameters_cell(nb)
    names: list[str] = []
    for node in ast.parse(src).body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Name) and t.id not in names:
                names.append(t.id)
    return names


def default_parameters(nb, profile: str | None = None) -> dict[str, Any]:
    """Evaluate the ``parameters`` cell (optionally under another profile) and return its values."""
    _, src = parameters_cell(nb)
    old = os.environ.get(profiles.ENV_VAR)
    try:
        if profile is not None:
            os.environ[profiles.ENV_VAR] = profile
        ns: dict[str, Any] = {}
        exec(compile(src, "<parameters>", "exec"), ns)  # the project's own notebook source
    finally:
        if profile is not None:
            if old is None:
                os.environ.pop(profiles.ENV_VAR, None)
            else:
                os.environ[profiles.ENV_VAR] = old
    names = declared_parameters(nb)
    return {k: ns[k] for k in names}


#: the front matter key that names a job notebook's entry in :data:`tutorial_utils.jobs.registry.JOBS`
#: (``tutorial_job: train``): its config classes and extra parameters
JOB_METADATA = "tutorial_job"


def job_entry(nb) -> dict[str, Any]:
    """The registry entry ``nb``'s front matter names (``{}`` for a notebook that names none)."""
    if JOB_METADATA not in nb.metadata:
        return {}
    return registry.entry(nb.metadata[JOB_METADATA])


def extra_parameters(nb, parameters: dict[str, Any], defaults: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``({name: default}, function)`` of the extra parameters of ``nb``'s job (its registry entry's
    ``extra_parameters``) for these ``parameters`` (``({}, None)`` for a job without any)."""
    ref = job_entry(nb).get("extra_parameters")
    if not ref:
        return {}, None
    fn = registry.resolve(ref)
    try:
        return dict(fn({**defaults, **parameters})), fn
    except (TutorialError, LookupError, ValueError) as exc:  # an unknown family, a bad value
        raise JobParameterError(f"{exc}") from None


def config_classes(nb) -> list[type]:
    """The config classes of ``nb``'s job (its registry entry's ``configs``), in order."""
    return [registry.resolve(ref) for ref in job_entry(nb).get("configs", ())]


def nullable_parameters(nb) -> set[str]:
    """The parameters whose config field takes None (``float | None``: "None: ..." in its help),
    even where a profile's default is a number: ``-p train_minutes null`` is a value, not a type error."""
    import dataclasses
    import typing

    out: set[str] = set()
    for cls in config_classes(nb):
        hints = typing.get_type_hints(cls)
        out |= {f.name for f in dataclasses.fields(cls) if type(None) in typing.get_args(hints.get(f.name))}
    return out


def generated_parameters(nb) -> str | None:
    """The ``parameters`` cell ``nb`` should hold: generated from its config classes plus
    ``run_dir = ""`` (None for a notebook that names no config classes)."""
    from tutorial_utils import params

    classes = config_classes(nb)
    if not classes:
        return None
    return params.parameters_cell(*classes, extra=[f'{RUN_DIR_PARAM} = ""'])


def write_parameters(notebooks: list[Path], write: bool) -> list[Path]:
    """The job notebooks whose ``parameters`` cell differs from :func:`generated_parameters`;
    with ``write`` the cell is rewritten in place (the rest of the file kept byte for byte)."""
    stale = []
    for path in notebooks:
        text = path.read_text(encoding="utf-8")
        want = generated_parameters(read_notebook(path))
        if want is None:
            continue
        _, have = parameters_cell(read_notebook(path))
        if have.strip() == want.strip():
            continue
        stale.append(path)
        if write:
            marker = ":tags: [parameters]\n\n"
            i = text.index(marker) + len(marker)
            j = text.index("\n```", i)
            atomic_write_text(path, text[:i] + want + text[j:])
    return stale


# --- the values a run passes ------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _type_ok(value: Any, default: Any, nullable: bool = False) -> bool:
    """Whether ``value`` may replace ``default``: the same type; an int for a float; anything
    for a ``None`` default ("no override"); ``None`` only where the default is ``None`` or the
    parameter is ``nullable`` (its config field takes None)."""
    if default is None:
        return True
    if value is None:
        return nullable
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def check_parameter_types(
    notebook: str, parameters: dict[str, Any], defaults: dict[str, Any], nullable: set[str] | frozenset = frozenset()
) -> None:
    """Raise :class:`JobParameterError` naming every parameter whose value has the wrong type
    (``nullable``: the parameters that also take None, :func:`nullable_parameters`)."""
    bad = []
    for name, value in parameters.items():
        if name in defaults and not _type_ok(value, defaults[name], name in nullable):
            default = defaults[name]
            want = "int or float" if isinstance(default, float) else _type_name(default)
            bad.append(f"{name}={redact(repr(value))} is {_type_name(value)}, but its default {default!r} is {want}")
    if bad:
        raise JobParameterError(
            f"{notebook}: wrong parameter type(s): {'; '.join(bad)}. Fix: pass a value of the default's type "
            "(a whole number for an int, a number for a float, true/false for a bool, comma-separated items for a "
            "tuple such as 0.9,0.999); only a parameter whose "
            "default is None, or whose help says what None means, takes None."
        )


def cli_parameters(raw: list[tuple[str, str]], defaults: dict[str, Any]) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as values: YAML (``2``, ``2.5``, ``true``, ``null``, ``[1, 2]``),
    except that a parameter whose default is a string keeps the text as written (``-p task_ids 0``
    is the string ``"0"``), and one whose default is a tuple or list also takes its items
    comma-separated (``-p optimizer_betas 0.9,0.999``)."""

    def value(k: str, v: str) -> Any:
        d = defaults.get(k)
        if isinstance(d, str):
            return v
        if isinstance(d, (list, tuple)) and "," in v and not v.lstrip().startswith("["):
            return _parse_value(f"[{v}]")
        return _parse_value(v)

    return {k: value(k, v) for k, v in raw}


def _parse_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
