"""Pages rendered from the promoted files at build time (the ``results-summary``,
``promoted-artifacts`` and ``facts-table`` directives of :mod:`tutorial_utils.report.sphinx_ext`):
the intro's results summary, the artifacts page's list of what promotion wrote, and the facts
registry with a link to each fact's source. Each function returns Markdown and the files it read."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from tutorial_utils import paths
from tutorial_utils.report import provenance as P

#: who writes each file under logs/ and assets/ (first match wins); ``{cpu}`` rows are the main job's
PRODUCERS: tuple[tuple[str, str], ...] = (
    ("logs/promoted.json", "every promotion: one provenance stamp per promoted file (`report.provenance`)"),
    (
        "logs/record_dataset.json",
        "the main job's recording stage (`python -m tutorial_utils pipeline`, `report.promote.dataset_card`)",
    ),
    (
        "assets/record_episode*",
        "the main job's recording stage: its first episode (`report.promote.recording_episode`)",
    ),
    ("logs/train_cpu_*", "the main job's training stage (`report.promote.training`)"),
    ("logs/eval_mini_*", "the main job's evaluation stage (`report.promote.evaluation`)"),
    (
        "assets/eval_mini_*rollout.mp4",
        "the main job's evaluation stage: a rollout, and a failed one beside a success (`report.promote.evaluation`)",
    ),
    ("logs/eval_*", "the expert's evaluation job, `python -m tutorial_utils promote eval RUN`"),
    ("assets/eval_*rollout.mp4", "the expert's evaluation job, `python -m tutorial_utils promote eval RUN`"),
    (
        "assets/*_success.mp4",
        "`python -m tutorial_utils zoo promote RUN`: each row's first successful rollout (`report.promote.rollout_pair`)",
    ),
    (
        "assets/*_failure.mp4",
        "`python -m tutorial_utils zoo promote RUN`: each row's first failed rollout (`report.promote.rollout_pair`)",
    ),
    ("logs/zoo_*.json", "the zoo job (`notebooks/jobs/zoo.md`), then `python -m tutorial_utils zoo promote RUN`"),
    (
        "logs/positive_control_act_state_*.json",
        "the sweep job (ACT, `use_state` true and false) on the positive control's task, then `python -m "
        "tutorial_utils zoo promote RUN --prefix positive_control_act_state_cpu`",
    ),
    (
        "logs/act_lerobot_train.json",
        "`python -m tutorial_utils lerobot-train` (ACT trained by LeRobot's own script on the control's task)",
    ),
    (
        "*/act_lerobot_eval_*",
        "the evaluate job on LeRobot's ACT, then `python -m tutorial_utils promote eval RUN --prefix act_lerobot_eval_`",
    ),
    (
        "*/act_clip10_eval_*",
        "the evaluate job on ACT trained with gradient clipping 10, then `python -m tutorial_utils promote eval RUN "
        "--prefix act_clip10_eval_`",
    ),
    (
        "*/act_recipe_eval_*",
        "the evaluate job on ACT trained here with LeRobot's recipe, then `python -m tutorial_utils promote eval RUN "
        "--prefix act_recipe_eval_`",
    ),
    (
        "*/vqbet_wrist_eval_*",
        "the evaluate job on VQ-BeT trained with its wrist camera, then `python -m tutorial_utils promote eval RUN "
        "--prefix vqbet_wrist_eval_`",
    ),
    (
        "*/vqbet_obs1_eval_*",
        "the evaluate job on VQ-BeT trained with one observation frame, then `python -m tutorial_utils promote eval "
        "RUN --prefix vqbet_obs1_eval_`",
    ),
    (
        "*/vqbet_meanstd_eval_*",
        "the evaluate job on VQ-BeT trained with standardised images, then `python -m tutorial_utils promote eval "
        "RUN --prefix vqbet_meanstd_eval_`",
    ),
    (
        "*/vqbet_offset100_eval_*",
        "the evaluate job on VQ-BeT trained with its offset loss weighted 100, then `python -m tutorial_utils "
        "promote eval RUN --prefix vqbet_offset100_eval_`",
    ),
    (
        "*/vqbet_tentask_eval_*",
        "the evaluate job on VQ-BeT trained on ten tasks' demonstrations (the control's starts held out), then "
        "`python -m tutorial_utils promote eval RUN --prefix vqbet_tentask_eval_`",
    ),
    (
        "*/vqbet_img96_eval_*",
        "the evaluate job on VQ-BeT trained on 96 px images cropped to 84, then `python -m tutorial_utils promote "
        "eval RUN --prefix vqbet_img96_eval_`",
    ),
    (
        "*/vqbet_frozen_eval_*",
        "the evaluate job on VQ-BeT trained with its camera encoder frozen at its initial weights "
        "(`-p freeze_modules policy.vqbet.rgb_encoder`), then `python -m tutorial_utils promote eval RUN --prefix "
        "vqbet_frozen_eval_`",
    ),
    (
        "*/vqbet_blind_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state (`-p use_state false`), then `python -m "
        "tutorial_utils promote eval RUN --prefix vqbet_blind_eval_`",
    ),
    (
        "*/vqbet_blind3x_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state for three times the control's steps (`-p use_state "
        "false -p steps 4449`), then `python -m tutorial_utils promote eval RUN --prefix vqbet_blind3x_eval_`",
    ),
    (
        "*/vqbet_blind6x_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state for six times the control's steps (`-p use_state "
        "false -p steps 8898`), then `python -m tutorial_utils promote eval RUN --prefix vqbet_blind6x_eval_`",
    ),
    (
        "*/vqbet_blind30_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state on thirty demonstrations of the control's task "
        "(init states 20-49; `-p use_state false -p steps 4449`), then `python -m tutorial_utils promote eval RUN "
        "--prefix vqbet_blind30_eval_`",
    ),
    (
        "*/vqbet_blind30epochs_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state on those thirty demonstrations, each drawn as often "
        "as the three-times run drew its twenty (`-p use_state false -p steps 6674`), then `python -m tutorial_utils "
        "promote eval RUN --prefix vqbet_blind30epochs_eval_`",
    ),
    (
        "*/vqbet_blind_zoo_eval_*",
        "the evaluate job on VQ-BeT trained blind to its state on the comparison's ten tasks at the matched steps "
        "(`-p use_state false -p steps 3192`, all tasks, 10 episodes each), then `python -m tutorial_utils promote "
        "eval RUN --prefix vqbet_blind_zoo_eval_`",
    ),
    (
        "*/vqbet_statedrop_eval_*",
        "the evaluate job on VQ-BeT trained with its state hidden in half the training samples (`-p state_dropout "
        "0.5 -p steps 4449`), then `python -m tutorial_utils promote eval RUN --prefix vqbet_statedrop_eval_`",
    ),
    (
        "*/vqbet_statedrop90_eval_*",
        "the evaluate job on VQ-BeT trained with its state hidden in nine training samples in ten (`-p "
        "state_dropout 0.9 -p steps 4449`), then `python -m tutorial_utils promote eval RUN --prefix "
        "vqbet_statedrop90_eval_`",
    ),
    (
        "*/tdmpc_bc_eval_*",
        "the evaluate job on TD-MPC trained with a behaviour-cloning term that reaches its encoder (`-p bc_coeff "
        "1.0`), then `python -m tutorial_utils promote eval RUN --prefix tdmpc_bc_eval_`",
    ),
    (
        "logs/act_chunks_cpu.json",
        "the zoo job on ACT alone (the positive control's task and starts), then `python -m tutorial_utils zoo "
        "promote RUN --prefix act_chunks_cpu`",
    ),
    (
        "*/act_ensemble_eval_*",
        "the evaluate job on that ACT checkpoint with `-p temporal_ensemble_coeff 0.01`, then `python -m "
        "tutorial_utils promote eval RUN --prefix act_ensemble_eval_`",
    ),
    (
        "*/act_replan1_eval_*",
        "the evaluate job on that ACT checkpoint with `-p replan_steps 1`, then `python -m tutorial_utils promote "
        "eval RUN --prefix act_replan1_eval_`",
    ),
    (
        "logs/openloop_*.json",
        "`python -m tutorial_utils openloop --out ...` (demonstrations replayed through the control's checkpoints)",
    ),
    (
        "logs/latent_*.json",
        "`python -m tutorial_utils latent --out ...` (a checkpoint opened beside it untrained: TD-MPC's world model, "
        "the camera keypoints of Diffusion Policy and VQ-BeT)",
    ),
    (
        "logs/positive_control_*.json",
        "the zoo job on one task from held-out starts, then `python -m tutorial_utils zoo promote RUN "
        "--prefix positive_control_cpu`",
    ),
    ("logs/sweep_*.json", "the sweep job (`notebooks/jobs/sweep.md`), then `python -m tutorial_utils zoo promote RUN`"),
    ("logs/expert_*.json", "`python -m tutorial_utils expert` (the scripted expert's success table and one trace)"),
    ("logs/record_bench_render.json", "`benchmarks/bench_render.py` (render profiles)"),
    (
        "logs/bench_train_breakdown_cpu.json",
        "`benchmarks/bench_train.py --breakdown --batch-size 32 --steps 30 --compile` (a training step's phases)",
    ),
    ("logs/bench_train_cpu.json", "`benchmarks/bench_train.py --batch-size 32 --thread-rows` (the loader's settings)"),
    (
        "logs/compile_*_train_*",
        "the train job in the `cpu` profile with `-p steps 1500 -p save_freq 0 -p eval_freq 500 -p torch_compile "
        "false|true`, then `python -m tutorial_utils promote train RUN --prefix compile_off_train_|compile_on_train_`",
    ),
    ("assets/record_render_profiles.png", "`benchmarks/bench_render.py` (render profiles)"),
    ("assets/*.svg", "drawn by hand (each SVG says so in its first lines)"),
    ("assets/book.css", "the book's style sheet, by hand"),
)


def producer(rel: str) -> str | None:
    return next((who for pattern, who in PRODUCERS if fnmatch.fnmatch(rel, pattern)), None)


def _readers(name: str) -> list[str]:
    """The chapters whose source names the file."""
    out = []
    for page in sorted(paths.NOTEBOOKS.glob("*.md")):
        if name in page.read_text(encoding="utf-8"):
            out.append(page.stem)
    return out


def artifacts_md() -> tuple[str, list[Path]]:
    """A table of every file in the shipped reference and in this build's copy: who wrote it, its
    size, which chapters read it, and its run (from the provenance stamp or the file)."""
    rows, read = [], []
    for kind, base in (("logs", paths.LOGS), ("assets", paths.ASSETS)):
        names = {p.name for p in base.glob("*") if p.is_file()}
        names |= {p.name for p in (paths.PROMOTED / kind).glob("*") if p.is_file()}
        for name in sorted(names):
            rel = f"{kind}/{name}"
            path = P.find(rel)
            read.append(path)
            run = ""
            if path.suffix == ".json" and name != P.STAMPS:
                meta = P.info(rel)
                run = meta.get("run_id", "")
            copy = "this build" if path == P.build_path(rel) else "reference"
            chapters = ", ".join(_readers(name)) or "-"
            size = path.stat().st_size
            size_text = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
            rows.append(
                f"| `{rel}` | {producer(rel) or 'unknown'} | {copy} | {size_text} | {chapters} | {run or '-'} |"
            )
    head = "| file | written by | copy | size | read by | run |\n|---|---|---|---|---|---|"
    return head + "\n" + "\n".join(rows) + "\n", read


def _held_out(demos: dict) -> str:
    """``; 0 of the 100 evaluated starts were demonstrated`` from a zoo's recording coverage."""
    seen, pairs = demos.get("eval_pairs_seen"), demos.get("eval_pairs")
    return "" if seen is None or not pairs else f"; {seen} of the {pairs} evaluated starts of each were demonstrated"


