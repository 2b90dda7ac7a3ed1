"""Reading a zoo's or a sweep's results (``zoo.json``, ``sweep.json`` or a promoted ``logs/*.json``):
the tables and figures chapters 8 and 9 show. The experiments that write them are
:mod:`tutorial_utils.experiments` (the zoo and sweep jobs); this module only reads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError
from tutorial_utils.train.speed import budget_steps

ZOO_FILE = "zoo.json"
SWEEP_FILE = "sweep.json"
#: a positive control's target: the success rate a family must reach on its task's held-out starts
CONTROL_TARGET = 0.8


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A zoo's or a sweep's results: ``zoo.json`` / ``sweep.json`` in a run directory, or a
    promoted ``logs/*.json``."""
    p = Path(path)
    f = (
        (p / ZOO_FILE if (p / ZOO_FILE).is_file() or not (p / SWEEP_FILE).is_file() else p / SWEEP_FILE)
        if p.is_dir()
        else p
    )
    if not f.is_file():
        raise FileNotFoundError(
            f"{f}: no zoo results here. Run the zoo job (python -m tutorial_utils job run notebooks/jobs/zoo.md) "
            "and pass its run directory."
        )
    data = json.loads(f.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "rows" not in data:
        raise ConfigError(f"{f}: not a zoo result (no 'rows'); was it written by the zoo job?")
    return data


#: the result first: a table wider than the page scrolls, and what it cuts off is the rest
TABLE_COLUMNS = (
    "family",
    "success",
    "ci95",
    "params_m",
    "steps",
    "train_min",
    "samples_per_s",
    "best_val_action_mae",
    "round_trip_ms_p50",
    "server_infer_ms_p50",
)


def row_label(r: dict) -> str:
    return r.get("label") or r["family"]


def _success_text(r: dict) -> dict[str, str]:
    """A row's success as ``k/n (p%)`` and its Wilson interval as ``[lo%, hi%]`` (``-`` without one)."""
    ci = f"[{100 * r['ci95_low']:.0f}%, {100 * r['ci95_high']:.0f}%]" if r.get("ci95_low") is not None else "-"
    return {"success": f"{r['successes']}/{r['episodes']} ({100 * (r['success_rate'] or 0):.0f}%)", "ci95": ci}


def _success_bars(ax, labels: list[str], rows: list[dict], colors: list[str]) -> None:
    """Success rates as bars with their 95% Wilson intervals and ``k/n`` above, one per row."""
    for i, r in enumerate(rows):
        p = r["success_rate"] or 0.0
        lo, hi = (r.get("ci95_low") or 0.0), (r.get("ci95_high") or 0.0)
        ax.bar(i, 100 * p, color=colors[i])
        ax.errorbar(i, 100 * p, yerr=[[100 * (p - lo)], [100 * (hi - p)]], color="black", capsize=4)
        ax.text(i, 100 * hi + 2, f"{r['successes']}/{r['episodes']}", ha="center", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8 if len(labels) < 5 else 7)
    ax.set(ylabel="%", ylim=(0, 110))
    ax.grid(alpha=0.3, axis="y")


def table(zoo: dict[str, Any]):
    """The comparison as a pandas DataFrame indexed by family (a sweep: by its runs' values;
    success as k/n and rate, the Wilson interval as text), best success rate first."""
    import pandas as pd

    rows = []
    index = "run" if zoo.get("kind") == "sweep" else "family"
    for r in sorted(zoo["rows"], key=lambda r: -(r["success_rate"] or 0.0)):
        rows.append(
            {
                **{k: r.get(k) for k in TABLE_COLUMNS if k not in ("success", "ci95", "family")},
                "family": r["family"] if index == "family" else row_label(r),
                **_success_text(r),
            }
        )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS)).set_index("family").rename_axis(index)


def text(zoo: dict[str, Any]) -> str:
    """The table as plain text with the budget it was made with (for a terminal; a chapter
    prints :func:`caption` and displays :func:`table`, which the page shows as a table)."""
    import pandas as pd

    with pd.option_context("display.width", 220, "display.max_columns", 20):
        return caption(zoo, table_text=table(zoo).to_string())


