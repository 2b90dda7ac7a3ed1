"""N LIBERO client processes against one policy server, and ``eval merge`` for shards.

:func:`evaluate` is what ``python -m tutorial_utils eval`` (so the evaluation chain) runs. With
``workers=1`` it is :func:`~tutorial_utils.evaluate.loop.run_evaluation` in this process. With
``workers=N`` it cuts this shard's ``(task, trial)`` pairs into N contiguous parts
(:func:`tutorial_utils.evaluate.shards.split`) and starts one client process per part::

    <output_dir>/workers/w<k>/worker.json           its config and pairs
    <output_dir>/workers/w<k>/eval_<suite>.log      its own log (episode numbers of the whole plan)
    <output_dir>/workers/w<k>/results.json          its episodes

While they run, this process prints the episodes in plan order as soon as every earlier one is
done, with the running totals recomputed, so its stdout (the chain's ``eval_<suite>.log``) has
the very lines one process would have printed; at the end it writes the one merged
``results.json`` and moves the videos into ``<output_dir>/videos``. A worker that fails stops
the others; its traceback is repeated in this log and :class:`WorkerFailed` names its log file.

``python -m tutorial_utils eval merge RUN_DIR... [--out DIR]`` joins the run directories of
the shards of one evaluation (``shard`` 0..num_shards-1, the same other parameters) into one
run directory: ``results.json``, ``eval_<suite>.log`` as one process writes them and the
shards' ``server.log`` one after the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tutorial_utils import jobs
from tutorial_utils.errors import TutorialError, error_text
from tutorial_utils.evaluate import shards as S
from tutorial_utils.evaluate.loop import RESULTS_FILE, SERVER_LOG, EvalConfig, eval_log_name, run_evaluation
from tutorial_utils.io import atomic_write_json, atomic_write_text

WORKERS_DIR = "workers"
WORKER_FILE = "worker.json"
#: math-library thread pools capped per worker (the client does little math); llvmpipe's render
#: threads (LP_NUM_THREADS) are left to Mesa: capping them at 1 per worker measured no faster here
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class WorkerFailed(TutorialError, RuntimeError):
    """A worker client process exited with an error; the message names its log file."""


def evaluate(cfg: EvalConfig, out=None, poll_s: float = 0.5) -> dict:
    """Run the evaluation with ``cfg.workers`` client processes; returns the results as one
    process would have written them (and writes them to ``results.json``)."""
    if cfg.workers <= 1:
        return run_evaluation(cfg, out)
    return run_workers(cfg, out, poll_s)


def resolve_task_ids(cfg: EvalConfig) -> list[int]:
    if cfg.task_list is not None:
        return cfg.task_list
    from tutorial_utils.sim import suites

    return list(range(suites.get(cfg.suite).num_tasks()))


def worker_env(workers: int) -> dict[str, str]:
    """The environment of a worker: no secrets, unbuffered output, and (unless set already) the
    math libraries' threads capped at this machine's cores divided among the workers."""
    from tutorial_utils.secrets import scrubbed_env

    env = scrubbed_env()
    env["PYTHONUNBUFFERED"] = "1"
    per = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    for var in THREAD_VARS:
        env.setdefault(var, per)
    return env


def worker_command(worker_file: Path) -> list[str]:
    """The command line of one worker process (:func:`worker_main`)."""
    return [sys.executable, "-m", "tutorial_utils.evaluate.parallel", "worker", str(worker_file)]


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _traceback_of(log: Path, max_lines: int = 30) -> list[str]:
    """The last traceback in a worker's log (else its last lines that are not episode lines)."""
    from tutorial_utils import logs as L

    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if starts:
        return lines[starts[-1] :][-max_lines:]
    prefixes = tuple(c.split("{")[0] for c in (L.EVAL_TASK, L.EVAL_STARTING_EPISODE, L.EVAL_SUCCESS, "# ", "Current "))
    return [ln for ln in lines if not ln.startswith(prefixes)][-max_lines:]


