"""The health checks a training process can run on itself while it trains.

:class:`TrainingWatch` runs, at each validation of the main process, the checks that need only the
metrics rows, the config and the disk: a diverging loss, a warm-up longer than the run, data-bound
training (data wait above :data:`DATA_WAIT_LIMIT` of the step time) and a disk that will not hold
the checkpoints still to come. A new finding is written once to ``train.log`` (the
:data:`tutorial_utils.logs.TRAIN_HEALTH` line, with its fix) and to ``status.json`` as ``health``,
so a batch run that nobody watches carries its warnings while it trains. A non-finite loss stops
the loop itself (``NonFiniteLoss``).

:mod:`tutorial_utils.runs.health` runs the same checks on any run directory afterwards, plus the
ones that need the registry or an evaluation (stale heartbeat, "the loss falls but success is
0" and its checklist); the monitor shows them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import jobs
from tutorial_utils import logs as L
from tutorial_utils.io import dir_size, human_bytes
from tutorial_utils.train import checkpoints as ck

SEVERITIES = ("error", "warning", "info")
#: data-bound when the data wait is above this share of the step time
DATA_WAIT_LIMIT = 0.30
#: diverging when the last window's mean loss is above this multiple of the best window's
DIVERGE_RATIO = 1.5
#: ... and has given back at least this share of the improvement from the first window
DIVERGE_GIVE_BACK = 0.25
#: the states in which a run may still write checkpoints (the disk check looks ahead for them)
STATES_THAT_CONTINUE = ("running", "stale", "paused", "stopped")


@dataclass
class Finding:
    """One problem found in a run: ``severity`` is ``error``, ``warning`` or ``info``; ``message``
    says what was seen (naming the file), ``fix`` what to do."""

    code: str
    severity: str
    message: str
    fix: str


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _window_means(values: list[float], w: int) -> list[float]:
    return [sum(values[i : i + w]) / w for i in range(len(values) - w + 1)]


def loss_windows(train: list[dict]) -> tuple[int, list[float], list[int]] | None:
    """(window, the sliding window means of the finite losses, the step at each window's end);
    None with fewer than two windows of rows."""
    pts = [(r["step"], float(r["loss"])) for r in train if (v := _num(r.get("loss"))) is not None and math.isfinite(v)]
    w = max(3, len(pts) // 10)
    if len(pts) < 2 * w:
        return None
    means = _window_means([v for _, v in pts], w)
    return w, means, [s for s, _ in pts][w - 1 :]


def first_phase_steps(cfg: dict) -> int:
    """Steps of the run's first training phase (``first_phase_steps`` of its family under its
    ``policy_config``; 0 when the config names no family this project knows). VQ-BeT's loss jumps
    where its GPT phase starts (the offset loss, weighted 10000, replaces the code loss): a new loss,
    not a diverging one."""
    from tutorial_utils import policies
    from tutorial_utils.errors import TutorialError

    try:
        return policies.first_phase_steps(str(cfg.get("policy")), cfg.get("policy_config") or {})
    except (TutorialError, ValueError, TypeError):  # an unknown family or an old config: judge every row
        return 0


def check_diverging(d: Path, train: list[dict], cfg: dict | None = None) -> list[Finding]:
    """``diverging_loss``: the last window mean is :data:`DIVERGE_RATIO` x above the running
    minimum of the window means and has given back :data:`DIVERGE_GIVE_BACK` of the improvement.
    Only the rows after the family's first phase count (:func:`first_phase_steps` of ``cfg``)."""
    first = first_phase_steps(cfg or {})
    got = loss_windows([r for r in train if (_num(r.get("step")) or 0) > first] if first else train)
    if got is None:
        return []
    w, means, steps = got
    i_min = min(range(len(means)), key=means.__getitem__)
    low, last, first = means[i_min], means[-1], means[0]
    rise = last - low
    if not (rise > (DIVERGE_RATIO - 1.0) * max(abs(low), 1e-12) and rise >= DIVERGE_GIVE_BACK * (first - low)):
        return []
    lrs = [v for r in train if (v := _num(r.get("lr"))) is not None]
    above_start = last > first
    return [
        Finding(
            "diverging_loss",
            "error" if above_start else "warning",
            f"the loss (mean over {w} log rows) rose from its minimum {low:.4g} at step {steps[i_min]} to {last:.4g} at "
            f"step {steps[-1]} ({last / low if low > 0 else float('inf'):.1f}x; it started at {first:.4g})"
            + (f"; learning rate now {lrs[-1]:.3g}" if lrs else "")
            + f" ({d / ck.METRICS_FILE}).",
            "lower optimizer_lr (a resume may change it: `runs resume RUN optimizer_lr=...`, or `runs rollback RUN "
            f"step_...` to the checkpoint near step {steps[i_min]}), lengthen scheduler_warmup_steps, keep "
            "optimizer_grad_clip_norm above 0; with a small batch_size, a larger one smooths the loss.",
        )
    ]