def caption(zoo: dict[str, Any], table_text: str | None = None) -> str:
    """What the comparison (or sweep) was made with, and the exported bundle's result when there
    is one; ``table_text`` goes between the two."""
    c = zoo["config"]
    if zoo.get("kind") == "sweep":
        what = f"{c['policy']}, {len(zoo['rows'])} values of {c['param']}, {c['steps']} steps each"
    else:
        budget = f"{c['train_minutes']} min of training each" if c["train_minutes"] else f"{c['steps']} steps each"
        what = f"{len(zoo['rows'])} families, {budget}"
    head = (
        f"{what}, batch {c['batch_size']}, dataset {c['dataset']}; evaluated on "
        f"{c['suite']} tasks {c['task_ids']} x {c['trials_per_task']} trials (seed 7, {c['workers']} client workers)"
    )
    out = head + ("\n" + table_text if table_text else "")
    if b := zoo.get("bundle"):
        lo, hi = b["ci95_low"] or 0.0, b["ci95_high"] or 0.0
        out += (
            f"\nbundle of {b['from']} (step {b['step']}, parity {b['parity']['max_abs_diff']:.2g} on "
            f"{b['parity'].get('data', 'a batch')}): {b['successes']}/{b['episodes']} "
            f"[{100 * lo:.0f}%, {100 * hi:.0f}%] through the policy server, round trip p50 {b['round_trip_ms_p50']} ms"
        )
    return out


def figure(zoo: dict[str, Any]):
    """Three panels: success rate with the 95% interval per family, the training loss curves
    (EMA-smoothed) and the validation action error, one colour per family."""
    from matplotlib.figure import Figure

    from tutorial_utils.runs.compare import ema

    fams = [row_label(r) for r in zoo["rows"]]
    colors = {f: f"C{i % 10}" for i, f in enumerate(fams)}
    fig = Figure(figsize=(13, 3.8), layout="constrained")
    ax_sr, ax_loss, ax_val = fig.subplots(1, 3)
    ticks = fams
    param = zoo["config"].get("param") if zoo.get("kind") == "sweep" else None
    if param and all(f.startswith(f"{param}=") for f in fams):  # the values under the bars, the name once
        ticks = [f.removeprefix(f"{param}=") for f in fams]
        ax_sr.set_xlabel(param)
    _success_bars(ax_sr, ticks, zoo["rows"], [colors[f] for f in fams])
    ax_sr.set_title("LIBERO success rate (95% Wilson interval)")
    for fam, cur in zoo["curves"].items():
        if cur["train"]:
            s, loss = zip(*cur["train"], strict=True)
            ax_loss.plot(s, loss, color=colors.get(fam), alpha=0.2, lw=0.8)
            ax_loss.plot(s, ema(list(loss)), color=colors.get(fam), lw=1.6, label=fam)
        if cur["val"]:
            s, v = zip(*cur["val"], strict=True)
            ax_val.plot(s, v, color=colors.get(fam), marker="o", ms=3, lw=1.4, label=fam)
    ax_loss.set(title="training loss (each family's own objective)", xlabel="step", yscale="log")
    if zoo.get("kind") == "sweep":
        ax_loss.set_title("training loss (EMA-smoothed)")
    ax_val.set(title="validation action error (lower is better)", xlabel="step")
    for ax in (ax_loss, ax_val):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def per_task_figure(zoo: dict[str, Any]):
    """Successes per task (rows) and family (columns) as a heat map with the counts written in."""
    import numpy as np
    from matplotlib.figure import Figure

    fams = [row_label(r) for r in zoo["rows"]]
    tasks = sorted({t["task_id"] for f in fams for t in zoo["curves"][f]["per_task"]})
    grid = np.full((len(tasks), len(fams)), np.nan)
    labels = [["" for _ in fams] for _ in tasks]
    for j, f in enumerate(fams):
        for t in zoo["curves"][f]["per_task"]:
            i = tasks.index(t["task_id"])
            grid[i, j] = t["successes"] / max(1, t["episodes"])
            labels[i][j] = f"{t['successes']}/{t['episodes']}"
    fig = Figure(figsize=(1.6 + 1.3 * len(fams), 0.9 + 0.38 * len(tasks)), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    for i in range(len(tasks)):
        for j in range(len(fams)):
            ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(fams)), fams)
    ax.set_yticks(range(len(tasks)), [f"task {t}" for t in tasks])
    ax.set_title("successes per task")
    fig.colorbar(im, ax=ax, label="success rate")
    return fig


def ladder(rungs: list[tuple[str, dict[str, Any], dict[str, Any]]]):
    """One family's results under several budgets as a pandas DataFrame indexed by rung: each rung
    is ``(label, zoo, row)`` (a zoo's results and the family's row in it). Columns: the
    demonstrations (episodes, per task, init states, how many evaluated (task, init state) pairs
    were demonstrated: :func:`tutorial_utils.experiments.coverage.demonstrations`), steps, batch size, training minutes, best
    validation error, replan steps, success and its 95% interval."""
    import pandas as pd

    out = []
    for label, res, r in rungs:
        cfg = res.get("config", {})
        d = cfg.get("demonstrations") or {}
        per_task = (
            f"{d['per_task_min']}-{d['per_task_max']}"
            if d.get("per_task_min") != d.get("per_task_max")
            else d.get("per_task_min")
        )
        out.append(
            {
                "rung": label,
                "family": r["family"],
                **_success_text(r),  # the result first: a table wider than the page scrolls
                "demos": d.get("episodes"),
                "per task": per_task,
                "init states": f"{d['init_states'][0]}-{d['init_states'][1]}" if d.get("init_states") else None,
                "demonstrated": f"{d['eval_pairs_seen']}/{d['eval_pairs']}" if d.get("eval_pairs") else None,
                "steps": r["steps"],
                "batch": cfg.get("batch_size"),
                "train_min": r["train_min"],
                "best_val_mae": round(r["best_val_action_mae"], 4)
                if r.get("best_val_action_mae") is not None
                else None,
                "replan": cfg.get("replan_steps") or "chunk",
            }
        )
    return pd.DataFrame(out).set_index("rung")


