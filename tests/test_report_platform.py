"""The glue of the training-platform chapter (tutorial_utils.report.platform): background
commands, waiting for a run's step, the tampered bundle copy, the openpi observation."""

import json
import sys

import numpy as np
import pytest

from tutorial_utils.io import sha256_file
from tutorial_utils.report import platform as pf
from tutorial_utils.runs import export


def test_overrides_are_cli_words():
    words = pf.overrides({"steps": 5, "progress": False, "optimizer_betas": (0.9, 0.95), "policy.model_dim": 32})
    assert words == ["steps=5", "progress=false", "optimizer_betas=0.9,0.95", "policy.model_dim=32"]


def test_start_training_builds_the_train_command(tmp_path, monkeypatch):
    seen = {}

    def fake_start(args, log):
        seen.update(args=args, log=log)
        return "proc"

    monkeypatch.setattr(pf, "start_cli", fake_start)
    assert pf.start_training(tmp_path / "run", tmp_path / "ds", steps=3) == "proc"
    assert seen["args"][:5] == ["train", "--dataset", str(tmp_path / "ds"), "--output-dir", str(tmp_path / "run")]
    assert seen["args"][5:] == ["progress=false", "steps=3"]
    assert seen["log"] == tmp_path / "run.out"  # beside the run, not inside it


def test_start_cli_runs_in_the_background_and_logs(tmp_path):
    proc = pf.start_cli(["runs", "--help"], tmp_path / "out.log")
    assert proc.args[:3] == [sys.executable, "-m", "tutorial_utils"]
    assert pf.finish(proc, timeout=60) == 0
    assert "rollback" in (tmp_path / "out.log").read_text()
    with pytest.raises(pf.BackgroundError, match="does not exist"):
        pf.start_cli(["runs", "list"], tmp_path / "missing" / "out.log")


def _metrics(run, steps, tail=""):
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps) + tail)


def test_current_step_reads_metrics_and_heartbeat_and_skips_a_cut_line(tmp_path):
    run = tmp_path / "run"
    assert pf.current_step(run) is None
    _metrics(run, [2, 4], tail='{"step": 6, "lo')  # a write cut short
    assert pf.current_step(run) == 4
    (run / "status.json").write_text(json.dumps({"training": {"state": "paused", "step": 7, "total": 10}}))
    assert pf.current_step(run) == 7  # the heartbeat is newer than the last metrics row


def test_wait_for_step_returns_or_explains(tmp_path):
    run = tmp_path / "run"
    _metrics(run, [2, 4, 6])
    assert pf.wait_for_step(run, 5, timeout=5) == 6
    with pytest.raises(pf.BackgroundError, match="not reached within"):
        pf.wait_for_step(run, 8, timeout=0.3)
    proc = pf.start_cli(["runs", "--help"], tmp_path / "p.log")
    with pytest.raises(pf.BackgroundError, match=r"exited \(code 0\) at step 6 before step 8"):
        pf.wait_for_step(run, 8, proc, timeout=60)


def _bundle(tmp_path):
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "model.safetensors").write_bytes(bytes(range(64)))
    (b / "config.json").write_text("{}")
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in b.iterdir()}
    (b / export.MANIFEST_FILE).write_text(json.dumps({"format": export.BUNDLE_FORMAT, "files": files}))
    return b


def test_tampered_copy_changes_one_byte_and_verify_names_the_file(tmp_path):
    b = _bundle(tmp_path)
    export.verify(b)
    changed = pf.tampered_copy(b, tmp_path / "t")
    a, c = (b / "model.safetensors").read_bytes(), changed.read_bytes()
    assert len(a) == len(c) and sum(x != y for x, y in zip(a, c, strict=True)) == 1
    export.verify(b)  # the original is untouched
    with pytest.raises(export.BundleError, match="model.safetensors changed"):
        export.verify(changed.parent)
    with pytest.raises(pf.BackgroundError, match="exists already"):
        pf.tampered_copy(b, tmp_path / "t")
    with pytest.raises(pf.BackgroundError, match="does not exist"):
        pf.tampered_copy(b, tmp_path / "t2", file="nope.bin")


def test_openpi_observation_from_a_lerobot_batch():
    from tutorial_utils.policies.base import IMAGE_KEY, PROMPT_KEY, STATE_KEY, WRIST_KEY

    class Model:
        image_size = 16

    batch = export.example_batch(Model(), n=3, seed=1)
    obs = pf.openpi_observation(batch, 2)
    assert set(obs) == {IMAGE_KEY, WRIST_KEY, STATE_KEY, PROMPT_KEY}
    assert obs[IMAGE_KEY].shape == (16, 16, 3) and obs[IMAGE_KEY].dtype == np.uint8
    np.testing.assert_array_equal(obs[WRIST_KEY], batch["observation.images.wrist_image"][2])
    assert obs[STATE_KEY].dtype == np.float32 and isinstance(obs[PROMPT_KEY], str)
    with pytest.raises(pf.BackgroundError, match="observation.state"):
        pf.openpi_observation({k: v for k, v in batch.items() if k != "observation.state"})