def check_warmup(d: Path, cfg: dict, train: list[dict]) -> list[Finding]:
    """``warmup_longer_than_run``: the learning rate never reaches ``optimizer_lr``."""
    warm, steps, lr = _num(cfg.get("scheduler_warmup_steps")), _num(cfg.get("steps")), _num(cfg.get("optimizer_lr"))
    if not warm or not steps or warm < steps:
        return []
    seen = max((v for r in train if (v := _num(r.get("lr"))) is not None), default=None)
    peak = f"; the highest learning rate logged is {seen:.3g}" if seen is not None else ""
    return [
        Finding(
            "warmup_longer_than_run",
            "warning",
            f"scheduler_warmup_steps={int(warm)} >= steps={int(steps)} ({d / ck.CONFIG_FILE}): the learning rate is still "
            f"warming up when the run ends and never reaches optimizer_lr={lr}{peak}.",
            f"set scheduler_warmup_steps to 5-10% of steps (here about {max(1, int(steps) // 10)}), or train longer.",
        )
    ]


def check_data_bound(d: Path, cfg: dict, train: list[dict]) -> list[Finding]:
    """``data_bound``: the median ``data_wait_share`` of the later half of the log rows (the
    first rows include the workers' start) is above :data:`DATA_WAIT_LIMIT`."""
    shares = [v for r in train if (v := _num(r.get("data_wait_share"))) is not None and math.isfinite(v)]
    if not shares:
        return []
    later = sorted(shares[len(shares) // 2 :])
    median = later[len(later) // 2]
    if median <= DATA_WAIT_LIMIT:
        return []
    sps = [v for r in train[len(train) // 2 :] if (v := _num(r.get("samples_per_s"))) is not None]
    rate = f", {sum(sps) / len(sps):.1f} samples/s" if sps else ""
    workers = cfg.get("num_workers")
    return [
        Finding(
            "data_bound",
            "warning",
            f"the model waits for data {median:.0%} of each step (median data_wait_share over the last {len(later)} log "
            f"rows{rate}; limit {DATA_WAIT_LIMIT:.0%}), with num_workers={workers} ({d / ck.METRICS_FILE}).",
            f"raise num_workers (this machine has {os.cpu_count()} CPU cores), raise data_cache_mb so decoded videos stay "
            "in memory, keep the dataset on a local disk; on a GPU a larger batch_size also amortises the loading.",
        )
    ]


def _save_steps(step: int, total: int, save_freq: int) -> list[int]:
    """The steps after ``step`` at which the loop will save: multiples of save_freq, and the end."""
    out = list(range((step // save_freq + 1) * save_freq, total, save_freq)) if save_freq > 0 else []
    return out + [total] if step < total else out


def check_disk(d: Path, cfg: dict, status: dict, state: str, free_bytes: int | None = None) -> list[Finding]:
    """``disk_shortfall``: the newest checkpoint's size x the saves still to come (bounded by
    ``keep_last``, which deletes one old checkpoint after each new one) plus one copy of the
    weights (``best`` and ``final_model`` are written beside the old ones) against the free space."""
    if state not in STATES_THAT_CONTINUE or cfg.get("save_checkpoint") is False:
        return []
    root = d / ck.CHECKPOINTS_DIR
    existing = ck.step_dirs(root)
    total = _num(cfg.get("steps"))
    if not existing or not total:
        return []
    newest = existing[-1]
    size = dir_size(newest)
    weights = sum(p.stat().st_size for p in newest.glob("*.safetensors"))
    training = status.get("training") if isinstance(status.get("training"), dict) else {}
    step = training.get("step") if isinstance(training.get("step"), int) else ck.checkpoint_step(newest) or 0
    saves = _save_steps(int(step), int(total), int(cfg.get("save_freq") or 0))
    if not saves:
        return []
    keep = int(cfg.get("keep_last") or 0)
    n_needed = len(saves) if keep <= 0 else min(len(saves), max(1, keep - len(existing) + 1))
    need_next, need_all = size + weights, size * n_needed + weights
    free = shutil.disk_usage(d).free if free_bytes is None else int(free_bytes)
    if free >= need_all:
        return []
    fits = max(0, (free - weights) // size) if size else len(saves)
    fails_at = saves[min(int(fits), len(saves) - 1)] if keep <= 0 else saves[0]
    nxt = free < need_next
    return [
        Finding(
            "disk_shortfall",
            "error" if nxt else "warning",
            f"{human_bytes(free)} free on the disk of {d}; each checkpoint takes {human_bytes(size)} ({newest.name}) "
            f"and {len(saves)} save(s) remain (steps {', '.join(map(str, saves[:4]))}{'...' if len(saves) > 4 else ''}; "
            f"keep_last={keep}), about {human_bytes(need_all)} with the best/final weights: "
            + (
                f"the next checkpoint (step {saves[0]}) does not fit."
                if nxt
                else f"the disk fills at about step {fails_at}."
            ),
            "free space (`python -m tutorial_utils runs list` shows each run's size; `runs delete RUN`, `runs prune RUN "
            "N`), or set keep_last (e.g. keep_last=2 on resume via a copy), a larger save_freq, or an output_dir on a "
            "larger disk.",
        )
    ]


def training_findings(
    d: Path, cfg: dict, rows: list[dict], status: dict, state: str, free_bytes: int | None = None
) -> list[Finding]:
    """The checks of this module on one run: diverging loss, warm-up, data-bound, disk
    (``free_bytes`` replaces the measured free space: tests, planning)."""
    return [
        *check_diverging(d, rows, cfg),
        *check_warmup(d, cfg, rows),
        *check_data_bound(d, cfg, rows),
        *check_disk(d, cfg, status, state, free_bytes),
    ]


def record_health(run_dir: str | os.PathLike, health: dict) -> dict:
    """Write ``health`` (stamped with the time it was ``checked``) into the run's ``status.json``,
    replacing the diagnosis there, whoever made it (this module's watch or
    :func:`tutorial_utils.runs.health.record`). Returns what was written."""
    health = json.loads(
        json.dumps({**health, "checked": _dt.datetime.now().isoformat(timespec="seconds")}, default=str)
    )
    jobs.update_status(run_dir, health=None)  # replace, not merge: no key of an older diagnosis stays
    jobs.update_status(run_dir, health=health)
    return health


class TrainingWatch:
    """The training process's own health check (main process only), called at each validation
    with the training rows written so far. Logs each finding once (again only when its severity
    changes) through ``log`` and records the current findings in ``status.json`` each time."""

    def __init__(self, out: Path, cfg: dict, log: Callable[[str], None]):
        self.out, self.cfg, self.log = Path(out), cfg, log
        self.reported: dict[str, str] = {}

    def __call__(self, step: int, rows: list[dict]) -> list[Finding]:
        findings = training_findings(self.out, self.cfg, rows, jobs.read_status(self.out), "running")
        findings.sort(key=lambda f: SEVERITIES.index(f.severity))
        new = [f for f in findings if self.reported.get(f.code) != f.severity]
        for f in new:
            self.log(L.TRAIN_HEALTH.format(step=step, severity=f.severity, code=f.code, message=f.message, fix=f.fix))
        record_health(
            self.out,
            {
                "state": "running",
                "ok": not any(f.severity == "error" for f in findings),
                "findings": [asdict(f) for f in findings],
                "checklist": [],
                "by": f"the training process at step {step}",
            },
        )
        self.reported = {f.code: f.severity for f in findings}
        return new
