"""Typed job parameters: one dataclass per job is the single source of its parameters.

A job's config (``RecordConfig``, ``TrainConfig``, ``EvalConfig``, a policy family's config) is a
dataclass whose fields are declared with :func:`param` (default, help text, group). From it come:

- the job notebook's parameter check and coercion (:func:`from_mapping`: strings from papermill
  or a command line become the field's type; ``2.5`` for an int is an error, not a 2);
- the CLI options and ``--list-params`` (:func:`parse_cli`);
- the parameter tables in the book (:func:`markdown_table`).

``None`` is the one meaning of "no override" (use the default the job derives, for example the
policy's own ``replan_steps``); a field that accepts it is typed ``X | None``.

A field may take a different value in each run-size profile (:mod:`tutorial_utils.profiles`):
``param(2, "...", cpu=5000, gpu=20000)``. The first value is the ``ci`` profile's; ``cpu`` falls back
to it and ``gpu`` to ``cpu``. The dataclass's default is the active profile's value, so
``TrainConfig()``, the CLI, the job notebook's generated ``parameters`` cell
(:func:`parameters_cell`, written by ``python -m tutorial_utils job params --write``) and the
book's tables all show the same numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from tutorial_utils.errors import ConfigError, error_text


class _Same:
    """The value of the previous profile (``cpu`` falls back to ``ci``, ``gpu`` to ``cpu``)."""

    def __repr__(self) -> str:
        return "SAME"


SAME: Any = _Same()


def by_profile(ci: Any, cpu: Any = SAME, gpu: Any = SAME) -> dict[str, Any]:
    """``{"ci": ..., "cpu": ..., "gpu": ...}`` with the fallbacks filled in. ``None`` is a value
    like any other here (a profile's "no override"), never "fall back"."""
    cpu = ci if cpu is SAME else cpu
    return {"ci": ci, "cpu": cpu, "gpu": cpu if gpu is SAME else gpu}


def _fresh(value: Any) -> Any:
    return type(value)(value) if isinstance(value, (list, dict)) else value


def param(default: Any, help: str, group: str = "job", *, cpu: Any = SAME, gpu: Any = SAME, job: bool = True) -> Any:
    """A dataclass field with its help text and group (mutable defaults are copied per instance).

    ``default`` is the ``ci`` profile's value; ``cpu``/``gpu`` give the other profiles' values
    (see the module docstring). ``job=False`` keeps the field out of the job notebook's
    ``parameters`` cell (a value the job sets itself, such as the train job's ``output_dir``)."""
    meta: dict[str, Any] = {"help": help, "group": group, "job": job}
    if cpu is not SAME or gpu is not SAME:
        values = meta["profiles"] = by_profile(default, cpu, gpu)

        def factory() -> Any:
            from tutorial_utils import profiles

            return _fresh(values[profiles.current()])

        return dataclasses.field(default_factory=factory, metadata=meta)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: _fresh(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def at_least_one(**values: Any) -> None:
    """A ConfigError naming the first of ``values`` below 1 (``steps=0 must be >= 1``)."""
    for key, value in values.items():
        if int(value) < 1:
            raise ConfigError(f"{key}={value} must be >= 1")


def profile_values(f: dataclasses.Field) -> dict[str, Any]:
    """A field's value in each profile (the same value three times for a field without profiles)."""
    if "profiles" in f.metadata:
        return dict(f.metadata["profiles"])
    d = default_of(f)
    return {"ci": d, "cpu": d, "gpu": d}


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def type_name(cls, name: str) -> str:
    """``int``, ``float``, ``str``, ``bool``, ``tuple``, ``list[int]``... and ``| None`` for optional fields."""
    t = _hints(cls)[name]
    args = typing.get_args(t)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), t) if optional else t
    origin = typing.get_origin(base)
    if origin in (list, tuple):
        inner = typing.get_args(base)
        text = f"{origin.__name__}[{inner[0].__name__}]" if inner and isinstance(inner[0], type) else origin.__name__
    else:
        text = getattr(base, "__name__", str(base))
    return text + (" | None" if optional else "")


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def fields_info(cls, aliases: Mapping[str, str] | None = None) -> list[dict]:
    """One row per field: name, type, default (the active profile's), profiles (each profile's
    value), group, aliases, help."""
    inv: dict[str, list[str]] = {}
    for a, c in (aliases or {}).items():
        inv.setdefault(c, []).append(a)
    return [
        {
            "name": f.name,
            "type": type_name(cls, f.name),
            "default": default_of(f),
            "profiles": profile_values(f),
            "group": f.metadata.get("group"),
            "job": f.metadata.get("job", True),
            "aliases": inv.get(f.name, []),
            "help": f.metadata.get("help", ""),
        }
        for f in dataclasses.fields(cls)
        if f.metadata.get("help") is not None
    ]


