"""The platform benchmarks run (``--quick``, tiny sizes) and end with their JSON line.

They measure, they do not judge speed: these tests check only that each runs to the end, that
its last line is one JSON object with the figures the issue asks for, and that the facts it
reports (a stop leaves a loadable checkpoint, the bundle's actions match) hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _last_json(script: str, *argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    out = json.loads(lines[-1])
    assert isinstance(out, dict)
    return out


@pytest.mark.slow
def test_bench_dataset_quick_reports_statistics_and_sampling_against_their_references(tmp_path):
    out = _last_json("bench_dataset.py", "--root", str(tmp_path / "bench_dataset"))
    assert out["mode"] == "quick" and out["episodes"] == 24 and out["frames"] == 2400
    for key in ("stats_cold_s", "stats_reference_pandas_s", "sample_grouped_128_per_s", "sample_naive_128_per_s"):
        assert out[key] > 0, key
    # ratios against references measured in the same run
    assert out["stats_speedup_cold_vs_reference"] > 0 and out["sample_speedup_128_vs_naive"] > 0
    assert isinstance(out["targets_met"], dict)


@pytest.mark.slow
@pytest.mark.libero
def test_bench_render_quick_compares_the_render_profiles():
    out = _last_json("bench_render.py", "--steps", "3")
    assert set(out) == {"headless_steps_per_s", "reference_steps_per_s", "fast_steps_per_s", "fast_vs_reference"}
    assert all(v > 0 for v in out.values())
    assert out["fast_vs_reference"] == pytest.approx(out["fast_steps_per_s"] / out["reference_steps_per_s"], rel=0.05)


@pytest.mark.slow
def test_bench_zoo_quick_times_a_family_against_mini():
    pytest.importorskip("lerobot", reason="the LeRobot families need lerobot")
    out = _last_json("bench_zoo.py", "--families", "act", "--steps", "1", "--batch-size", "2")
    assert out["benchmark"] == "zoo" and out["reference"] == "mini" and out["timed_steps"] == 1
    assert set(out["families"]) == {"mini", "act"}
    for fam, row in out["families"].items():
        assert row["s_per_step"] > 0 and row["params_m"] > 0 and row["round_trip_ms_p50"] > 0, fam
    assert out["families"]["mini"]["step_ratio_vs_mini"] == 1.0


@pytest.mark.slow
@pytest.mark.libero
def test_bench_eval_workers_quick_runs_one_and_two_workers_on_the_same_episodes():
    out = _last_json("bench_eval_workers.py", "--tasks", "0", "--trials", "1", "--max-steps", "3")
    assert out["bench"] == "eval_workers" and out["episodes"] == 1 and out["max_steps"] == 3
    assert out["workers1_episodes_per_hour"] > 0 and out["workers2_episodes_per_hour"] > 0
    assert out["same_log_lines"] is True  # the two runs evaluated the same episodes
    assert out["ratio_2_vs_1"] == pytest.approx(
        out["workers2_episodes_per_hour"] / out["workers1_episodes_per_hour"], rel=0.01
    )


@pytest.mark.slow
def test_bench_control_quick_stops_both_ways_with_a_loadable_checkpoint():
    out = _last_json("bench_control.py", "--repeats", "1", "--warm-rows", "2")
    for key in (
        "control_median_s",
        "control_max_s",
        "sigterm_median_s",
        "sigterm_max_s",
        "ratio",
        "all_loadable",
        "checkpoint_steps",
        "load_avg_1m",
    ):
        assert key in out, key
    assert out["bench"] == "control" and out["profile"] == "ci"
    assert len(out["control_exit_s"]) == len(out["sigterm_exit_s"]) == 1
    assert out["all_loadable"] is True
    assert all(s is not None and s >= 2 for s in out["checkpoint_steps"])  # stopped after the rows it waited for
    assert all(n is not None and n >= 0 for n in out["steps_after_command"])
    assert out["control_median_s"] > 0 and out["sigterm_median_s"] > 0


@pytest.mark.slow
def test_bench_export_quick_reports_load_latency_and_parity():
    out = _last_json("bench_export.py", "--loads", "2", "--infer", "5", "--steps", "2")
    for key in (
        "source_load_s",
        "bundle_load_s",
        "load_ratio",
        "source_p50_ms",
        "source_p90_ms",
        "bundle_p50_ms",
        "bundle_p90_ms",
        "p50_ratio",
        "parity_max_abs_diff",
        "verify_s",
        "load_avg_1m",
    ):
        assert key in out, key
    assert out["bench"] == "export" and out["step"] == 2
    assert 0 <= out["parity_max_abs_diff"] <= 1e-5  # the same weights: the same actions
    assert out["bundle_load_s"] > 0 and out["source_p50_ms"] > 0 and out["verify_s"] > 0


@pytest.mark.slow
def test_bench_monitor_quick_compares_off_on_and_drawn_here():
    out = _last_json("bench_monitor.py", "--steps", "60", "--draw-here")
    for key in ("ratio", "ratios", "overhead_pct", "predicted_overhead_pct", "here_ratio", "figure_ms", "load_avg_1m"):
        assert key in out, key
    assert out["figure_by_helper"] is True  # the monitor in the training process drew through its helper
    assert len(out["off_runs"]) == len(out["on_runs"]) == len(out["here_ratios"]) == 1
    assert out["ratio"] > 0 and out["here_ratio"] > 0 and out["figure_ms"] > 0
