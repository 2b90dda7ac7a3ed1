"""Where each promoted result came from, and which copy of it a page shows.

Two copies of the promoted files can exist:

- **this build's run**: what a reader's ``make book`` (the main job, ``python -m tutorial_utils
  pipeline``) promoted, under ``_build/promoted/{logs,assets}/`` (git-ignored, so the first
  command leaves the checkout clean);
- **the reference run shipped with the book**: ``logs/`` and ``assets/`` (tracked), updated only
  by the maintainer command ``python -m tutorial_utils promote --reference``.

:func:`find` returns this build's copy when there is one, else the reference; :func:`origin` says
which. :func:`line` renders one line of provenance for a promoted file (run id, date, dataset
name with its episode count and fingerprint, commit, and which copy), read from the
``promoted.json`` stamp promotion writes beside the files, or, for files promoted before stamps
existed, from what the file itself records. :func:`success` writes a success rate with its 95%
Wilson interval and how many of the evaluated starts a demonstration started from.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tutorial_utils import paths

BUILD_LABEL = "this build's run"
REFERENCE_LABEL = "the reference run shipped with the book"
#: the stamp file promotion writes into each copy's ``logs/`` folder
STAMPS = "promoted.json"
#: the recording chapters 3 and 4 show; other results are compared with it
RECORDING = "logs/record_dataset.json"
_KINDS = ("logs", "assets")


def _split(name: str | os.PathLike) -> tuple[str, str]:
    """``logs/x.json`` (or a path under LOGS, ASSETS or PROMOTED) -> ("logs", "x.json")."""
    p = Path(name)
    if p.is_absolute():
        for base, kind in ((paths.LOGS, "logs"), (paths.ASSETS, "assets")):
            if p.is_relative_to(base):
                return kind, p.relative_to(base).as_posix()
        if p.is_relative_to(paths.PROMOTED):
            p = p.relative_to(paths.PROMOTED)
        else:
            raise ValueError(f"{p} is not a promoted file (not under logs/, assets/ or {paths.PROMOTED})")
    parts = p.as_posix().split("/", 1)
    if len(parts) != 2 or parts[0] not in _KINDS:
        raise ValueError(f"{name!r}: name a promoted file as logs/<file> or assets/<file>")
    return parts[0], parts[1]


def build_path(name: str | os.PathLike) -> Path:
    kind, rest = _split(name)
    return paths.PROMOTED / kind / rest


def reference_path(name: str | os.PathLike) -> Path:
    kind, rest = _split(name)
    return (paths.LOGS if kind == "logs" else paths.ASSETS) / rest


def find(name: str | os.PathLike) -> Path:
    """This build's copy of a promoted file when the main job promoted one, else the reference's."""
    for p in (build_path(name), reference_path(name)):
        if p.is_file():
            return p
    kind, rest = _split(name)
    raise FileNotFoundError(
        f"{kind}/{rest}: neither this build ({paths.for_book(str(build_path(name)))}) nor the shipped reference "
        f"has it. Run the main job (`python -m tutorial_utils pipeline`) or check the name."
    )


def resolve(name: str | os.PathLike) -> Path:
    """A page parameter naming results: a promoted ``logs/...`` or ``assets/...`` file through
    :func:`find` (this build's copy first), anything else (a run directory) as a repository path."""
    text = os.fspath(name).strip()
    return find(text) if text.split("/", 1)[0] in _KINDS else paths.from_book(text)


def find_optional(name: str | os.PathLike) -> Path | None:
    """:func:`find`, or None when neither copy has the file."""
    try:
        return find(name)
    except FileNotFoundError:
        return None


def origin(name: str | os.PathLike) -> str:
    """:data:`BUILD_LABEL` or :data:`REFERENCE_LABEL`: which copy :func:`find` returns."""
    return BUILD_LABEL if build_path(name).is_file() else REFERENCE_LABEL


def load_json(name: str | os.PathLike) -> Any:
    path = find(name)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{paths.for_book(str(path))}: not valid JSON ({exc}); promote the run again") from None


def read_text(name: str | os.PathLike) -> str:
    return find(name).read_text(encoding="utf-8")


# --- stamps, written at promotion --------------------------------------------------------------


def dataset_identity(root: str | os.PathLike) -> dict[str, Any]:
    """A recorded dataset's name, episode count and fingerprint: the first 12 hex digits of a
    SHA-256 over its episodes (task, init state when recorded, length), so two recordings with
    the same name but other episodes have different fingerprints."""
    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
    rows: list = []
    manifest = root / "meta" / "record_manifest.json"
    if manifest.is_file():
        man = json.loads(manifest.read_text(encoding="utf-8"))
        rows = sorted(
            [int(e["task_id"]), int(e["init_state"]), int(e.get("length", 0))] for e in man.get("episodes", [])
        )
    if not rows:
        episodes = root / "meta" / "episodes.jsonl"
        lines = episodes.read_text(encoding="utf-8").splitlines() if episodes.is_file() else []
        rows = [[e.get("episode_index"), e.get("tasks"), e.get("length")] for e in map(json.loads, filter(None, lines))]
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:12]
    return {"dataset": root.name, "episodes": info.get("total_episodes"), "fingerprint": digest}


