"""Diagnose a training run from its files: what is wrong, and what to do about it.

:func:`diagnose` reads a run directory (``status.json``, ``metrics.jsonl``, ``train.log``,
``train_config.json``, checkpoints, ``dataset_statistics.json``, the dataset's ``meta/``) and
returns :class:`Finding` s, each with a ``code``, a ``severity`` (``error``, ``warning``,
``info``), a ``message`` that says what it saw and a ``fix``:

=========================  ======================================================================
``stale``                  status.json says running, but the process is gone or its heartbeat is
                           old (the registry's rule: :func:`tutorial_utils.jobs.run_state`)
``non_finite_loss``        a NaN or infinite loss (a metrics row, the loop's ``NonFiniteLoss``)
``diverging_loss``         the loss, averaged over a window, rose well above its running minimum
                           (after a family's first phase: VQ-BeT's GPT loss is a new loss)
``warmup_longer_than_run`` ``scheduler_warmup_steps >= steps``: the peak learning rate is never used
``data_bound``             the data wait is more than 30% of the step time (``data_wait_share``)
``disk_shortfall``         checkpoint size x the saves still to come does not fit in the free space
``loss_falls_success_0``   the loss fell but every evaluated checkpoint has success rate 0: see the
                           checklist
=========================  ======================================================================

and a checklist for "the loss falls but success is 0" (:class:`Check`: ``pass``, ``fail`` or
``unknown`` when the run's files do not allow the check, each saying what it looked at):
normalisation statistics present and non-degenerate, gripper sign convention, camera keys of the
dataset, image orientation.

:func:`record` writes the diagnosis into ``status.json`` (``health``) for the monitor.
CLI: ``python -m tutorial_utils runs diagnose RUN [--write] [--json]`` (exit code 1 on an error).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils import jobs
from tutorial_utils import logs as L
from tutorial_utils.io import read_json_or_empty
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs.registry import read_metrics, resolve, run_state
from tutorial_utils.train import checkpoints as ck
from tutorial_utils.train.checkpoints import CONFIG_FILE
from tutorial_utils.train.rundir import LOG_FILE, SUMMARY_FILE
from tutorial_utils.train.watch import (  # the checks the training process also runs on itself
    SEVERITIES,
    Finding,
    _num,
    loss_windows,
    record_health,
    training_findings,
)

#: the loss "falls" when the last window's mean is below this share of the first window's
FALLS_RATIO = 0.8
#: a normalised action dimension with 0 < max - min below this is degenerate: min-max normalisation
#: divides by the span, so noise of that size becomes the whole [-1, 1] range (a span of 0 is a
#: constant, which the normaliser leaves alone)
DEGENERATE_SPAN = 1e-4
#: below this a span is 0 (policies.normalize.ActionNormalizer uses the same limit)
CONSTANT_SPAN = 1e-8
#: the orientation check compares the first frames of up to this many videos on each side
ORIENTATION_FRAMES = 4
#: ... and decides when one orientation is more similar than the other by this much
ORIENTATION_MARGIN = 0.1
_NONFINITE_LINE = L.TRAIN_NONFINITE_LOSS.split("{", 1)[0]


@dataclass
class Check:
    """One item of the "loss falls but success is 0" checklist."""

    name: str
    status: str  # pass, fail, unknown
    checked: str  # what was looked at
    detail: str


@dataclass
class Diagnosis:
    run: str
    path: str
    state: str
    findings: list[Finding] = field(default_factory=list)
    checklist: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "path": self.path,
            "state": self.state,
            "ok": self.ok,
            "findings": [asdict(f) for f in self.findings],
            "checklist": [asdict(c) for c in self.checklist],
        }

    def text(self) -> str:
        lines = [f"run {self.run} ({self.state}): {len(self.findings)} finding(s)"]
        for f in self.findings:
            lines += [f"  [{f.severity}] {f.code}: {f.message}", f"      fix: {f.fix}"]
        if not self.findings:
            lines.append("  no problem found")
        lines.append('checklist for "the loss falls but success is 0":')
        mark = {"pass": "pass", "fail": "FAIL", "unknown": "  ? "}
        for c in self.checklist:
            lines += [f"  {mark[c.status]}  {c.name}: {c.detail}", f"        checked: {c.checked}"]
        return "\n".join(lines)


# --- the checks ------------------------------------------------------------------------------------


def check_stale(d: Path, status: dict, state: str) -> list[Finding]:
    """``stale``: says why (process gone on this host, or the heartbeat's age)."""
    if state != "stale":
        return []
    why = []
    for name, entry in (("training", status.get("training")), ("job", status)):
        if not isinstance(entry, dict) or entry.get("state") != "running":
            continue
        pid, host = entry.get("pid"), entry.get("host")
        if host == socket.gethostname() and isinstance(pid, int) and not jobs.pid_alive(pid):
            why.append(f"its {name} process (pid {pid} on {host}) is gone")
            continue
        try:
            updated = _dt.datetime.fromisoformat(str(entry["updated"]))
            age = (_dt.datetime.now(updated.tzinfo) - updated).total_seconds()
            why.append(
                f"its {name} heartbeat is {age:.0f} s old (stale after {jobs.STALE_AFTER_S:.0f} s; pid {pid} on {host})"
            )
        except (KeyError, ValueError):
            pass
    if not why:
        why.append(f"it has training files but no heartbeat and no {SUMMARY_FILE}: the process died early")
    return [
        Finding(
            "stale",
            "error",
            f"{d / jobs.STATUS_FILE} says running, but {'; '.join(why)}. The run is not training.",
            f"resume it from its last checkpoint (`python -m tutorial_utils runs resume {d.name}`), or delete it "
            f"(`python -m tutorial_utils runs delete {d.name}`). If it runs on another host, check there first.",
        )
    ]


def check_non_finite(d: Path, train: list[dict], status: dict) -> list[Finding]:
    """``non_finite_loss``: a NaN/inf in a metrics row, the loop's error or its log line."""
    seen = []
    for r in train:
        bad = [
            k for k in ("loss", "loss_mean", "grad_norm") if (v := _num(r.get(k))) is not None and not math.isfinite(v)
        ]
        if bad:
            seen.append(f"{', '.join(bad)} non-finite at step {r['step']} ({d / ck.METRICS_FILE})")
            break
    err = str((status.get("training") or {}).get("error") or "")
    if err.startswith("NonFiniteLoss"):
        seen.append(f"training stopped with {err[:160]} ({d / jobs.STATUS_FILE})")
    try:
        line = next((x for x in (d / LOG_FILE).read_text(errors="replace").splitlines() if _NONFINITE_LINE in x), None)
    except OSError:
        line = None
    if line and not err:
        seen.append(f"{d / LOG_FILE}: {line.strip()[:160]}")
    if not seen:
        return []
    return [
        Finding(
            "non_finite_loss",
            "error",
            "the loss became NaN or infinite: " + "; ".join(seen) + ".",
            "lower optimizer_lr (or lengthen scheduler_warmup_steps), keep optimizer_grad_clip_norm above 0, check the "
            "data for NaN (`python -m tutorial_utils dataset validate --deep DATASET`); then resume from the last good "
            "checkpoint with the lower rate (`runs resume RUN optimizer_lr=...`).",
        )
    ]


# --- the checklist -------------------------------------------------------------------------------


def _stats_action(stats: dict) -> dict | None:
    from tutorial_utils.policies.normalize import EMBODIMENT

    block = stats.get(EMBODIMENT) if isinstance(stats, dict) else None
    act = block.get("action") if isinstance(block, dict) else None
    return act if isinstance(act, dict) else None


def check_statistics(d: Path, newest: Path | None) -> Check:
    """Normalisation statistics: present, finite, no degenerate normalised action dimension (a
    tiny span, or every dimension constant: statistics of the wrong column), and the checkpoint
    carries the same ones as the run. A constant dimension alone is noted, not failed."""
    from tutorial_utils.policies.normalize import EMBODIMENT, STATS_FILE

    path = d / STATS_FILE
    checked = f"{path}" + (f" and {newest / STATS_FILE}" if newest is not None else "")
    stats = read_json_or_empty(path)
    if not stats:
        return Check("normalisation statistics", "unknown" if not path.exists() else "fail", checked,
                     f"{path.name} is missing or not JSON: the run's normalisation cannot be checked")  # fmt: skip
    act = _stats_action(stats)
    if act is None or "min" not in act or "max" not in act:
        return Check("normalisation statistics", "fail", checked,
                     f"no {EMBODIMENT}.action min/max in {path.name}: recompute with `python -m tutorial_utils dataset "
                     "stats DATASET`")  # fmt: skip
    lo, hi = act["min"], act["max"]
    mask = act.get("mask") or [True] * (len(lo) - 1) + [False]
    problems, constant = [], []
    if not (len(lo) == len(hi) == len(mask)):
        problems.append(f"min/max/mask lengths differ ({len(lo)}, {len(hi)}, {len(mask)})")
    else:
        bad = [i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if not (math.isfinite(a) and math.isfinite(b))]
        spans = {i: b - a for i, (a, b, m) in enumerate(zip(lo, hi, mask, strict=True)) if m and i not in bad}
        tiny = [i for i, s in spans.items() if CONSTANT_SPAN <= s < DEGENERATE_SPAN]
        constant = [i for i, s in spans.items() if s < CONSTANT_SPAN]
        if bad:
            problems.append(f"non-finite min/max in action dims {bad}")
        if tiny:
            problems.append(
                f"action dims {tiny} span less than {DEGENERATE_SPAN:g} (max - min): normalising divides by it, so "
                "numerical noise fills the whole [-1, 1] range; recompute the statistics on the full dataset"
            )
        if spans and len(constant) == len(spans):
            problems.append(
                "every normalised action dim is constant: the statistics describe no motion (the wrong column or an "
                "empty dataset); recompute them with `python -m tutorial_utils dataset stats DATASET`"
            )
    if newest is not None and (newest / STATS_FILE).is_file() and read_json_or_empty(newest / STATS_FILE) != stats:
        problems.append(
            f"{newest.name}/{STATS_FILE} differs from the run's: the served policy unnormalises with other ranges"
        )
    if problems:
        return Check("normalisation statistics", "fail", checked, "; ".join(problems))
    note = f"; dims {constant} are constant in the data (the policy outputs that constant)" if constant else ""
    return Check("normalisation statistics", "pass", checked,
                 f"{len(lo)} action dims, all finite, no normalised span below {DEGENERATE_SPAN:g}{note}")  # fmt: skip


def check_gripper(d: Path, newest: Path | None, evaluations: list[dict]) -> Check:
    """Gripper sign: the checkpoint names its convention, the data's gripper action is +-1 (the
    one conversion to robosuite flips a +-1 sign), and an evaluation served that convention."""
    from tutorial_utils.policies.normalize import STATS_FILE

    conf = read_json_or_empty(newest / "config.json") if newest is not None else {}
    conv = (conf.get("dataset") or {}).get("gripper") if isinstance(conf.get("dataset"), dict) else None
    act = _stats_action(read_json_or_empty(d / STATS_FILE)) or {}
    checked = f"{newest / 'config.json' if newest else 'no checkpoint'}; {d / STATS_FILE}" + "".join(
        f"; {e['results']}" for e in evaluations
    )
    if conv is None and not act:
        return Check(
            "gripper sign", "unknown", checked, "no checkpoint config and no statistics to read the convention from"
        )
    problems, seen = [], []
    if conv is not None:
        if conv not in ("dataset", "robosuite"):
            problems.append(
                f"the checkpoint's gripper convention is {conv!r}, not 'dataset' (1 open) or 'robosuite' (-1 open)"
            )
        else:
            seen.append(f"checkpoint convention {conv!r}")
    if "min" in act and "max" in act and act["min"]:
        glo, ghi = act["min"][-1], act["max"][-1]
        if glo > -0.5 or ghi < 0.5:
            problems.append(
                f"the gripper action spans [{glo:.3g}, {ghi:.3g}], not -1..1: the conversion to robosuite (sign flip of "
                "+-1) would send a gripper that never opens or closes; re-record or map it to +-1"
            )
        else:
            seen.append(f"gripper action in [{glo:.3g}, {ghi:.3g}]")
    for e in evaluations:
        pol = read_json_or_empty(Path(e["results"])).get("policy") or {}
        served = pol.get("policy_gripper") or pol.get("gripper")
        if conv is not None and served is not None and served != conv:
            problems.append(
                f"{e['results']}: the evaluation served gripper {served!r}, the checkpoint was trained in {conv!r}"
            )
        elif served is not None:
            seen.append(f"evaluation served {served!r}")
    if problems:
        return Check("gripper sign", "fail", checked, "; ".join(problems))
    return Check("gripper sign", "pass", checked, ", ".join(seen))


def _dataset_dir(d: Path, cfg: dict) -> Path | None:
    for cand in (cfg.get("dataset"), d / "dataset"):
        if cand and (Path(cand) / "meta" / "info.json").is_file():
            return Path(cand)
    return None


def check_cameras(d: Path, cfg: dict) -> Check:
    """Camera keys: the dataset has the two cameras the policies read (LIBERO's names), and its
    modality.json points at cameras that exist."""
    from tutorial_utils.data.libero_schema import LIBERO_CAMERAS

    ds = _dataset_dir(d, cfg)
    if ds is None:
        return Check("camera keys", "unknown", f"train_config.json dataset={cfg.get('dataset')!r}",
                     "the dataset is not on this machine: its meta/info.json cannot be read")  # fmt: skip
    info = read_json_or_empty(ds / "meta" / "info.json")
    videos = [
        k
        for k, v in (info.get("features") or {}).items()
        if isinstance(v, dict) and v.get("dtype") in ("video", "image")
    ]
    checked = f"{ds / 'meta' / 'info.json'} and {ds / 'meta' / 'modality.json'}"
    problems = []
    missing = [k for k in LIBERO_CAMERAS if k not in videos]
    if missing:
        used = dict(zip(LIBERO_CAMERAS, [k if k in videos else None for k in LIBERO_CAMERAS], strict=True))
        problems.append(
            f"the dataset lacks {', '.join(missing)} (it has {', '.join(videos) or 'no cameras'}); training then takes "
            f"the first video keys in their order, which may swap primary and wrist ({used})"
        )
    modality = read_json_or_empty(ds / "meta" / "modality.json").get("video") or {}
    dangling = [
        v.get("original_key") for v in modality.values() if isinstance(v, dict) and v.get("original_key") not in videos
    ]
    if dangling:
        problems.append(f"modality.json names camera(s) {dangling} that info.json does not have")
    if problems:
        return Check("camera keys", "fail", checked, "; ".join(problems))
    return Check("camera keys", "pass", checked, f"{', '.join(LIBERO_CAMERAS)} present, modality.json consistent")


def _first_frame(path: Path):
    """The first frame of an mp4 as (H,W,3) uint8, or None when it cannot be read."""
    try:
        import av

        with av.open(str(path)) as c:
            return next(c.decode(video=0)).to_ndarray(format="rgb24")
    except Exception:  # noqa: BLE001 - PyAV raises its own error classes; any unreadable video means "unknown"
        return None


def _layout(img, n: int = 8):
    """A frame's brightness layout: grey, averaged to n x n blocks, zero mean, unit norm."""
    import numpy as np

    g = np.asarray(img, dtype=np.float64).mean(-1)
    h, w = g.shape[0] - g.shape[0] % n, g.shape[1] - g.shape[1] % n
    g = g[:h, :w].reshape(n, h // n, n, w // n).mean((1, 3))
    g = g - g.mean()
    return g / (np.linalg.norm(g) + 1e-12)


def _eval_videos(evaluations: list[dict]) -> list[Path]:
    """Episode videos of the run's evaluations (in the evaluation's output_dir, or beside its results.json)."""
    found: list[Path] = []
    for e in evaluations:
        res = Path(e["results"])
        out = (read_json_or_empty(res).get("config") or {}).get("output_dir")
        for folder in ([Path(out) / "videos"] if out else []) + [res.parent / "videos"]:
            found += sorted(folder.glob("*.mp4")) if folder.is_dir() else []
    return list(dict.fromkeys(found))[:ORIENTATION_FRAMES]


def check_orientation(d: Path, cfg: dict, evaluations: list[dict] = ()) -> Check:
    """Image orientation: the brightness layout of the first training frames (primary camera)
    against the first frames of the run's evaluation videos, as they are and rotated 180
    degrees. The scenes of a suite share the table at the bottom and the wall at the top, so the
    right orientation matches better by :data:`ORIENTATION_MARGIN` (cosine similarity)."""
    from tutorial_utils.data.libero_schema import LIBERO_CAMERAS

    ds = _dataset_dir(d, cfg)
    train_videos = sorted((ds / "videos").glob(f"chunk-*/{LIBERO_CAMERAS[0]}/*.mp4"))[:ORIENTATION_FRAMES] if ds else []
    eval_videos = _eval_videos(evaluations)
    how = (
        "LIBERO renders upside down; the IPEC datasets and the record_demos job rotate 180 degrees, and so does the "
        "evaluation (sim.libero_env.flip): the table must be at the bottom of a training frame and of an evaluation "
        "video frame alike"
    )
    if not train_videos or not eval_videos:
        missing = [w for w, v in (("training videos", train_videos), ("evaluation videos", eval_videos)) if not v]
        where = f"{ds / 'videos' if ds else 'the dataset (not on this machine)'}; the run's evaluations"
        return Check("image orientation", "unknown", where, f"no {' and no '.join(missing)} to compare. {how}.")
    a = [f for p in train_videos if (f := _first_frame(p)) is not None]
    b = [f for p in eval_videos if (f := _first_frame(p)) is not None]
    checked = f"first frames of {len(a)} training video(s) ({train_videos[0].parent}) and {len(b)} evaluation video(s) ({eval_videos[0].parent})"
    if not a or not b:
        return Check("image orientation", "unknown", checked, f"the videos could not be decoded. {how}.")
    ta = sum(_layout(f) for f in a)
    tb = sum(_layout(f) for f in b)
    import numpy as np

    ta = ta / (np.linalg.norm(ta) + 1e-12)
    tb = tb / (np.linalg.norm(tb) + 1e-12)
    same, rotated = float((ta * tb).sum()), float((ta * tb[::-1, ::-1]).sum())
    shown = f"layout similarity {same:.2f} as is, {rotated:.2f} rotated 180 degrees"
    if same - rotated > ORIENTATION_MARGIN:
        return Check(
            "image orientation", "pass", checked, f"training and evaluation images are the same way up ({shown})"
        )
    if rotated - same > ORIENTATION_MARGIN:
        return Check("image orientation", "fail", checked,
                     f"the evaluation images are upside down relative to the training images ({shown}): the policy "
                     f"sees a scene it never trained on. {how}")  # fmt: skip
    return Check("image orientation", "unknown", checked, f"too close to tell ({shown}). {how}.")


# --- the diagnosis -------------------------------------------------------------------------------


def _evaluations(d: Path) -> list[dict]:
    return [r for r in rck.list_checkpoints(d) if "success_rate" in r]


def check_success_zero(d: Path, train: list[dict], evaluations: list[dict], checklist: list[Check]) -> list[Finding]:
    """``loss_falls_success_0``: the loss fell (last window below :data:`FALLS_RATIO` x the
    first) and every evaluated checkpoint scored 0."""
    got = loss_windows(train)
    if not evaluations or any(e["success_rate"] > 0 for e in evaluations) or got is None:
        return []
    _, means, _ = got
    if not means[-1] < FALLS_RATIO * means[0]:
        return []
    failed = [c.name for c in checklist if c.status == "fail"]
    unknown = [c.name for c in checklist if c.status == "unknown"]
    n = sum(e["episodes"] for e in evaluations)
    return [
        Finding(
            "loss_falls_success_0",
            "warning",
            f"the loss fell from {means[0]:.4g} to {means[-1]:.4g}, but {len(evaluations)} evaluated checkpoint(s) "
            f"succeeded in 0 of {n} episodes. Checklist: "
            + (f"FAILED {', '.join(failed)}" if failed else "no checked item failed")
            + (f"; not checkable here: {', '.join(unknown)}" if unknown else "")
            + ".",
            "fix the failed checklist items first. If all pass: train longer (offline loss predicts success poorly), "
            "evaluate more episodes (a Wilson interval at n small is wide), and compare with the expert policy on the "
            "same suite to rule out the simulator set-up.",
        )
    ]


def diagnose(
    run: str | os.PathLike, runs_dir: str | os.PathLike | None = None, free_bytes: int | None = None
) -> Diagnosis:
    """Every check on one run (see the module docstring). ``free_bytes`` replaces the measured
    free disk space (tests, planning)."""
    d = resolve(run, runs_dir)
    status = jobs.read_status(d)
    state = run_state(d, status)
    saved = read_json_or_empty(d / CONFIG_FILE)
    cfg = dict(saved.get("train") or read_json_or_empty(d / "copy.json").get("train") or {})
    train = [r for r in read_metrics(d) if "loss" in r]
    newest = ck.find_last(d / ck.CHECKPOINTS_DIR) if (d / ck.CHECKPOINTS_DIR).is_dir() else None
    evaluations = _evaluations(d)
    checklist = [
        check_statistics(d, newest),
        check_gripper(d, newest, evaluations),
        check_cameras(d, cfg),
        check_orientation(d, cfg, evaluations),
    ]
    findings = [
        *check_stale(d, status, state),
        *check_non_finite(d, train, status),
        *training_findings(d, cfg, train, status, state, free_bytes),
        *check_success_zero(d, train, evaluations, checklist),
    ]
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return Diagnosis(d.name, str(d), state, findings, checklist)


def record(
    run: str | os.PathLike, runs_dir: str | os.PathLike | None = None, diagnosis: Diagnosis | None = None
) -> dict:
    """Diagnose ``run`` and write the result into its ``status.json`` as ``health`` (checked
    time, ok, findings, checklist), merged under the status lock. Returns what was written."""
    diag = diagnosis or diagnose(run, runs_dir)
    health = {k: v for k, v in diag.as_dict().items() if k not in ("run", "path")}
    if diag.state == "created":  # a copy not started: a status.json would make it look started
        return {**health, "checked": _dt.datetime.now().isoformat(timespec="seconds")}
    return record_health(diag.path, health)