def test_serving_starts_the_server_with_serve_configs_options(tmp_path, monkeypatch):
    from tutorial_utils import params
    from tutorial_utils.serve.config import ServeConfig

    seen = []

    class Dead:
        def poll(self):
            return 1

    def fake_start(args, log):
        seen.append(args)
        return Dead()

    monkeypatch.setattr(pf, "start_cli", fake_start)
    with pytest.raises(pf.BackgroundError, match="server.log"):
        with pf.serving(tmp_path / "bundle", "mlp", tmp_path / "server.log", port=8123, timeout=5):
            pass
    (args,) = seen
    assert args[0] == "serve"
    got = params.parse_cli(ServeConfig, args[1:], "serve", "test")
    assert got == ServeConfig(policy="mlp", checkpoint=str(tmp_path / "bundle"), port=8123)


def _bench_row(name, threads, phases, warmup_s=0.5, kinds=None):
    total = sum(phases.values())
    return {
        "row": name,
        "threads": threads,
        "ms_per_step": total,
        "phases_ms": phases,
        "op_kinds_ms": kinds or {"other": 10.0, "matrix products": 6.0, "convolution": 4.0},
        "warmup_s": warmup_s,
    }


def _breakdown():
    base = {"augment": 2.0, "forward": 40.0, "backward": 40.0, "grad norm": 3.0, "optimiser": 10.0, "ema": 5.0}
    rows = [
        _bench_row("default (torch threads)", 2, base),
        _bench_row("1 thread", 1, {k: 2 * v for k, v in base.items()}),
        _bench_row("compiled", 2, {**base, "forward": 20.0, "backward": 30.0}, warmup_s=70.0),
    ]
    for r in rows:
        r["vs_reference"] = rows[0]["ms_per_step"] / r["ms_per_step"]
    return {"batch_size": 32, "rows": rows}


def test_speed_findings_read_the_shares_and_each_variant_against_the_default():
    bd = _breakdown()
    loop = {
        "rows": [
            {
                "row": "memory (reference)",
                "samples_per_s": 200.0,
                "threads": 1,
                "data_wait_share": 0.1,
                "vs_reference": 1.0,
            },
            {
                "row": "lerobot, 1 worker",
                "samples_per_s": 220.0,
                "threads": 1,
                "data_wait_share": 0.03,
                "vs_reference": 1.1,
            },
            {"row": "lerobot, 1 worker, 1 thread", "samples_per_s": 220.0, "threads": 1, "data_wait_share": 0.03},
            {"row": "lerobot, 1 worker, 2 threads", "samples_per_s": 231.0, "threads": 2, "data_wait_share": 0.03},
        ]
    }
    lines = pf.speed_findings(bd, loop)
    assert lines[0] == (
        "default step (2 torch threads): 100 ms; forward and backward 80% of it, augmentation, gradient norm, "
        "optimiser and EMA the other 20%"
    )
    assert "matrix products 30%, convolution 20%" in lines[1] and "everything else" in lines[1] and "50%" in lines[1]
    assert lines[2] == "1 thread: 200 ms per step, 0.50x the default's speed"
    assert lines[3] == "compiled: 70 ms per step, 1.43x the default's speed after 70 s of first steps (compiling)"
    assert "1 worker (torch threads 1): 220 samples/s, waiting for data 3%" in lines[4]
    assert lines[5] == "beside one loader worker: 1 torch thread 220 samples/s, 2 threads 231 (1.05x)"
    table = pf.breakdown_table(bd)
    assert list(table.index) == ["default (torch threads)", "1 thread", "compiled"]
    assert table.loc["compiled", "forward ms"] == 20.0 and table.loc["1 thread", "speed vs default"] == 0.5
    assert len(pf.breakdown_figure(bd).get_axes()[0].patches) == 3 * 6


def test_compile_findings_compare_the_steady_speed_and_project_the_saving_with_the_compile_paid():
    def run(ms_per_step, first_s):
        # 100 steps of warm-up in one row, then 4 rows of 100 steps at the steady rate (batch 10)
        rows = [{"step": 100, "loss": 1.0, "samples_per_s": 100 * 10 / first_s, "data_wait_share": 0.0}]
        rows += [
            {"step": s, "loss": 1.0, "samples_per_s": 10 / (ms_per_step / 1000), "data_wait_share": 0.0}
            for s in (200, 300, 400, 500)
        ]
        summary = {
            "steps_done": 500,
            "batch_size": 10,
            "wall_s": first_s + 0.4 * ms_per_step,
            "best": {"val_action_mae": 0.05},
        }
        return summary, rows

    lines = pf.compile_findings({"eager": run(100.0, 10.0), "compiled": run(80.0, 70.0)}, 100, project_steps=10100)
    assert "1000 samples/s after step 100" not in lines[0] and "100 samples/s after step 100" in lines[0]
    assert "125 samples/s" in lines[1] and "(the first 100 steps: 70 s)" in lines[1]
    assert lines[2] == "compiled: 1.25x the eager speed after the first steps"
    # 10000 steps x 20 ms = 200 s saved, minus 60 s more of compile: 140 s = 2.3 min
    assert (
        lines[3] == "over 10100 steps at these rates the compiled run would save about 2.3 min (its compile included)"
    )
