"""The trackers practitioners open: every ``metrics.jsonl`` row mirrored to TensorBoard event
files and to Weights & Biases in offline mode, each switched on by a training parameter
(``tensorboard=true``, ``wandb=true``). Main process only.

- TensorBoard: ``<output_dir>/tensorboard/events.out.tfevents.*`` (``tensorboard --logdir runs``).
  A resumed run purges the events past its checkpoint, as ``metrics.jsonl`` drops its rows.
- W&B: ``<output_dir>/wandb/offline-run-*/run-<id>.wandb``. Offline: no account, no network, no
  API key read or stored; ``wandb sync <output_dir>/wandb/offline-run-*`` uploads it later
  (each resume is another offline folder with the same run id, so they sync into one run).

Each numeric value of a row is logged under its ``metrics.jsonl`` name at the row's ``step``
(booleans as 0/1; ``time`` and strings are left out). Nothing is imported or written when both
are off; a missing package is a :class:`~tutorial_utils.errors.ConfigError` before training.
:func:`read_tensorboard` and :func:`read_wandb` read the files back with each tool's own reader.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
#: row keys that are not metrics
NOT_METRICS = ("step", "time")


def scalars(row: dict) -> dict[str, float]:
    """The row's metrics as floats (booleans 0/1); ``step``, ``time`` and non-numbers left out."""
    out = {}
    for k, v in row.items():
        if k in NOT_METRICS or not isinstance(v, (int, float)):
            continue
        out[k] = float(v)
    return out


def _missing(package: str, flag: str) -> ConfigError:
    return ConfigError(
        f"{flag}=true needs the {package} package, which is not installed: install the version pinned in "
        f"requirements.txt (`pip install -r requirements.txt`), or train with {flag}=false."
    )


def wandb_run_id(out: Path, run_id: str) -> str:
    """A W&B run id for the run directory: its name (W&B's allowed characters) and a short hash of
    its absolute path, the same on every resume."""
    base = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[:48] or "run"
    return f"{base}-{hashlib.sha1(str(Path(out).resolve()).encode()).hexdigest()[:8]}"


def check_available(cfg) -> None:
    """A :class:`ConfigError` now, before any training, when an enabled tracker's package is missing."""
    if cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise _missing("tensorboard", "tensorboard") from None
    if cfg.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise _missing("wandb", "wandb") from None


class Trackers:
    """The enabled trackers of one run; :meth:`log` takes a ``metrics.jsonl`` row."""

    def __init__(self, out: Path, cfg, run_id: str, start_step: int = 0):
        self.out = Path(out)
        self.tb = self.wb = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise _missing("tensorboard", "tensorboard") from None
            # purge_step: a resumed run hides the events logged past its checkpoint (step > start_step)
            self.tb = SummaryWriter(
                log_dir=str(self.out / TENSORBOARD_DIR),
                purge_step=start_step + 1 if start_step else None,
                flush_secs=30,
            )
        if cfg.wandb:
            try:
                import wandb
            except ImportError:
                raise _missing("wandb", "wandb") from None
            (self.out / WANDB_DIR).mkdir(exist_ok=True)
            config = cfg.to_dict()
            self.wb = wandb.init(
                mode="offline",  # never the network, never an account or a key
                dir=str(self.out),
                project=cfg.wandb_project,
                name=run_id,
                id=wandb_run_id(self.out, run_id),
                config=config,
                save_code=False,
                settings=wandb.Settings(console="off"),  # the loop's own stdout stays as it is
            )

    def log(self, row: dict) -> None:
        values = scalars(row)
        if not values or "step" not in row:
            return
        step = int(row["step"])
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, global_step=step)
        if self.wb is not None:
            self.wb.log(values, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wb is not None:
            self.wb.finish()
            self.wb = None


# --- reading the files back with each tool's own reader ------------------------------------------


def read_tensorboard(out: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from ``<out>/tensorboard`` via TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out) / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_files(out: str | os.PathLike) -> list[Path]:
    """The offline runs' ``.wandb`` files under ``<out>/wandb``, oldest first."""
    return sorted((Path(out) / WANDB_DIR).glob("offline-run-*/run-*.wandb"))


def read_wandb(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The history rows (``{key: value, "_step": step}``) of one offline ``.wandb`` file, read with
    W&B's own record reader (the one ``wandb sync`` uses)."""
    import json

    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    ds = datastore.DataStore()
    ds.open_for_scan(str(path))
    rows = []
    while True:
        try:
            data = ds.scan_data()
        except AssertionError:  # an unfinished last block (a run still writing)
            break
        if data is None:
            break
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows
