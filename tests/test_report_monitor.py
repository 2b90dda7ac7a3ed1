"""The live training monitor: system metrics in the rows, sample predictions, the tailing panel,
its buttons, and the static panel for the book."""

from __future__ import annotations

import json
import os
import shutil
import time

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers import TINY_MINI, wait_for  # noqa: E402
from tutorial_utils import jobs  # noqa: E402
from tutorial_utils.report import monitor as M  # noqa: E402
from tutorial_utils.train.sysmetrics import PREFIX, SystemSampler, system_fields  # noqa: E402

SYS_FIELDS = {
    "cpu_process_pct",
    "cpu_system_pct",
    "cpu_count",
    "ram_process_bytes",
    "ram_used_bytes",
    "ram_total_bytes",
    "disk_free_bytes",
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 3-step tiny training run (log every step, validation at steps 2 and 3)."""
    import torch

    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("monitor") / "run"
    cfg = TrainConfig.from_overrides(
        {**TINY_MINI, "output_dir": str(out), "steps": 3, "batch_size": 2, "log_freq": 1, "eval_freq": 2}
    )
    train(cfg, source=synthetic_source(n_episodes=4, length=12, image_size=32))
    return out


@pytest.fixture
def no_drawing(monkeypatch):
    """The live-panel tests check polling and buttons: the figure (seconds on a busy 2-core
    machine; the static-panel tests draw it for real) is replaced by a stand-in."""
    drawn = []

    def stand_in(self, view):
        drawn.append(len(view.rows))
        return b"\x89PNG stand-in"

    monkeypatch.setattr(M.RunMonitor, "_png", stand_in)  # in this process or a helper: not drawn
    return drawn


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _copy(run, dest):
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("checkpoints"))
    return dest


def _as_running(run):
    """Mark a copied run as running in this process (a fresh heartbeat with our pid)."""
    jobs.update_status(
        run, training={"state": "running", "step": 1, "total": 10, "eta_s": 90.0, **jobs.heartbeat_fields()}
    )


# --- system metrics ------------------------------------------------------------------------------


def test_sampler_returns_sane_fields(tmp_path):
    s = SystemSampler(tmp_path)
    sum(i * i for i in range(200_000))  # some CPU time between the two samples
    row = s.sample()
    assert all(k.startswith(PREFIX) for k in row)
    f = system_fields(row)
    assert SYS_FIELDS <= set(f), set(f)
    assert f["cpu_count"] >= 1 and 0 <= f["cpu_system_pct"] <= 100
    assert 0 <= f["cpu_process_pct"] <= 100 * f["cpu_count"] + 1
    assert 1e6 < f["ram_process_bytes"] <= f["ram_total_bytes"]
    assert 0 < f["ram_used_bytes"] <= f["ram_total_bytes"]
    assert f["disk_free_bytes"] == pytest.approx(shutil.disk_usage(tmp_path).free, rel=0.05)
    assert not any(k.startswith("gpu") for k in f)  # no CUDA in use in this process
    json.dumps(row)  # plain JSON values


def test_sampler_counts_a_busy_child_and_never_raises(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s = SystemSampler(tmp_path / "gone" / "deeper")  # a run dir whose parent is missing: no disk field
        s.sample()  # the child's interval starts here
        time.sleep(0.6)
        f = system_fields(s.sample())
        assert f["cpu_process_pct"] > 20, f  # the child's busy loop counts for this process
        assert "disk_free_bytes" not in f and "ram_process_bytes" in f
    finally:
        child.kill()
        child.wait()


def test_training_rows_carry_system_metrics_and_validation_writes_samples(finished_run):
    rows = _rows(finished_run)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for r in train_rows:
        assert SYS_FIELDS <= set(system_fields(r)), r
    val = [r for r in rows if "val_action_mae" in r]
    assert [r["step"] for r in val] == [2, 3]
    assert [r["sample"] for r in val] == ["samples/step_000002.json", "samples/step_000003.json"]
    sample = json.loads((finished_run / "samples/step_000003.json").read_text())
    assert sample["step"] == 3 and isinstance(sample["episode"], int) and sample["task"]
    assert len(sample["pred"]) == len(sample["true"]) == len(sample["is_pad"]) == 8  # the chunk
    assert all(len(a) == 7 for a in sample["pred"] + sample["true"])
    assert sample["pred"] != sample["true"]
    assert M.latest_sample(finished_run)["step"] == 3


def test_a_resume_from_an_earlier_checkpoint_drops_the_later_samples(tmp_path):
    import torch

    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train

    torch.set_num_threads(1)
    src = synthetic_source(n_episodes=3, length=10, image_size=32)
    kw = {**TINY_MINI, "output_dir": str(tmp_path / "r"), "steps": 4, "batch_size": 1, "save_freq": 2}
    train(TrainConfig.from_overrides({**kw, "eval_freq": 1}), source=src)
    names = lambda: sorted(p.name for p in (tmp_path / "r/samples").iterdir())  # noqa: E731
    assert names() == [f"step_00000{i}.json" for i in (1, 2, 3, 4)]
    train(TrainConfig.from_overrides({**kw, "eval_freq": 0, "resume_from": "step_000002"}), source=src)
    assert names() == ["step_000001.json", "step_000002.json", "step_000004.json"]  # 3 is of the old timeline


def test_system_metrics_can_be_switched_off(tmp_path):
    import torch

    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train

    torch.set_num_threads(1)
    cfg = TrainConfig.from_overrides(
        {**TINY_MINI, "output_dir": str(tmp_path / "r"), "steps": 2, "batch_size": 1, "system_metrics": False}
    )
    train(cfg, source=synthetic_source(n_episodes=3, length=10, image_size=32))
    rows = [r for r in _rows(tmp_path / "r") if "loss" in r]
    assert rows and not any(system_fields(r) for r in rows)


# --- reading the files ----------------------------------------------------------------------------


def test_metrics_tail_reads_new_rows_skips_garbage_and_waits_for_a_partial_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "loss": 1.0}\nnot json\n[1, 2]\n{"step": "x"}\n{"step": 2, "lo')
    t = M.MetricsTail(p)
    assert [r["step"] for r in t.poll()] == [1] and t.skipped == 3 and t.partial
    with open(p, "a") as fh:
        fh.write('ss": 0.5}\n{"step": 3, "loss": 0.4}\n')
    assert [r["step"] for r in t.poll()] == [2, 3] and not t.partial
    assert t.poll() == [] and [r["step"] for r in t.rows] == [1, 2, 3]
    # a resume rewrites the file (new inode, fewer rows): read again from the start
    tmp = tmp_path / "new"
    tmp.write_text('{"step": 1, "loss": 1.0}\n')
    os.replace(tmp, p)
    assert [r["step"] for r in t.poll()] == [1] and t.reset and t.skipped == 0


def test_tail_lines_and_levels(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert M.tail_lines(log, 3) == ["line 97", "line 98", "line 99"]
    assert M.tail_lines(log, 3, max_bytes=20) == ["line 97", "line 98", "line 99"]
    assert M.tail_lines(tmp_path / "absent.log") == []
    assert M.line_level("warning: control.json is not JSON") == "warning"
    assert M.line_level("Traceback (most recent call last):") == "error"
    assert M.line_level("the loss became non-finite at step 3") == "error"
    assert M.line_level("[Exp: r] Step 3, Loss: {'total_loss': 0.2}") is None
    html = M.log_html(["ok", "RuntimeError: boom", "warning: slow <disk>"])
    assert html.count("font-weight:bold") == 1 and "&lt;disk&gt;" in html and M.ORANGE in html
    from tutorial_utils import paths

    saved = M.log_html([f"checkpoint saved at {paths.REPO}/runs/r1/checkpoints/step_7"])
    assert "checkpoint saved at runs/r1/checkpoints/step_7" in saved and str(paths.REPO) not in saved


# --- the live panel -------------------------------------------------------------------------------


def test_monitor_builds_on_a_finished_run_and_does_not_poll(finished_run, no_drawing):
    mon = M.monitor(finished_run, interval=0.05)
    try:
        assert mon.view.state == "finished" and not mon.running
        assert [r["step"] for r in mon.view.train_rows] == [1, 2, 3]
        assert mon.bar.value == mon.bar.max == 3 and mon.bar.bar_style == "success"
        assert "step 3/3" in mon.header.value and "best val action error" in mon.header.value
        assert "CPU (process)" in mon.system.value and "Step 3, Loss" in mon.log.value
        assert mon.image.value[:4] == b"\x89PNG" and no_drawing == [5]  # drawn once: 3 loss + 2 validation rows
        assert mon.stop_button.disabled and mon.pause_button.disabled
        bundle = mon._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        # the static book shows the text/html copy: the panel's content, no button, the way to the live one
        frozen = bundle["text/html"]
        assert "step 3/3" in frozen and "data:image/png;base64," in frozen and "make lab" in frozen
        assert "<button" not in frozen and "Stop" in frozen  # named only in the sentence about JupyterLab
    finally:
        mon.close()
    assert mon.closed


def test_monitor_skips_a_truncated_last_line(finished_run, no_drawing, tmp_path):
    run = _copy(finished_run, tmp_path / "cut")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": 0.')  # a write cut short by a kill
    mon = M.monitor(run)
    try:
        assert [r["step"] for r in mon.view.train_rows] == [1, 2, 3]
        assert "1 line(s) of metrics.jsonl skipped" in mon.header.value
    finally:
        mon.close()


def test_poll_thread_picks_up_a_new_row_and_stops_when_the_run_finishes(finished_run, no_drawing, tmp_path):
    run = _copy(finished_run, tmp_path / "live")
    _as_running(run)
    mon = M.monitor(run, interval=0.05, figure_every=0.0)
    try:
        assert mon.running and mon.view.state == "running" and not mon.stop_button.disabled
        assert "ETA 0:01:30" in mon.header.value
        row = {**_rows(run)[0], "step": 7, "loss": 0.125, "loss_mean": 0.125}
        with open(run / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        assert wait_for(lambda: mon.view.train_rows[-1]["step"] == 7, timeout=10)
        assert wait_for(lambda: "loss 0.1250" in mon.header.value, timeout=10)
        assert wait_for(lambda: no_drawing[-1] == 6, timeout=10)  # the figure is redrawn with the new row
        n = len(no_drawing)
        time.sleep(0.3)
        assert len(no_drawing) == n  # no new row, no redraw
        assert mon.running  # still polling while the run runs
        jobs.update_status(run, training={"state": "finished", "step": 10})
        assert wait_for(lambda: not mon.running, timeout=10)
        assert mon.view.state == "finished"
    finally:
        mon.close()


def test_closing_the_panel_ends_the_thread(finished_run, no_drawing, tmp_path):
    run = _copy(finished_run, tmp_path / "closed")
    _as_running(run)
    mon = M.monitor(run, interval=0.05)
    assert mon.running
    mon.panel.close()  # what the notebook does when the output is cleared
    assert wait_for(lambda: not mon.running, timeout=10)


def test_buttons_write_the_control_file(finished_run, no_drawing, tmp_path):
    run = _copy(finished_run, tmp_path / "buttons")
    _as_running(run)
    mon = M.monitor(run, start=False)
    try:
        mon.pause_button.click()
        ctl = json.loads((run / "control.json").read_text())
        assert ctl["command"] == "pause" and "pause sent" in mon.message.value
        mon.stop_button.click()
        assert json.loads((run / "control.json").read_text())["command"] == "stop"
        jobs.update_status(run, training={"state": "stopped"})
        mon.stop_button.click()  # a run that is not running: the refusal shows in the panel
        assert (
            "not running" in mon.message.value and json.loads((run / "control.json").read_text())["command"] == "stop"
        )
    finally:
        mon.close()


@pytest.mark.slow
def test_the_figure_is_drawn_by_a_helper_process_when_this_process_trains(finished_run, tmp_path):
    """Drawing holds the interpreter lock for hundreds of ms: when the panel's process is the
    training one (the heartbeat's pid is ours), a helper process draws and this thread waits."""
    run = _copy(finished_run, tmp_path / "self")
    _as_running(run)
    mon = M.monitor(run, start=False)
    try:
        assert mon.helper_error is None and mon._helper is not None and mon.draws == mon.helper_draws == 1
        assert mon.image.value[:4] == b"\x89PNG"
        assert mon._helper.submit(os.getpid).result(timeout=60) != os.getpid()
    finally:
        mon.close()
    assert mon._helper is None
    other = M.monitor(finished_run, start=False)  # trained by another process: drawn here
    try:
        assert other._helper is None and other.image.value[:4] == b"\x89PNG"
    finally:
        other.close()


def test_a_helper_that_fails_falls_back_to_drawing_here(finished_run, monkeypatch):
    monkeypatch.setattr(M, "HELPER_TIMEOUT_S", 1e-6)  # no helper answers that fast
    mon = M.monitor(finished_run, start=False, draw_in_helper=True)
    try:
        assert "Timeout" in mon.helper_error and mon._helper is None
        assert mon.image.value[:4] == b"\x89PNG" and mon.draws == 1
    finally:
        mon.close()


def test_a_missing_run_dir_is_a_teaching_error(tmp_path):
    with pytest.raises(M.MonitorError, match="runs list"):
        M.monitor(tmp_path / "nope")


# --- the static panel -----------------------------------------------------------------------------


def test_static_panel_draws_every_panel_from_the_files(finished_run, tmp_path):
    panel = M.static_panel(finished_run)
    axes = panel.figure.axes
    titles = [a.get_title() for a in axes]
    assert "loss and validation" in titles and "learning-rate schedule" in titles
    assert "sample prediction at step 3, episode" in " ".join(titles)
    loss_ax = axes[titles.index("loss and validation")]
    assert list(loss_ax.lines[0].get_xdata()) == [1, 2, 3]
    assert "finished" in panel.html and "RAM (machine)" in panel.html and "<pre" in panel.html
    assert "data:image/png;base64," in panel._repr_html_()
    png, page = panel.save(tmp_path / "out")
    assert png.read_bytes()[:4] == b"\x89PNG" and "step 3/3" in page.read_text()


def test_static_panel_of_a_run_without_rows(tmp_path):
    (tmp_path / "empty").mkdir()
    panel = M.static_panel(tmp_path / "empty")
    assert "no system metrics" in panel.html and "(no log lines yet)" in panel.html
    assert len(panel.figure.axes) == 6


def test_the_monitor_shows_the_run_diagnosis_and_records_it_in_status(finished_run, no_drawing, tmp_path):
    import json

    from helpers import decaying, make_run

    run = _copy(finished_run, tmp_path / "run")
    mon = M.monitor(run, interval=0.05)
    try:
        assert "health:" in mon.health.value
        health = json.loads((run / "status.json").read_text())["health"]
        assert health["ok"] == mon.diagnosis.ok and "checked" in health
    finally:
        mon.close()
    bad = make_run(tmp_path, "nan", losses=[*decaying(10), float("nan"), *decaying(5)])
    panel = M.static_panel(bad)
    assert "non_finite_loss" in panel.html and "Fix:" in panel.html