def coerce(cls, name: str, value: Any, key: str | None = None) -> Any:
    """``value`` (a string from a command line, or a Python value) as the field's type.

    Raises :class:`ConfigError` naming the parameter, what was expected and what was given.
    """
    key = key or name
    t = type_name(cls, name)
    optional = t.endswith(" | None")
    base = t.removesuffix(" | None")
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if optional:
            return None
        if base == "str":
            return ""
        raise ConfigError(f"parameter {key}=None: expected {base} (this parameter has no 'no override' value)")
    try:
        if base == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if base == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError(value)
                return int(value)
            if isinstance(value, str):
                f = float(value)
                if not f.is_integer():
                    raise ValueError(value)
                return int(f)
            return int(value)
        if base == "float":
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if base == "str":
            if isinstance(value, (list, tuple)):
                return ",".join(map(str, value))
            return str(value)
        if base.startswith(("tuple", "list")):
            inner = float if "float" in base else int if "int" in base else str
            items = (
                value
                if isinstance(value, (list, tuple))
                else [v for v in str(value).strip("[]()").split(",") if v.strip()]
            )
            out = [coerce_scalar(inner, v) for v in items]
            return tuple(out) if base.startswith("tuple") else out
    except (TypeError, ValueError):
        raise ConfigError(f"parameter {key}={value!r}: expected {t}") from None
    return value


def coerce_scalar(kind: type, v: Any) -> Any:
    if kind is int:
        f = float(v)
        if not f.is_integer():
            raise ValueError(v)
        return int(f)
    return kind(v.strip() if isinstance(v, str) else v)