def run_workers(cfg: EvalConfig, out=None, poll_s: float = 0.5) -> dict:
    """The coordinator: one client process per part of this shard's pairs, their episodes printed
    in plan order, one merged ``results.json``."""
    t0 = time.monotonic()
    stream = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    out_dir = Path(cfg.output_dir or ".").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    task_ids = resolve_task_ids(cfg)
    plan = S.shard_pairs(task_ids, cfg.trials_per_task, cfg.shard, cfg.num_shards)
    parts = [p for p in (S.split(plan, k, cfg.workers) for k in range(cfg.workers)) if p]
    if len(parts) <= 1:  # nothing to share out: this process is the one client
        return run_evaluation(dataclasses.replace(cfg, output_dir=str(out_dir)), out, pairs=plan)
    numbers = S.episode_numbers(task_ids, cfg.trials_per_task)
    grouped = S.group_by_task(plan)
    firsts = {(t, ks[0]) for t, ks in grouped.items()}
    lasts = {(t, ks[-1]) for t, ks in grouped.items()}
    env = worker_env(len(parts))
    wdirs = [out_dir / WORKERS_DIR / f"w{k}" for k in range(len(parts))]
    procs: list[subprocess.Popen] = []
    handles = []
    renderer, emitted, done = S.LogRenderer(), 0, {}

    def drain() -> None:
        nonlocal emitted
        for wdir in wdirs:
            res = _read(wdir / RESULTS_FILE) or {}
            for task in res.get("tasks", []):
                for ep in task.get("episodes", []):
                    done[(int(task["task_id"]), int(ep["episode"]))] = (task.get("task", "?"), ep)
        while emitted < len(plan) and plan[emitted] in done:
            p = plan[emitted]
            lang, ep = done[p]
            for line in renderer.episode(numbers[p], lang, bool(ep["success"]), p in firsts, p in lasts):
                say(line)
            emitted += 1

    def collect(finished: bool) -> dict:
        labelled = [(str(w / RESULTS_FILE), r) for w in wdirs if (r := _read(w / RESULTS_FILE))]
        if not labelled:
            return {}
        merged = S.merge_results(labelled, expected=plan if finished else None)
        merged.update(
            config=dataclasses.asdict(cfg) | {"output_dir": str(out_dir)},
            task_ids=[int(t) for t in task_ids],
            pairs=[list(p) for p in plan],
            finished=finished,
            wall_s=round(time.monotonic() - t0, 1),
        )
        atomic_write_json(out_dir / RESULTS_FILE, merged)
        return merged

    try:
        for wdir, part in zip(wdirs, parts, strict=True):
            wdir.mkdir(parents=True, exist_ok=True)
            (wdir / RESULTS_FILE).unlink(missing_ok=True)  # a stale part must not be read as this run's
            wcfg = dataclasses.replace(cfg, output_dir=str(wdir))
            atomic_write_json(
                wdir / WORKER_FILE, {"config": dataclasses.asdict(wcfg), "pairs": [list(p) for p in part]}
            )
            fh = open(wdir / eval_log_name(cfg.suite), "w", encoding="utf-8")  # noqa: SIM115 - closed below
            handles.append(fh)
            procs.append(
                subprocess.Popen(worker_command(wdir / WORKER_FILE), stdout=fh, stderr=subprocess.STDOUT, env=env)
            )
        while True:
            codes = [p.poll() for p in procs]
            drain()
            failed = [(k, c) for k, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                k, code = failed[0]
                log = wdirs[k] / eval_log_name(cfg.suite)
                for line in _traceback_of(log):
                    say(line)
                with contextlib.suppress(TutorialError):  # what finished is kept; the failure is the news
                    collect(finished=False)
                raise WorkerFailed(
                    f"evaluation worker {k} of {len(parts)} exited with code {code}; the others were stopped. "
                    f"Its log: {log} (the lines above are its last traceback)."
                )
            if all(c == 0 for c in codes):
                break
            time.sleep(poll_s)
    finally:
        for p in procs:
            jobs.stop_process(p)
        for fh in handles:
            fh.close()
    drain()
    for wdir in wdirs:  # one videos/ folder, as one process writes it
        for task in (_read(wdir / RESULTS_FILE) or {}).get("tasks", []):
            for ep in task.get("episodes", []):
                if ep.get("video") and (wdir / ep["video"]).is_file():
                    (out_dir / ep["video"]).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(wdir / ep["video"], out_dir / ep["video"])
    merged = collect(finished=True)
    for line in renderer.finish():
        say(line)
    return merged


# --- merging shard run directories ----------------------------------------------------------------


def _part(run_dir: Path) -> tuple[str, dict]:
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise S.ShardError(f"{path} not found: give the run directories (or output_dir) of finished evaluation shards")
    res = _read(path)
    if not isinstance(res, dict) or "tasks" not in res:
        raise S.ShardError(f"{path}: not an evaluation results.json (no 'tasks' list)")
    if not res.get("finished"):
        raise S.ShardError(
            f"{path}: this shard did not finish (finished=false, {res.get('total_episodes', 0)} episodes): "
            "run it again and merge when every shard is done"
        )
    return str(path), res


def merge_dirs(run_dirs: list, out_dir: Any = None, ignore: tuple[str, ...] = ()) -> tuple[Path, dict]:
    """Join the shards' run directories into one (a new ``runs/<id>`` unless ``out_dir``);
    returns ``(directory, results)``."""
    from tutorial_utils import jobs

    dirs = [Path(d).resolve() for d in run_dirs]
    if len(set(dirs)) != len(dirs):
        raise S.ShardError(f"a run directory was given twice: {' '.join(map(str, run_dirs))}")
    parts = [_part(d) for d in dirs]
    task_ids, trials = S.plan_of(parts[0][1])
    merged = S.merge_results(parts, expected=S.episode_plan(task_ids, trials), ignore=ignore)
    if out_dir is not None and ((Path(out_dir) / RESULTS_FILE).exists() or Path(out_dir).resolve() in dirs):
        raise S.ShardError(f"{out_dir} already holds evaluation results: give --out a new directory")
    dest = jobs.ensure_run_dir(out_dir, "evaluate_merged")
    for d, (_, res) in zip(dirs, parts, strict=True):
        for task in res.get("tasks", []):
            for ep in task.get("episodes", []):
                if ep.get("video") and (d / ep["video"]).is_file():
                    (dest / ep["video"]).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(d / ep["video"], dest / ep["video"])
    suite = merged["suite"]
    merged["config"].update(shard=0, num_shards=1, output_dir=str(dest))
    merged["parts"] = [
        {
            "results": label,
            "shard": (res.get("config") or {}).get("shard"),
            "num_shards": (res.get("config") or {}).get("num_shards"),
            "episodes": res.get("total_episodes"),
            "wall_s": res.get("wall_s"),
        }
        for label, res in parts
    ]
    servers = [(d, d / SERVER_LOG) for d in dirs if (d / SERVER_LOG).is_file()]
    if servers:
        text = "".join(f"# --- {SERVER_LOG} of {d} ---\n" + p.read_text(encoding="utf-8") for d, p in servers)
        atomic_write_text(dest / SERVER_LOG, text)
    atomic_write_text(dest / eval_log_name(suite), "\n".join(S.render_log(merged)) + "\n")
    atomic_write_json(dest / RESULTS_FILE, merged)
    now = _dt.datetime.now().isoformat(timespec="seconds")
    jobs.update_status(  # a finished run like the parts: `job list` and `runs list` show it
        dest,
        job="evaluate_merged",
        run_id=dest.name,
        state="succeeded",
        started=now,
        finished=now,
        wall_s=merged.get("wall_s"),
        parts=[os.fspath(d) for d in dirs],
        success_signs={"episodes": merged["total_episodes"], "merged parts": len(dirs)},
        results=RESULTS_FILE,
    )
    return dest, merged


def merge_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils eval merge",
        description="Join the run directories of the shards of one evaluation (shard 0..num_shards-1, the same "
        "other parameters) into one: results.json and eval_<suite>.log as one process writes them.",
    )
    ap.add_argument("run_dirs", nargs="+", help="the shards' run directories (or their output_dir)")
    ap.add_argument("--out", default=None, help="the merged run directory (default: a new runs/<id>)")
    ap.add_argument(
        "--ignore", action="append", default=[], metavar="KEY", help="a config key allowed to differ (repeatable)"
    )
    args = ap.parse_args(argv)
    try:
        dest, res = merge_dirs(args.run_dirs, args.out, tuple(args.ignore))
    except TutorialError as exc:
        print(error_text(exc), file=sys.stderr)
        return 2
    for t in res["tasks"]:
        print(f"task {t['task_id']}: {t['successes']}/{len(t['episodes'])}  {t['task']}")
    print(
        f"merged {len(args.run_dirs)} parts: {res['total_successes']}/{res['total_episodes']} episodes "
        f"succeeded, success rate {res['success_rate']}; written to {dest}"
    )
    return 0


def worker_main(argv: list[str]) -> int:
    """``python -m tutorial_utils.evaluate.parallel worker WORKER_JSON``: one worker's part."""
    from tutorial_utils import params

    if len(argv) != 2 or argv[0] != "worker":
        print("usage: python -m tutorial_utils.evaluate.parallel worker WORKER_JSON", file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    cfg = params.from_mapping(EvalConfig, data["config"], argv[1])
    run_evaluation(cfg, pairs=data["pairs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:]))
