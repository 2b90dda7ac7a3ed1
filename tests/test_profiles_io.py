import json

import pytest

from tutorial_utils import io, profiles


def test_pick_follows_profile(monkeypatch):
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    assert profiles.current() == "ci"
    assert profiles.pick(ci=1, cpu=5, gpu=50) == 1
    monkeypatch.setenv("TUTORIAL_PROFILE", "cpu")
    assert profiles.pick(ci=1, cpu=5, gpu=50) == 5
    monkeypatch.setenv("TUTORIAL_PROFILE", "gpu")
    assert profiles.pick(ci=1, cpu=5, gpu=50) == 50
    assert profiles.pick(ci=1, cpu=5) == 5  # gpu falls back to cpu
    assert profiles.pick(ci=1) == 1
    assert profiles.pick(ci=20, cpu=None) is None  # None is a value (no override), not "fall back to ci"
    monkeypatch.setenv("TUTORIAL_PROFILE", "cpu")
    assert profiles.pick(ci=20, cpu=None, gpu=3) is None and profiles.pick(ci=20, gpu=None) == 20


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TUTORIAL_PROFILE", "laptop")
    with pytest.raises(ValueError, match="TUTORIAL_PROFILE='laptop'.*ci, cpu, gpu"):
        profiles.current()


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    f = tmp_path / "a.json"
    io.atomic_write_json(f, {"v": 1})
    with pytest.raises(RuntimeError):
        with io.atomic_path(f) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert json.loads(f.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_atomic_dir_replaces_only_when_complete(tmp_path):
    d = tmp_path / "ckpt"
    with io.atomic_dir(d) as tmp:
        (tmp / "w").write_text("1")
    with pytest.raises(KeyError):
        with io.atomic_dir(d) as tmp:
            (tmp / "w").write_text("2")
            raise KeyError("killed")
    assert (d / "w").read_text() == "1"
    with io.atomic_dir(d) as tmp:
        (tmp / "w").write_text("3")
    assert (d / "w").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_read_jsonl_tolerates_a_half_written_last_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert [r["step"] for r in io.read_jsonl(f)] == [1, 2]
    f.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        io.read_jsonl(f)


def test_import_is_light():
    import subprocess
    import sys

    code = (
        "import sys, tutorial_utils, tutorial_utils.profiles, tutorial_utils.paths, tutorial_utils.logs; "
        "heavy = [m for m in ('torch', 'pyarrow', 'libero', 'mujoco', 'matplotlib', 'pandas') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tail_text_is_the_one_log_tail_for_error_messages(tmp_path):
    log = tmp_path / "server.log"
    assert io.tail_text(log) == "(server.log was not written)"
    log.write_text("")
    assert io.tail_text(log) == "(server.log is empty)"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert io.tail_text(log, 2) == "line 98\nline 99"
    assert io.tail_lines(log, 3, max_bytes=20) == ["line 97", "line 98", "line 99"]
