"""A training run's directory: the names of the files the trainer writes there (the whole list,
with what each holds, is in :mod:`tutorial_utils.train.loop`; the checkpoints' names, ``train_config.json``
and ``metrics.jsonl`` are in :mod:`tutorial_utils.train.checkpoints`) and its lock, held by the main
process for the whole run (:func:`hold_lock`)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tutorial_utils.train.checkpoints import LOCK_FILE, OutputDirInUse, lock_output_dir, remove_stale_temps

LOG_FILE = "train.log"
SUMMARY_FILE = "summary.json"
CONTROL_FILE = "control.json"
#: the sample predictions of each validation: ``samples/step_000100.json`` (predicted vs true chunk)
SAMPLES_DIR = "samples"


def hold_lock(out: Path, acc, main: bool, held: contextlib.ExitStack) -> None:
    """The main process takes the run directory's lock (held until ``held`` closes); every rank
    learns whether it got it, so a refused launch stops on all ranks instead of hanging."""
    import torch

    refused: OutputDirInUse | None = None
    if main:
        try:
            held.callback(os.close, lock_output_dir(out))
        except OutputDirInUse as exc:
            refused = exc
    if acc.num_processes > 1:
        flag = acc.reduce(torch.tensor([1.0 if refused else 0.0], device=acc.device), reduction="sum")
        if refused is None and float(flag[0]) > 0:
            raise OutputDirInUse(
                f"{out} is in use by another training process (the main process of this launch could not take "
                f"its lock, {out / LOCK_FILE}; its error names the holder)."
            )
    if refused is not None:
        raise refused
    if main:
        stale = remove_stale_temps(out / "checkpoints")
        if stale:
            print(
                f"removed {len(stale)} unfinished checkpoint folder(s) left by an interrupted save: {', '.join(stale)}",
                file=sys.stderr,
            )