def git_commit(repo: Path | None = None) -> str | None:
    """The checkout's short commit (with ``+changes`` when tracked files differ), or None without git."""
    repo = repo or paths.REPO
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "notebooks"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def stamp(run_dir: str | os.PathLike | None, dataset: str | os.PathLike | None = None, **extra: Any) -> dict[str, Any]:
    """The provenance of one run's promoted files: run id, date, commit and, when given, the
    dataset it learned from (:func:`dataset_identity`)."""
    status = {}
    if run_dir is not None and (Path(run_dir) / "status.json").is_file():
        status = json.loads((Path(run_dir) / "status.json").read_text(encoding="utf-8"))
    started = str(status.get("started") or _dt.datetime.now().isoformat(timespec="seconds"))
    out: dict[str, Any] = {"date": started[:10], "commit": git_commit()}
    if run_dir is not None:
        out["run_id"] = status.get("run_id") or Path(run_dir).name
    if dataset:
        root = paths.from_book(dataset) if not Path(dataset).is_absolute() else Path(dataset)
        if (root / "meta" / "info.json").is_file():
            out.update(dataset_identity(root))
    return {**out, **{k: v for k, v in extra.items() if v is not None}}


def write_stamps(files: dict[str, dict[str, Any]], reference: bool = False) -> Path:
    """Merge ``{"logs/x.json": stamp, ...}`` into the copy's ``promoted.json`` (this build's by default)."""
    from tutorial_utils.io import atomic_write_json

    dest = (paths.LOGS if reference else paths.PROMOTED / "logs") / STAMPS
    known = json.loads(dest.read_text(encoding="utf-8")) if dest.is_file() else {}
    known.setdefault("files", {}).update(paths.for_book(files))
    return atomic_write_json(dest, known)


def stamps(build: bool) -> dict[str, dict[str, Any]]:
    f = (paths.PROMOTED / "logs" if build else paths.LOGS) / STAMPS
    return json.loads(f.read_text(encoding="utf-8")).get("files", {}) if f.is_file() else {}


# --- reading provenance back -----------------------------------------------------------------


def _run_date(run_id: str | None) -> str | None:
    m = re.match(r"(\d{4})(\d{2})(\d{2})-\d{6}", run_id or "")
    return f"{m[1]}-{m[2]}-{m[3]}" if m else None