def unknown_parameter(key: str, known: Iterable[str], where: str) -> ConfigError:
    """A ConfigError for an unknown parameter name, with the closest known names."""
    close = difflib.get_close_matches(key, sorted(known), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown parameter {key!r}.{hint} Known parameters: {where}.")


def from_mapping(cls, values: Mapping[str, Any], where: str = "the job's --list-params", base: Any = None):
    """An instance of ``cls`` from ``{name: value}``; values are coerced, unknown names refused."""
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = dataclasses.asdict(base) if base is not None else {}
    for k, v in values.items():
        if k not in names:
            raise unknown_parameter(k, names, where)
        kwargs[k] = coerce(cls, k, v)
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        check()
    return obj


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` -> ``{key: value}``."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (for example steps=100)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def default_text(profiles: Mapping[str, Any]) -> str:
    """A default for a table: ``5`` or, when the profiles differ, ``ci 2, cpu 5000, gpu 20000``."""
    if len({repr(v) for v in profiles.values()}) == 1:
        return f"`{profiles['ci']!r}`"
    return ", ".join(f"{k} `{v!r}`" for k, v in profiles.items())


def markdown_table(
    cls,
    aliases: Mapping[str, str] | None = None,
    prefix: str = "",
    aliases_column: bool | None = None,
    derived: Mapping[str, str] | None = None,
) -> str:
    """The book's and ``--list-params``' table: parameter, type, default (each profile's where
    they differ), aliases, meaning. ``aliases_column`` None: the aliases column only when a
    parameter has one (an empty column costs the page width the meanings need). ``derived``:
    ``{field: text}`` added to a None default, what None becomes (``mini: `0.0003```)."""
    rows = fields_info(cls, aliases)
    derived = derived or {}
    with_aliases = any(r["aliases"] for r in rows) if aliases_column is None else aliases_column
    head = ["parameter", "type", "default", *(["aliases"] if with_aliases else []), "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        default = default_text(r["profiles"])
        if r["name"] in derived:
            default = f"{default} ({derived[r['name']]})"
        cells = [f"`{prefix}{r['name']}`", r["type"].replace(" | ", " or "), default]
        if with_aliases:
            cells.append(", ".join(f"`{a}`" for a in r["aliases"]))
        lines.append("| " + " | ".join([*cells, r["help"]]) + " |")
    return "\n".join(lines)


#: the first line of every generated ``parameters`` cell
GENERATED = "# generated from {classes} by `python -m tutorial_utils job params --write`: edit those, not this cell"


def _literal(value: Any) -> str:
    """A value as Python source (strings in double quotes, as the notebooks write them)."""
    if isinstance(value, str) and '"' not in value and "\\" not in value and "\n" not in value:
        return f'"{value}"'
    return repr(value)


def _comment(help: str, width: int = 110) -> str:
    text = " ".join(str(help).split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def parameters_cell(*classes: type, extra: Iterable[str] = ()) -> str:
    """The source of a job notebook's ``parameters`` cell, generated from its config classes:
    one line per field (``name = value`` or ``name = pick(ci=..., cpu=..., gpu=...)``) with its
    help as a comment, then the ``extra`` lines (``run_dir = ""``). A name in two classes is an error."""
    lines: list[str] = []
    seen: dict[str, str] = {}
    uses_pick = False
    for cls in classes:
        group = None
        for r in fields_info(cls):
            if not r["job"]:
                continue
            if r["name"] in seen:
                raise ConfigError(f"parameter {r['name']!r} is declared by both {seen[r['name']]} and {cls.__name__}")
            seen[r["name"]] = cls.__name__
            if r["group"] != group:
                group = r["group"]
                lines.append(f"# {cls.__name__}: {group}")
            v = r["profiles"]
            if len({repr(x) for x in v.values()}) == 1:
                value = _literal(v["ci"])
            else:
                uses_pick = True
                value = f"pick(ci={_literal(v['ci'])}, cpu={_literal(v['cpu'])}, gpu={_literal(v['gpu'])})"
            lines.append(f"{r['name']} = {value}  # {_comment(r['help'])}")
    head = [GENERATED.format(classes=", ".join(c.__name__ for c in classes))]
    if uses_pick:
        head += ["from tutorial_utils.profiles import pick", ""]
    return "\n".join([*head, *lines, *extra])


def add_arguments(parser: argparse.ArgumentParser, cls, skip: Iterable[str] = ()) -> None:
    """One ``--name`` option per field (strings; :func:`from_mapping` coerces them)."""
    skip = set(skip)
    for r in fields_info(cls):
        if r["name"] in skip:
            continue
        flag = r["type"] == "bool"  # ``--debug`` alone means true; ``--debug false`` works too
        parser.add_argument(
            "--" + r["name"].replace("_", "-"),
            dest=r["name"],
            default=argparse.SUPPRESS,
            metavar=r["type"].upper().replace(" | NONE", ""),
            help=f"{r['help']} (default: {r['default']!r})",
            **({"nargs": "?", "const": "true"} if flag else {}),
        )


def _arg_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def to_argv(cfg: Any, changed_only: bool = True) -> list[str]:
    """A config as the command-line options :func:`parse_cli` reads back into the same config:
    ``["--name", "value", ...]``, by default only the fields that differ from their defaults
    (in the active profile). The one way a process passes a config to a child's command line."""
    out: list[str] = []
    for f in dataclasses.fields(cfg):
        if f.metadata.get("help") is None:
            continue
        value = getattr(cfg, f.name)
        if changed_only and value == default_of(f) and type(value) is type(default_of(f)):
            continue
        out += ["--" + f.name.replace("_", "-"), _arg_text(value)]
    return out


def like(cls, name: str, **changes: Any) -> Any:
    """Field ``name`` of config ``cls`` declared again, with its default, per-profile values and
    help (``help=``, ``group=``, ``job=`` change them): for a config that hands the value on to
    another job, such as the evaluation's ``checkpoint`` that goes to the server's."""
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if f is None:
        raise ConfigError(f"{cls.__name__} has no parameter {name!r}")
    meta = {**f.metadata, **changes}
    v = profile_values(f)
    extra = {} if "profiles" not in f.metadata else {"cpu": v["cpu"], "gpu": v["gpu"]}
    return param(v["ci"], meta["help"], meta.get("group", "job"), job=meta.get("job", True), **extra)


def parse_cli(cls, argv: list[str], prog: str, description: str):
    """A job's CLI generated from its config: one ``--name`` option per field, ``--config FILE``
    (a JSON file of parameters, as a job writes it; options beside it override it) and
    ``--list-params``. Returns the config, or None after printing the table; a bad parameter
    prints the teaching error and exits with status 2."""
    import sys

    from tutorial_utils.errors import TutorialError

    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--config", default=None, help=f"a JSON file of {cls.__name__} parameters; options override it")
    ap.add_argument("--list-params", action="store_true", help="print every parameter, default and meaning")
    add_arguments(ap, cls)
    args = ap.parse_args(argv)
    if args.list_params:
        print(markdown_table(cls))
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        base = read_json(cls, args.config) if args.config else None
        return from_mapping(cls, {k: v for k, v in vars(args).items() if k in names}, f"`{prog} --list-params`", base)
    except TutorialError as exc:
        print(error_text(exc), file=sys.stderr)
        raise SystemExit(2) from None


def write_json(cfg: Any, path) -> Any:
    """Write a config as JSON (atomically); :func:`read_json` reads it back."""
    from tutorial_utils.io import atomic_write_json

    return atomic_write_json(path, dataclasses.asdict(cfg))


def read_json(cls, path) -> Any:
    """A config from a JSON file written by :func:`write_json` (names and types checked)."""
    import json
    from pathlib import Path

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{p}: cannot read the job config ({exc}); it is written by the job that starts this process."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object of parameters, found {type(data).__name__}.")
    return from_mapping(cls, data, str(p))


def parse_task_ids(task_ids: Any) -> list[int] | None:
    """``"all"``, ``""`` or None -> None (every task); ``"0-4"``, ``"0,3"``, ``"0-2,5"``, an int or a
    list of ints -> a list of task ids. The one parser behind the record and evaluate jobs."""
    if task_ids is None or (isinstance(task_ids, str) and task_ids.strip().lower() in ("", "all")):
        return None
    if isinstance(task_ids, bool):
        raise ConfigError(f"task_ids={task_ids!r}: use 'all', '0-4', '0,3' or a list of integers")
    if isinstance(task_ids, int) or (hasattr(task_ids, "dtype") and getattr(task_ids, "ndim", 1) == 0):
        return [int(task_ids)]
    try:
        if isinstance(task_ids, str):
            out: list[int] = []
            for part in task_ids.split(","):
                part = part.strip()
                if "-" in part:
                    a, b = part.split("-", 1)
                    if int(b) < int(a):
                        raise ValueError(part)
                    out += list(range(int(a), int(b) + 1))
                elif part:
                    out.append(int(part))
            return out
        return [coerce_scalar(int, t) for t in task_ids]
    except (TypeError, ValueError):
        raise ConfigError(f"task_ids={task_ids!r}: use 'all', '0-4', '0,3' or a list of integers") from None


def collect(namespace: Mapping[str, Any], *classes: type) -> dict[str, Any]:
    """The values in ``namespace`` (a job notebook's ``globals()``) whose names are fields of
    ``classes``: the job's parameters cell, handed to ``run_job(run_dir, **params)`` as it is."""
    names = [f.name for cls in classes for f in dataclasses.fields(cls) if f.metadata.get("help") is not None]
    return {n: namespace[n] for n in names if n in namespace}
