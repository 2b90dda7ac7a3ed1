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
def test_bench_eval_workers_quick_runs_one_and_two_workers_on_the_same_episodes(tmp_path):
    """The benchmark's two runs (kept) are also the suite's real-LIBERO check of the evaluation's
    client processes: the zero policy, 2 tasks x 2 trials, 6 steps, with 2 workers writes the log
    lines and results that 1 client writes, and each worker keeps its own log."""
    from helpers import comparable_results
    from tutorial_utils import logs

    out = _last_json(
        "bench_eval_workers.py", "--tasks", "0-1", "--trials", "2", "--max-steps", "6", "--keep", str(tmp_path)
    )
    assert out["bench"] == "eval_workers" and out["episodes"] == 4 and out["max_steps"] == 6
    assert out["workers1_episodes_per_hour"] > 0 and out["workers2_episodes_per_hour"] > 0
    assert out["same_log_lines"] is True  # the two runs evaluated the same episodes
    assert out["ratio_2_vs_1"] == pytest.approx(
        out["workers2_episodes_per_hour"] / out["workers1_episodes_per_hour"], rel=0.01
    )
    one, two = (tmp_path / f"rep0_workers{w}" for w in (1, 2))
    lines = logs.documented_eval_lines(one / "eval_libero_spatial.log")
    assert lines == logs.documented_eval_lines(two / "eval_libero_spatial.log")
    assert len(lines) == 2 * (1 + 4 * 2 + 2) + 2  # per task: its name, 4 lines an episode, 2 rates; 2 totals
    results = [json.loads((d / "results.json").read_text()) for d in (one, two)]
    assert comparable_results(results[1]) == comparable_results(results[0]) and results[1]["total_episodes"] == 4
    assert (two / "workers" / "w1" / "eval_libero_spatial.log").is_file()


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


@pytest.mark.slow
def test_bench_serving_quick_measures_the_policy_server_against_an_echo_server():
    out = _last_json("bench_serving.py", "--requests", "30")
    assert out["bench"] == "serving" and out["requests_per_side"] >= 30 and out["payload_bytes"] > 100_000
    assert out["echo_p50_ms"] > 0 and out["policy_p50_ms"] > 0
    assert out["p50_ratio_vs_echo"] == pytest.approx(out["policy_p50_ms"] / out["echo_p50_ms"], rel=0.01)
    assert out["meets_target"] == (out["p50_ratio_vs_echo"] <= out["target_p50_ratio"])


def test_every_benchmark_has_a_quick_smoke_test_here():
    """A new ``benchmarks/bench_*.py`` is run here with ``--quick`` (or named in a test of its own)."""
    here = Path(__file__).read_text()
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("bench_*.py")) if f'"{p.name}"' not in here]
    assert not missing, f"benchmarks without a smoke test in {Path(__file__).name}: {missing}"


def test_bench_serving_fairness_quick_measures_a_good_client_under_a_flood():
    out = _last_json("bench_serving_fairness.py", "--requests", "30", "--infer-ms", "2")
    for key in (
        "alone_p50_ms",
        "alone_p99_ms",
        "flood_p50_ms",
        "flood_p99_ms",
        "p99_ratio_flood_vs_alone",
        "target_p99_ratio",
        "meets_target",
        "flood_frames_sent",
        "bad_frames_answered",
        "log_bytes_per_bad_frame",
        "log_tracebacks",
    ):
        assert key in out, key
    assert out["bench"] == "serving_fairness" and out["requests_per_side"] == 30
    assert out["flood_frames_sent"] > 0 and out["bad_frames_answered"] > 0  # the flood reached the server
    assert out["log_tracebacks"] == 0  # a bad frame logs one short line
    assert out["alone_p99_ms"] > 0 and out["flood_p99_ms"] > 0


@pytest.mark.slow
def test_bench_train_quick_reports_each_setting():
    out = _last_json("bench_train.py", "--profile", "ci", "--steps", "6", "--thread-rows")
    assert out["bench"] == "train" and out["device"] == "cpu"
    rows = {r["row"]: r for r in out["rows"]}
    assert list(rows)[0] == "memory (reference)"
    for name in ("0 workers", "1 worker", "auto workers", "auto workers, bf16", "auto workers, accum 2"):
        r = rows[f"lerobot, {name}"]
        assert r["samples_per_s"] > 0 and 0 <= r["data_wait_share"] <= 1, name
    # each row ran with the setting it names (the trainer's resolved values)
    assert rows["lerobot, 1 worker"]["num_workers"] == 1 and rows["lerobot, 0 workers"]["num_workers"] == 0
    assert rows["lerobot, auto workers, bf16"]["precision"] == "bf16"
    assert rows["lerobot, auto workers"]["precision"] == "fp32"
    assert rows["lerobot, auto workers, accum 2"]["grad_accum_steps"] == 2
    for n in (1, 2):  # the thread rows ran with their torch threads, beside one worker
        r = rows[f"lerobot, 1 worker, {n} thread{'s' if n > 1 else ''}"]
        assert r["threads"] == n and r["num_workers"] == 1
    assert out["best_samples_per_s"] > 0 and out["best_row"] in rows