def _shipped_in(path: Path) -> str | None:
    """The commit that last changed a tracked reference file (for files without a stamp)."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", os.fspath(path)],
            cwd=paths.REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _from_content(name: str, path: Path) -> dict[str, Any]:
    """What a promoted file without a stamp records about itself."""
    if path.suffix != ".json":
        return {}
    d = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(d, dict):
        return {}
    cfg = d.get("config") if isinstance(d.get("config"), dict) else {}
    run = (
        d.get("run_id")
        or d.get("promoted_from")
        or (cfg.get("output_dir") if "runs/" in str(cfg.get("output_dir")) else None)
    )
    run_id = Path(str(run)).name if run else None
    out: dict[str, Any] = {"run_id": run_id, "date": _run_date(run_id) or (str(d.get("started") or "")[:10] or None)}
    dataset = cfg.get("dataset") or d.get("dataset")
    if isinstance(dataset, dict):  # a training config: {"name", "frames", ...}
        out["frames"] = dataset.get("frames")
        dataset = dataset.get("name")
    if isinstance(dataset, str):
        out["dataset"] = Path(dataset).name
    if "codebase_version" in d:  # a dataset card
        out.update(episodes=d.get("total_episodes"), frames=d.get("total_frames"))
    demos = cfg.get("demonstrations") if isinstance(cfg.get("demonstrations"), dict) else {}
    if isinstance(d.get("demonstrations"), dict):
        demos = d["demonstrations"]
    if demos.get("episodes") is not None:
        out["episodes"] = demos["episodes"]
    if name.endswith("summary.json") and "dataset" not in out:  # a training summary: its config names the data
        sibling = name[: -len("summary.json")] + "train_config.json"
        try:
            tc = _from_content(sibling, find(sibling))
            out.update({k: tc[k] for k in ("dataset", "frames", "episodes") if k in tc})
        except (FileNotFoundError, ValueError):
            pass
    if isinstance(d.get("policy"), dict) and d["policy"].get("policy") == "expert":
        out["no_dataset"] = "no training data (the scripted expert)"
    if "dataset" not in out and isinstance(d.get("policy"), dict):  # an evaluation of a promoted training
        ckpt = str(d["policy"].get("checkpoint") or "")
        for summary in sorted({*paths.LOGS.glob("*summary.json"), *(paths.PROMOTED / "logs").glob("*summary.json")}):
            s = json.loads(summary.read_text(encoding="utf-8"))
            if s.get("run_id") and s["run_id"] in ckpt:
                tr = _from_content(f"logs/{summary.name}", summary)
                out.update({k: tr[k] for k in ("dataset", "frames", "episodes") if k in tr})
                out["trained_by"] = s["run_id"]
                break
    return {k: v for k, v in out.items() if v is not None}


def info(name: str | os.PathLike) -> dict[str, Any]:
    """A promoted file's provenance: the stamp promotion wrote, else what the file records, plus
    ``source`` (which copy) and ``path``."""
    kind, rest = _split(name)
    rel = f"{kind}/{rest}"
    path = find(rel)
    build = path == build_path(rel)
    out = {**_from_content(rel, path), **stamps(build).get(rel, {})}
    if not out.get("commit") and not build:
        shipped = _shipped_in(path)
        out["shipped_in"] = shipped
    out.update(source=BUILD_LABEL if build else REFERENCE_LABEL, path=paths.for_book(str(path)))
    return out


def compare_recording(meta: dict[str, Any], recording: dict[str, Any]) -> str | None:
    """None when ``meta``'s result was made from the recording chapters 3 and 4 show, else a
    sentence saying how they differ (by fingerprint when both have one, else by name and
    episode count)."""
    if not meta.get("dataset") or not recording.get("dataset"):
        return None
    a, b = meta.get("fingerprint"), recording.get("fingerprint")
    if a and b:
        same = a == b
    else:  # no fingerprint on one side: the name, and the counts both sides recorded
        same = meta["dataset"] == recording["dataset"] and all(
            meta.get(k) is None or recording.get(k) is None or meta[k] == recording[k] for k in ("episodes", "frames")
        )
    if same:
        return None

    def _name(m):
        bits = [f"{m[k]} {k[:-1] if m[k] == 1 else k}" for k in ("episodes", "frames") if m.get(k) is not None]
        bits += [f"fingerprint {m['fingerprint']}"] if m.get("fingerprint") else []
        return f"{m['dataset']} ({', '.join(bits) or 'size not recorded'})"

    return f"made from a different recording, {_name(meta)}, than the one chapters 3 and 4 show, {_name(recording)}"


def line(name: str | os.PathLike) -> str:
    """One line of provenance, e.g. ``Run 20261203-080352-evaluate-500595 (2026-12-03), dataset
    libero_spatial_..._lerobot (48 episodes, fingerprint 1a2b3c4d5e6f), commit 3144c8b; the
    reference run shipped with the book.``"""
    m = info(name)
    head = (
        "Benchmark" if m.get("stage") == "bench" and not m.get("run_id") else f"Run {m.get('run_id', 'not recorded')}"
    )
    parts = [head + (f" ({m['date']})" if m.get("date") else "")]
    if m.get("dataset"):
        ds = f"dataset {m['dataset']}"
        n = m.get("episodes")
        extra = [f"{n} episode{'' if n == 1 else 's'}"] if n is not None else []
        extra.append(f"fingerprint {m['fingerprint']}" if m.get("fingerprint") else "fingerprint not recorded")
        parts.append(f"{ds} ({', '.join(extra)})")
    else:
        parts.append(m.get("no_dataset", "dataset not recorded"))
    if m.get("commit"):
        parts.append(f"commit {m['commit']}")
    elif m.get("shipped_in"):
        parts.append(f"commit not recorded (shipped in {m['shipped_in']})")
    else:
        parts.append("commit not recorded")
    text = ", ".join(parts) + f"; {m['source']}."
    _, rest = _split(name)
    if f"logs/{rest}" != RECORDING:
        try:
            differs = compare_recording(m, info(RECORDING))
        except FileNotFoundError:
            differs = None
        if differs:
            text += f" Note: {differs}."
    return text


class Provenance:
    """The provenance of one block of results as small italic Markdown paragraphs in a notebook:
    files whose lines are the same (one run, one dataset, one commit) share one paragraph, and
    when the block's files come from more than one source each paragraph names its files."""

    def __init__(self, *names: str | os.PathLike):
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(line(n), []).append(Path(_split(n)[1]).name)
        self.groups = list(groups.items())

    def _labels(self) -> list[str]:
        if len(self.groups) < 2:
            return ["Source" for _ in self.groups]
        return ["Source of " + ", ".join(f"`{f}`" for f in files) for _, files in self.groups]

    def __str__(self) -> str:
        return "\n".join(f"{label}: {text}" for label, (text, _) in zip(self._labels(), self.groups))

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"*{label}: {text}*" for label, (text, _) in zip(self._labels(), self.groups))


