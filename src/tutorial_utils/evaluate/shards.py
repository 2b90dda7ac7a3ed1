"""Splitting an evaluation's episodes over workers and shards, and joining the parts again.

An evaluation is a list of ``(task_id, trial)`` pairs in a fixed order: every task of
``task_ids`` in turn, trials ``0 .. trials_per_task - 1`` of each (trial ``k`` starts from init
state ``k``). :func:`split` cuts that list into contiguous, balanced parts: ``shard`` /
``num_shards`` pick one part for this machine (a SLURM array, several papermill runs), and
``workers`` cuts the shard's part again, one per LIBERO client process. Contiguous parts keep the
trials of a task together, so a worker builds few LIBERO environments (6-27 s each here).

Each part is a normal evaluation of its pairs: the same seeds, the same init states, the same
per-episode log lines (``Starting episode N...`` counts in the whole plan). :func:`merge_results`
joins parts into the ``results.json`` one process would have written for their union, and
:func:`render_log` writes the log one process would have printed, running totals recomputed.

Pure functions on dicts and lists: the processes and files are in
:mod:`tutorial_utils.evaluate.parallel`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tutorial_utils import logs as L
from tutorial_utils.errors import ConfigError

Pair = tuple[int, int]

#: Config keys that may differ between the parts of one evaluation: where results go, how the
#: server is reached, how many processes ran them, time limits. Every other key must match.
MERGE_IGNORED_KEYS = (
    "output_dir",
    "host",
    "port",
    "workers",
    "shard",
    "connect_timeout",
    "recv_timeout",
    "server_timeout",
    "client_timeout",
    "videos",
)


class ShardError(ConfigError):
    """Parts of an evaluation that cannot be joined (different configs, missing or repeated episodes)."""


def check_split(shard: Any, num_shards: Any, workers: Any = 1, where: str = "the evaluation job") -> None:
    """Refuse a shard outside ``0 .. num_shards - 1`` or a count below 1, saying how to fix it."""
    for name, value in (("num_shards", num_shards), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {name}={value!r} must be an integer >= 1 (1: no splitting)")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < num_shards:
        raise ConfigError(
            f"{where}: shard={shard!r} with num_shards={num_shards}: shards are numbered 0..{num_shards - 1}. "
            f"Run one job per shard, e.g. a SLURM array `--array=0-{num_shards - 1}` passing "
            f"`-p shard $SLURM_ARRAY_TASK_ID -p num_shards {num_shards}`."
        )


def episode_plan(task_ids: Iterable[int], trials_per_task: int) -> list[Pair]:
    """Every ``(task_id, trial)`` of an evaluation, in the order one process runs them."""
    return [(int(t), k) for t in task_ids for k in range(int(trials_per_task))]


def split(pairs: Sequence[Pair], part: int, parts: int) -> list[Pair]:
    """Part ``part`` of ``parts`` contiguous, balanced pieces of ``pairs`` (sizes differ by at most 1).

    Every pair lands in exactly one part; parts may be empty when there are fewer pairs than parts.
    """
    check_split(part, parts)
    n = len(pairs)
    return [tuple(p) for p in pairs[part * n // parts : (part + 1) * n // parts]]  # type: ignore[misc]


def shard_pairs(task_ids: Iterable[int], trials_per_task: int, shard: int, num_shards: int) -> list[Pair]:
    """This shard's part of the evaluation's episodes; an empty shard is a configuration error (a
    job that runs no episode would otherwise look like a failed LIBERO setup)."""
    plan = episode_plan(task_ids, trials_per_task)
    pairs = split(plan, shard, num_shards)
    if not pairs:
        raise ConfigError(
            f"shard={shard} with num_shards={num_shards} gets no episode: the evaluation has only {len(plan)} "
            f"(tasks x trials_per_task). Fix: use num_shards <= {max(len(plan), 1)}, or more trials_per_task."
        )
    return pairs


def group_by_task(pairs: Iterable[Pair]) -> dict[int, list[int]]:
    """``{task_id: [trial, ...]}`` in the order of ``pairs`` (tasks as they first appear)."""
    out: dict[int, list[int]] = {}
    for t, k in pairs:
        out.setdefault(int(t), []).append(int(k))
    return out


def episode_numbers(task_ids: Iterable[int], trials_per_task: int) -> dict[Pair, int]:
    """``(task_id, trial) -> N`` of ``Starting episode N...``: the position in the whole plan, from 1."""
    return {p: i + 1 for i, p in enumerate(episode_plan(task_ids, trials_per_task))}


# --- the log one process prints --------------------------------------------------------------------


class LogRenderer:
    """Produces the documented client log (docs/FACTS.md section 5) episode by episode, as
    :func:`tutorial_utils.evaluate.loop.run_evaluation` prints it: feed episodes in plan order,
    then :meth:`finish`. Running totals count only what was fed."""

    def __init__(self) -> None:
        self.total_eps = self.total_ok = 0
        self.task_eps = self.task_ok = 0

    def episode(self, n: int, task: str, success: bool, first_of_task: bool, last_of_task: bool) -> list[str]:
        out = []
        if first_of_task:
            out.append(L.EVAL_TASK.format(task=task))
            self.task_eps = self.task_ok = 0
        out.append(L.EVAL_STARTING_EPISODE.format(n=n))
        self.task_eps += 1
        self.total_eps += 1
        self.task_ok += int(bool(success))
        self.total_ok += int(bool(success))
        out += [
            L.EVAL_SUCCESS.format(success=success),
            L.EVAL_EPISODES_SO_FAR.format(n=self.total_eps),
            L.EVAL_SUCCESSES.format(n=self.total_ok, pct=self.total_ok / self.total_eps * 100),
        ]
        if last_of_task:
            out += [
                L.EVAL_TASK_RATE.format(rate=float(self.task_ok) / float(self.task_eps)),
                L.EVAL_TOTAL_RATE_SO_FAR.format(rate=float(self.total_ok) / float(self.total_eps)),
            ]
        return out

    def finish(self) -> list[str]:
        rate = float(self.total_ok) / float(self.total_eps) if self.total_eps else 0.0
        return [L.EVAL_TOTAL_RATE.format(rate=rate), L.EVAL_TOTAL_EPISODES.format(n=self.total_eps)]


def plan_of(results: dict) -> tuple[list[int], int]:
    """``(task_ids, trials_per_task)`` of the whole evaluation a ``results.json`` belongs to."""
    cfg = results.get("config") or {}
    trials = int(cfg.get("trials_per_task") or 1)
    task_ids = results.get("task_ids")
    if task_ids is None:  # written before shards existed: the tasks it ran
        task_ids = [int(t["task_id"]) for t in results.get("tasks", [])]
    return [int(t) for t in task_ids], trials


def render_log(results: dict, finished: bool = True) -> list[str]:
    """The log lines one process prints for the episodes in ``results`` (a whole run, a shard or
    a merge), in order; ``finished`` adds the two closing lines."""
    numbers = episode_numbers(*plan_of(results))
    r = LogRenderer()
    lines: list[str] = []
    for task in results.get("tasks", []):
        eps = task.get("episodes", [])
        for i, ep in enumerate(eps):
            n = numbers.get((int(task["task_id"]), int(ep["episode"])), 0)
            lines += r.episode(n, task.get("task", "?"), bool(ep["success"]), i == 0, i == len(eps) - 1)
    return lines + (r.finish() if finished else [])


# --- joining parts ---------------------------------------------------------------------------------


def part_pairs(results: dict) -> list[Pair]:
    """The ``(task_id, trial)`` pairs a part ran (its ``pairs``; else read from its episodes)."""
    if results.get("pairs") is not None:
        return [(int(t), int(k)) for t, k in results["pairs"]]
    return [(int(t["task_id"]), int(e["episode"])) for t in results.get("tasks", []) for e in t.get("episodes", [])]


def config_mismatch(a: dict, b: dict, ignore: Iterable[str] = ()) -> tuple[str, Any, Any] | None:
    """The first config key (sorted) whose values differ, outside :data:`MERGE_IGNORED_KEYS` and ``ignore``."""
    skip = set(MERGE_IGNORED_KEYS) | set(ignore)
    for key in sorted((set(a) | set(b)) - skip):
        if a.get(key, "<missing>") != b.get(key, "<missing>"):
            return key, a.get(key, "<missing>"), b.get(key, "<missing>")
    return None


def merge_results(
    parts: Sequence[tuple[str, dict]],
    expected: Sequence[Pair] | None = None,
    ignore: Iterable[str] = (),
) -> dict:
    """Join parts (``(label, results)``, the label naming its file) into the results one process
    would have written for ``expected`` (default: the parts' union, in plan order).

    Raises :class:`ShardError` naming the differing config key, a repeated episode or the
    missing ones. Timings are kept per episode; ``wall_s`` is the longest part's.
    """
    if not parts:
        raise ShardError("nothing to merge: give the results of at least one evaluation part")
    ignore = tuple(ignore)
    ref_label, ref = parts[0]
    ref_cfg = ref.get("config") or {}
    for label, res in parts[1:]:
        if res.get("suite") != ref.get("suite"):
            raise ShardError(
                f"{label}: suite {res.get('suite')!r} differs from {ref.get('suite')!r} in {ref_label}; "
                "merge only the parts of one evaluation"
            )
        bad = config_mismatch(ref_cfg, res.get("config") or {}, ignore)
        if bad is not None:
            key, want, got = bad
            raise ShardError(
                f"{label}: config key {key!r} is {got!r}, but {want!r} in {ref_label}: these are parts of "
                f"different evaluations. Merge only runs made with the same parameters (if {key!r} differs "
                f"on purpose and cannot change the results, e.g. a checkpoint copied to another path, pass "
                f"--ignore {key})."
            )
        if plan_of(res) != plan_of(ref):
            raise ShardError(
                f"{label}: its tasks {plan_of(res)[0]} differ from {plan_of(ref)[0]} in {ref_label} "
                "(task_ids resolved differently): merge only the parts of one evaluation"
            )
    task_ids, trials = plan_of(ref)
    order = {p: i for i, p in enumerate(episode_plan(task_ids, trials))}
    found: dict[Pair, tuple[str, str, dict]] = {}
    for label, res in parts:
        for task in res.get("tasks", []):
            for ep in task.get("episodes", []):
                key = (int(task["task_id"]), int(ep["episode"]))
                if key not in order:
                    raise ShardError(
                        f"{label}: task {key[0]} trial {key[1]} is outside the evaluation's plan "
                        f"(tasks {task_ids}, {trials} trials each)"
                    )
                if key in found:
                    raise ShardError(
                        f"task {key[0]} trial {key[1]} was run twice: in {found[key][0]} and in {label}. "
                        "Each shard must run with its own `shard` value and the same `num_shards`."
                    )
                found[key] = (label, str(task.get("task", "?")), ep)
    if expected is None:
        want = sorted(found, key=order.__getitem__)
    else:
        want = sorted({(int(t), int(k)) for t, k in expected}, key=lambda p: order.get(p, len(order)))
    missing = [p for p in want if p not in found]
    if missing:
        shown = ", ".join(f"task {t} trial {k}" for t, k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ShardError(
            f"{len(missing)} episode(s) missing from the parts ({', '.join(lbl for lbl, _ in parts)}): "
            f"{shown}{more}. Run the missing shards (every shard 0..num_shards-1 once) and merge again."
        )
    extra = [p for p in found if p not in set(want)]
    if extra:
        raise ShardError(
            f"the parts hold episodes outside the merged range, e.g. task {extra[0][0]} trial {extra[0][1]} "
            f"(from {found[extra[0]][0]})"
        )
    tasks: list[dict] = []
    for task_id, trial_list in group_by_task(want).items():
        eps = [found[(task_id, k)][2] for k in trial_list]
        ok = sum(bool(e["success"]) for e in eps)
        tasks.append(
            {
                "task_id": task_id,
                "task": found[(task_id, trial_list[0])][1],
                "episodes": [dict(e) for e in eps],
                "successes": ok,
                "success_rate": ok / len(eps),
            }
        )
    total = sum(len(t["episodes"]) for t in tasks)
    total_ok = sum(t["successes"] for t in tasks)
    return {
        "suite": ref.get("suite"),
        "policy": ref.get("policy"),
        "config": dict(ref_cfg),
        "tasks": tasks,
        "total_episodes": total,
        "total_successes": total_ok,
        "success_rate": total_ok / total if total else None,
        "wall_s": max(float(r.get("wall_s") or 0.0) for _, r in parts),
        "finished": all(bool(r.get("finished")) for _, r in parts),
        "task_ids": task_ids,
        "pairs": [list(p) for p in want],
    }