def _minutes(seconds: float | None) -> str:
    return f"{seconds / 60:.0f} min" if seconds else "-"


def results_summary_md() -> tuple[str, list[Path]]:
    """What the CPU path reaches and in how long, from the promoted files (this build's copy first)."""
    read: list[Path] = []

    def load(name):
        p = P.find_optional(name)
        if p is None:
            return None
        read.append(p)
        return P.load_json(name)

    rows = []
    card = load("logs/record_dataset.json")
    if card:
        s = card.get("summary") or {}
        cfg = card.get("config") or {}
        first = int(cfg.get("init_state_offset", 0))
        last = first + int(cfg.get("episodes_per_task", 1)) - 1
        wall = card.get("job_wall_s") or s.get("wall_s")
        rows.append(
            (
                "record demonstrations (scripted expert)",
                f"{card['total_episodes']} episodes, {card['total_frames']} frames, {card['total_tasks']} tasks, "
                f"init states {first} to {last}; the expert succeeded on "
                f"{P.success(s.get('episodes', 0), s.get('items', 0)).split(' (')[0]} of its attempts",
                _minutes(wall),
                P.origin("logs/record_dataset.json"),
            )
        )
    summary = load("logs/train_cpu_summary.json")
    if summary:
        best = (summary.get("best") or {}).get("val_action_mae")
        rows.append(
            (
                "train the mini policy",
                f"{summary['steps_done']} steps at batch {summary['batch_size']}; loss {summary['first_loss']:.2f} to "
                f"{summary['last_loss']:.3f}" + (f", best validation action error {best:.3f}" if best else ""),
                _minutes(summary.get("wall_s")),
                P.origin("logs/train_cpu_summary.json"),
            )
        )
    ev = load("logs/eval_mini_results.json")
    if ev:
        rows.append(
            (
                "evaluate it in LIBERO (libero_spatial)",
                P.evaluation_success("logs/eval_mini_results.json"),
                _minutes(ev.get("wall_s")),
                P.origin("logs/eval_mini_results.json"),
            )
        )
    total = sum(
        float(x or 0)
        for x in (
            card and (card.get("job_wall_s") or (card.get("summary") or {}).get("wall_s")),
            summary and summary.get("wall_s"),
            ev and ev.get("wall_s"),
        )
    )
    zoo = load("logs/zoo_cpu.json")
    if zoo:
        ranked = sorted(zoo["rows"], key=lambda r: (-(r.get("success_rate") or 0), r["family"]))
        cfg = zoo.get("config") or {}
        # the second training seed: one promoted zoo per family (each keeps its own step count)
        seconds = sorted(
            {q.name for base in (paths.LOGS, paths.PROMOTED / "logs") for q in base.glob("zoo_cpu_seed1_*.json")}
        )
        again = [z for z in (load(f"logs/{name}") for name in seconds) if z]
        rows.append(
            (
                f"compare {len(ranked)} families at one budget (chapter 9)",
                f"training seed {cfg.get('seed')}: "
                + "; ".join(f"{r['family']} {P.success(r['successes'], r['episodes'])}" for r in ranked)
                + _held_out(cfg.get("demonstrations") or {})
                + (
                    f". Training seed {again[0]['config'].get('seed')}: "
                    + "; ".join(
                        f"{r['family']} {P.success(r['successes'], r['episodes'])}" for z in again for r in z["rows"]
                    )
                    if again
                    else ""
                ),
                f"{cfg.get('train_minutes') or 0:g} min of training each",
                P.origin("logs/zoo_cpu.json"),
            )
        )
    best = None
    for name in ("logs/zoo_cpu_demos.json", "logs/zoo_cpu_long.json"):
        z = load(name)
        if not z:
            continue
        for r in z["rows"]:
            key = (r.get("ci95_low") or 0, r.get("success_rate") or 0)
            if best is None or key > best[0]:
                best = (key, name, z, r)
    if best:
        _, name, z, r = best
        demos = (z.get("config") or {}).get("demonstrations") or {}
        seen = demos.get("eval_pairs_seen")
        rows.append(
            (
                f"the best result with more budget ({r['family']}, chapter 9)",
                f"{P.success(r['successes'], r['episodes'], seen)}; {demos.get('episodes', '?')} demonstrations, "
                f"{r['steps']} steps at batch {r['batch_size']}",
                f"{r['train_min']:.0f} min of training",
                P.origin(name),
            )
        )
    out = "| stage | result | time | from |\n|---|---|---|---|\n"
    out += "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows) + "\n"
    if total:
        out += (
            f"\nThe main job's three stages took {total / 60:.0f} minutes of wall time in all on the machine "
            "that ran them.\n"
        )
    return out, read


def facts_md() -> tuple[str, list[Path]]:
    """Every fact of the registry with its value, unit, source and a link to that source."""
    from tutorial_utils.report import facts

    rows = []
    for name in sorted(facts.FACTS):
        key = facts.reference(name)
        label, url = facts.REFERENCES[key]
        f = facts.fact(name)
        rows.append(
            f"| `{name}` | {facts.text(name)} {f['unit']} | [{label}]({url}) | "
            f"{facts.source_text(name).replace('|', '/')} |"
        )
    return "| fact | value | source | where it says so |\n|---|---|---|---|\n" + "\n".join(rows) + "\n", []