def show(*names: str | os.PathLike) -> Provenance:
    """The provenance of one block of results (``show("logs/eval_mini_results.json")`` as a cell's last line)."""
    return Provenance(*names)


# --- success rates ------------------------------------------------------------------------------


def demonstrated_starts(results: dict, card: dict | None) -> tuple[int, int] | None:
    """(at least, at most) how many of an evaluation's (task, init state) starts a demonstration
    of the recording started from. Exact (both equal) when the evaluation recorded it
    (``demonstrations.eval_pairs_seen``) or the dataset card lists its ``starts``; bounds from the
    recording's configuration and its failed items otherwise; None when unknown."""
    demos = results.get("demonstrations")
    if isinstance(demos, dict) and demos.get("eval_pairs_seen") is not None:
        return int(demos["eval_pairs_seen"]), int(demos["eval_pairs_seen"])
    evaluated = {
        (int(t["task_id"]), int(ep["init_state"]))
        for t in results.get("tasks", [])
        for ep in t.get("episodes", [])
        if ep.get("init_state") is not None
    }
    if not card or not evaluated:
        return None
    if card.get("starts"):
        seen = len(evaluated & {tuple(map(int, s)) for s in card["starts"]})
        return seen, seen
    cfg = card.get("config") or {}
    if "init_state_offset" not in cfg or "episodes_per_task" not in cfg:
        return None
    off, n = int(cfg["init_state_offset"]), int(cfg["episodes_per_task"])
    tasks = {int(t) for t in (card.get("per_task") or {})}
    candidates = {(t, i) for t, i in evaluated if t in tasks and off <= i < off + n}
    failed = sum(
        min(int(row.get("failed", 0)), sum(1 for t, _ in candidates if str(t) == k))
        for k, row in (card.get("per_task") or {}).items()
    )
    return max(0, len(candidates) - failed), len(candidates)


def success(successes: int, episodes: int, demonstrated: tuple[int, int] | int | None = None) -> str:
    """``14/20 = 70% (95% interval 48% to 85%)``, then, when known, how many of the evaluated
    starts were demonstrated (``; 17 of the 20 evaluated starts were demonstrated``)."""
    from tutorial_utils.runs.checkpoints import wilson

    k, n = int(successes), int(episodes)
    if n <= 0:
        return "no episodes evaluated"
    lo, hi = wilson(k, n)
    text = f"{k}/{n} = {100 * k / n:.0f}% (95% interval {100 * lo:.0f}% to {100 * hi:.0f}%)"
    if demonstrated is not None:
        a, b = (demonstrated, demonstrated) if isinstance(demonstrated, int) else demonstrated
        count = str(a) if a == b else f"{a} to {b}"
        verb = "was" if a == b == 1 else "were"
        starts = "start" if n == 1 else "starts"
        text += f"; {count} of the {n} evaluated {starts} {verb} demonstrated"
        if a == b == 0:
            text += " (all held out)"
    return text


def evaluation_success(name: str = "logs/eval_mini_results.json", card: str = RECORDING) -> str:
    """:func:`success` of a promoted evaluation, with its demonstrated starts counted against the
    recording it learned from (chapters 3 and 4's card when it is that recording)."""
    results = load_json(name)
    try:
        card_data = load_json(card)
    except FileNotFoundError:
        card_data = None
    meta = info(name)
    if card_data is not None and (not meta.get("dataset") or compare_recording(meta, info(card))):
        card_data = None  # not a policy trained on that recording: its starts say nothing here
    return success(results["total_successes"], results["total_episodes"], demonstrated_starts(results, card_data))
