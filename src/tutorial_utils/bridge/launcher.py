"""One-dataset mixture registration without editing upstream files.

Upstream's ``train.py`` looks ``--datasets.vla_data.data_mix`` up in ``DATASET_NAMED_MIXTURES``
(``DiT4DiT/dataloader/gr00t_lerobot/mixtures.py``), which only knows ``libero_all`` for LIBERO.
Instead of editing that file, the bridge writes a tiny launcher script into the run directory;
``accelerate launch`` runs it in place of ``train.py``. The launcher imports upstream's mixtures
module, adds ``{name: [(dataset, weight, robot_config)]}`` to the dict in memory (the data loader
imports the same dict object by name), points ``sys.argv`` at ``train.py`` and runs it as
``__main__`` with :func:`runpy.run_path`. The script runs under the model's Python (3.10+, with
upstream's packages), so it imports nothing from this project.
"""

from __future__ import annotations

import os
from pathlib import Path

from tutorial_utils.bridge.checkout import MIXTURES_MODULE, TRAIN_PY
from tutorial_utils.errors import ConfigError

LAUNCHER_NAME = "launch_train.py"
ROBOT_CONFIG = "libero_franka"

_TEMPLATE = '''"""Written by tutorial_utils.bridge (launcher.py); run by `accelerate launch` in place of train.py.

Registers the data mixture {mixture!r} in upstream's DATASET_NAMED_MIXTURES, in memory only
(mixtures.py is not edited), then runs {train_py} as __main__ with the same arguments.
Run it from the checkout root with PYTHONPATH set to the checkout root, as train.py itself.
"""

import runpy
import sys

from {module} import DATASET_NAMED_MIXTURES

MIXTURE = {mixture!r}
ENTRIES = {entries!r}
TRAIN_PY = {train_py!r}

known = DATASET_NAMED_MIXTURES.get(MIXTURE)
if known is not None and [tuple(e) for e in known] != ENTRIES:
    sys.exit(
        f"mixture {{MIXTURE!r}} already exists upstream with other entries {{known}}; "
        "pick another mixture name (bridge parameter `mixture`)"
    )
DATASET_NAMED_MIXTURES[MIXTURE] = list(ENTRIES)
print(f"[bridge] data mixture {{MIXTURE!r}} registered in memory: {{ENTRIES}}", flush=True)
sys.argv = [TRAIN_PY, *sys.argv[1:]]
runpy.run_path(TRAIN_PY, run_name="__main__")
'''


def mixture_entries(datasets: str | list[str], weight: float = 1.0, robot: str = ROBOT_CONFIG) -> list[tuple]:
    """``[(dataset_name, weight, robot_config), ...]`` for one dataset name or several."""
    names = [datasets] if isinstance(datasets, str) else list(datasets)
    names = [n.strip() for n in names if n and n.strip()]
    if not names:
        raise ConfigError(
            "the mixture needs a dataset name (bridge parameter `dataset`), e.g. libero_spatial_no_noops_1.0.0_lerobot"
        )
    for n in names:
        if "/" in n or os.sep in n:
            raise ConfigError(
                f"dataset {n!r}: a mixture entry is a folder name under data_dir (upstream's data_root_dir), "
                "not a path. Pass the folder name and set data_dir to its parent."
            )
    return [(n, float(weight), robot) for n in names]


def launcher_source(mixture: str, entries: list[tuple], train_py: str = TRAIN_PY) -> str:
    """The launcher script's text."""
    if not mixture or not mixture.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"mixture name {mixture!r}: use letters, digits, '_' or '-' (e.g. tutorial_libero_spatial)")
    clean = [(str(n), float(w), str(r)) for n, w, r in entries]
    return _TEMPLATE.format(mixture=mixture, entries=clean, train_py=train_py, module=MIXTURES_MODULE)


def write_launcher(run_dir: str | os.PathLike, mixture: str, entries: list[tuple]) -> Path:
    """Write the launcher into ``run_dir`` (atomically) and return its path."""
    from tutorial_utils.io import atomic_write_text

    path = Path(run_dir) / LAUNCHER_NAME
    atomic_write_text(path, launcher_source(mixture, entries))
    return path