@pytest.mark.slow
def test_bench_train_breakdown_times_each_phase_and_variant_of_the_step():
    out = _last_json("bench_train.py", "--breakdown", "--profile", "ci", "--quick", "--steps", "3", "--batch-size", "4")
    assert out["bench"] == "train_breakdown"
    rows = {r["row"]: r for r in out["rows"]}
    assert list(rows)[0] == "default (torch threads)" and rows["default (torch threads)"]["vs_reference"] == 1.0
    assert rows["1 thread"]["threads"] == 1 and rows["2 threads"]["threads"] == 2
    for name, r in rows.items():
        phases = r["phases_ms"]
        assert set(phases) == {"augment", "forward", "backward", "grad norm", "optimiser", "ema"}, name
        assert all(v > 0 for v in phases.values()), name
        assert abs(sum(phases.values()) - r["ms_per_step"]) < 0.01 * r["ms_per_step"] + 0.01, name
        assert r["op_kinds_ms"]["matrix products"] > 0 and r["op_kinds_ms"]["convolution"] > 0, name
        assert r["top_ops_ms"], name


#: what the GPU machine of the device tool lacks (bench_gpu_train.py must run without them)
ABSENT_ON_GPU_MACHINE = ("av", "websockets", "libero", "mujoco", "papermill", "matplotlib", "jupytext", "h5py", "wandb")

_BLOCKER = """
import importlib.abc, importlib.machinery, sys
BLOCK = set({names!r})
class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {{spec.name!r}} (blocked by the test)", name=spec.name)
    def exec_module(self, module):
        pass
class _Block:
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, _Loader()) if name.split(".")[0] in BLOCK else None
sys.meta_path.insert(0, _Block())
"""


def test_bench_gpu_train_uses_the_train_jobs_gpu_profile(monkeypatch):
    import importlib.util

    import jupytext

    from tutorial_utils import jobs

    spec = importlib.util.spec_from_file_location("bench_gpu_train", ROOT / "benchmarks" / "bench_gpu_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    import dataclasses

    from tutorial_utils.params import profile_values
    from tutorial_utils.policies.mini import PolicyConfig
    from tutorial_utils.train.config import family_recipe

    gpu = jobs.default_parameters(jupytext.read(ROOT / "notebooks" / "jobs" / "train.md"), "gpu")
    # the model's sizes are the mini family's own gpu values, the rest the train job's
    gpu.update({f.name: profile_values(f)["gpu"] for f in dataclasses.fields(PolicyConfig) if f.name not in gpu})
    # a recipe field the job leaves None is the family's recipe (mini's: the book's)
    gpu.update({k: v for k, v in family_recipe("mini", "gpu").items() if gpu.get(k) is None})
    assert {k: gpu[k] for k in bench.GPU_PROFILE} == bench.GPU_PROFILE
    # "after" is what the gpu profile runs with
    assert gpu["torch_compile"] is True and gpu["precision"] == "auto" and gpu["pin_memory"] is None


@pytest.mark.slow
def test_bench_gpu_train_runs_end_to_end_on_cpu_without_the_packages_the_gpu_machine_lacks(tmp_path):
    import os

    (tmp_path / "sitecustomize.py").write_text(_BLOCKER.format(names=ABSENT_ON_GPU_MACHINE))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    argv = ["--device", "cpu", "--tiny", "--compile-backend", "aot_eager", "--rows", "before,after", "--steps", "8"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "gpu_train" and out["failed"] == []
    before, after = out["rows"]
    assert (before["row"], before["precision"], before["num_workers"], before["compile"]) == (
        "before",
        "fp32",
        1,
        False,
    )
    assert after["row"] == "after" and after["compile"] is True and after["precision"] == "fp32"  # auto on a CPU
    assert before["samples_per_s"] > 0 and after["samples_per_s"] > 0 and "speedup" in out and "target_met" in out