def ladder_figure(rungs: list[tuple[str, dict[str, Any], dict[str, Any]]]):
    """The rungs of :func:`ladder` as bars: success rate with its 95% interval, one per rung."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    _success_bars(
        ax, [label for label, _, _ in rungs], [r for _, _, r in rungs], [f"C{i % 10}" for i in range(len(rungs))]
    )
    ax.set_title(f"{rungs[0][2]['family']}: LIBERO success rate per rung (95% Wilson interval)")
    return fig


def _health(r: dict[str, Any], curve: list | None) -> str:
    """A row's health findings. A ``diverging_loss`` recorded for a family with a first phase
    (VQ-BeT) before the check skipped that phase is judged again on the row's stored loss curve with
    today's check (:func:`tutorial_utils.train.watch.check_diverging`): the jump where the GPT phase
    starts is a new loss, not a diverging one."""
    codes = list(r.get("health") or [])
    if "diverging_loss" in codes and curve:
        from tutorial_utils.train.watch import check_diverging

        rows = [{"step": s, "loss": v} for s, v in curve]
        if not check_diverging(Path("."), rows, {"policy": r.get("family")}):
            codes.remove("diverging_loss")
    return ", ".join(codes) or "-"


def controls(zoo: dict[str, Any], target: float = CONTROL_TARGET):
    """A positive control read family by family, as a pandas DataFrame indexed by family: success
    and its 95% interval, whether the rate reached ``target``, the budget it had (steps done;
    ``planned``, the steps its timed budget was turned into; ``time limit hit``: the training's
    time limit stopped it before those, on a machine busier than when it was timed; batch;
    minutes), and the evidence for a family below it, all from the zoo's own curves: the
    validation action error at the first validation, at its best and at the last one, the best
    step and the last validated step (``falling at end``: of two or more validations, the best was
    the last one, so the error was still going down when the budget ran out), and the health findings of its
    training run."""
    import pandas as pd

    cfg = zoo.get("config", {})

    def planned(r: dict) -> int | None:  # the steps the budget was turned into (rows from before: when timed)
        s, minutes = r.get("timed_s_per_step"), cfg.get("train_minutes")
        return r.get("steps_planned") or (budget_steps(s, minutes) if s and minutes else None)

    out = []
    for r in zoo["rows"]:
        val = (zoo.get("curves", {}).get(row_label(r)) or {}).get("val") or []
        errors = [v for _, v in val]
        out.append(
            {
                "family": row_label(r),
                **_success_text(r),
                f"reached {100 * target:.0f}%": (r["success_rate"] or 0.0) >= target,
                "steps": r["steps"],
                "planned": planned(r),
                "time limit hit": r.get("time_limited"),
                "batch": r.get("batch_size", cfg.get("batch_size")),
                "train_min": r["train_min"],
                "val_first": round(errors[0], 4) if errors else None,
                "val_best": round(min(errors), 4) if errors else None,
                "val_last": round(errors[-1], 4) if errors else None,
                "best_step": r.get("best_step"),
                "last_val_step": val[-1][0] if val else None,
                "falling at end": len(val) > 1 and r.get("best_step") == val[-1][0],
                "health": _health(r, (zoo.get("curves", {}).get(row_label(r)) or {}).get("train")),
            }
        )
    return pd.DataFrame(out).set_index("family")


def rollouts(zoo: dict[str, Any], find=None) -> list[tuple[Path, str]]:
    """``(video, caption)`` of each row's promoted rollouts (``zoo promote`` copies the first success
    and the first failure of each evaluation), for :func:`tutorial_utils.report.page.videos`.
    ``find`` turns a promoted ``assets/...`` name into a file (default: this build's copy, else
    the reference's). A row promoted before its videos has none and is skipped."""
    if find is None:
        from tutorial_utils.report.provenance import find
    out = []
    for r in zoo["rows"]:
        for kind in ("success", "failure"):
            v = (r.get("videos") or {}).get(kind)
            if v:
                where = f"episode {v['episode']}" + (f" of task {v['task_id']}" if v.get("task_id") is not None else "")
                out.append((find(v["video"]), f"{row_label(r)}: {kind}, {where}"))
    return out


def outcome(results: dict) -> dict[str, Any]:
    """An evaluation's episodes, successes, success rate with its Wilson interval, and the
    policy server's latency (:func:`tutorial_utils.evaluate.loop.latency_summary`)."""
    from tutorial_utils.evaluate.loop import latency_summary
    from tutorial_utils.runs.checkpoints import wilson

    n, k = int(results["total_episodes"]), int(results["total_successes"])
    lo, hi = wilson(k, n) or (None, None)
    return {
        "episodes": n,
        "successes": k,
        "success_rate": k / n if n else None,
        "ci95_low": lo,
        "ci95_high": hi,
        **latency_summary(results),
    }


def intervals_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows' 95% success intervals (``ci95_low``, ``ci95_high``) overlap: if they do, the
    two success rates are not told apart by these episodes."""
    return a["ci95_high"] >= b["ci95_low"] and b["ci95_high"] >= a["ci95_low"]


def rungs(runs: dict[str, tuple[str, str]], target: float = CONTROL_TARGET):
    """Rungs of a positive control trained one checkpoint at a time, side by side as a pandas
    DataFrame indexed by name. Each value is a pair of promoted files of one checkpoint: its
    evaluation's results (``logs/<prefix>results.json``) and its latent probe (whose ``training``
    names the run). Per rung: success and its 95% interval, whether it reached ``target``, the
    demonstrations it learned from (its results' provenance), steps x batch, samples drawn per
    demonstration, the best validation action error and its step, and whether the best was the
    last step (the error still falling when the run stopped), and the interval's ends as numbers
    (``ci95_low``, ``ci95_high``: two rows are what :func:`intervals_overlap` compares)."""
    import pandas as pd

    from tutorial_utils.report import provenance

    out = {}
    for name, (results, probe) in runs.items():
        o, t = outcome(provenance.load_json(results)), provenance.load_json(probe).get("training") or {}
        demos, steps, batch = provenance.info(results).get("episodes"), t.get("steps"), t.get("batch_size")
        if not (demos and steps and batch):
            raise ConfigError(
                f"{probe}: no training steps/batch, or {results}: no demonstrations in its provenance; "
                "promote the probe from a checkpoint inside its training run and the results with promote eval"
            )
        out[name] = {
            **_success_text(o),
            f"reached {100 * target:.0f}%": (o["success_rate"] or 0.0) >= target,
            "demonstrations": demos,
            "steps": steps,
            "batch": batch,
            "samples per demonstration": round(steps * batch / demos),
            "val_best": round(t["best_val_action_mae"], 4),
            "best_step": t.get("best_step"),
            "best at last step": t.get("best_step") == steps,
            "ci95_low": round(o["ci95_low"], 3),
            "ci95_high": round(o["ci95_high"], 3),
        }
    return pd.DataFrame(out).T


def merge(zoos: list[dict[str, Any]]) -> dict[str, Any]:
    """Several zoos of different families (one family per zoo run, each with its own budget) as one
    zoo: their rows and curves together, the first zoo's config. Two zoos with the same row label
    cannot be merged this way (:func:`one_family` labels a family's runs apart)."""
    out: dict[str, Any] = {**zoos[0], "rows": [], "curves": {}}
    for z in zoos:
        for r in z["rows"]:
            label = row_label(r)
            if label in out["curves"]:  # every row added so far has its label there
                raise ValueError(f"two zoos both have a {label!r} row: use one_family to set them side by side")
            out["rows"].append(r)
            out["curves"][label] = z.get("curves", {}).get(label, {})
    return out


def one_family(zoos: dict[str, dict[str, Any]], family: str) -> dict[str, Any]:
    """One family's rows from several zoos (``{"16 min": zoo, "32 min": other}``) as one zoo, each row
    and its curves labelled ``"family, name"``, so :func:`controls`, :func:`figure` and
    :func:`rollouts` show the runs beside each other. The config is the last zoo's."""
    out: dict[str, Any] = {**list(zoos.values())[-1], "rows": [], "curves": {}}
    for name, z in zoos.items():
        rows = [r for r in z["rows"] if r["family"] == family]
        if not rows:
            raise KeyError(
                f"zoo {name!r} has no {family!r} row (its families: {', '.join(r['family'] for r in z['rows'])})"
            )
        for r in rows:
            label = f"{family}, {name}"
            out["rows"].append({**r, "label": label})
            out["curves"][label] = z.get("curves", {}).get(row_label(r), {})
    return out


def side_by_side(zoos: dict[str, dict[str, Any]]):
    """The same families in several zoos (``{"8 min": zoo, "16 min": other}``), one row per family
    that every zoo has, as a pandas DataFrame: each zoo's success with its interval, steps and best
    validation action error, columns grouped by the zoo's name. The first zoo's family order."""
    import pandas as pd

    rows = {name: {row_label(r): r for r in z["rows"]} for name, z in zoos.items()}
    first = next(iter(rows.values()))
    families = [f for f in first if all(f in r for r in rows.values())]
    out = []
    for f in families:
        line: dict[str, Any] = {"family": f}
        for name, by in rows.items():
            r = by[f]
            s = _success_text(r)
            line[(name, "success")] = s["success"]
            line[(name, "ci95")] = s["ci95"]
            line[(name, "steps")] = r["steps"]
            line[(name, "val_best")] = r.get("best_val_action_mae")
        out.append(line)
    df = pd.DataFrame(out).set_index("family")
    df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df
