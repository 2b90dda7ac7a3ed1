import os

import pytest

from tutorial_utils.report import doctor
from tutorial_utils.report.doctor import Accelerator
from tutorial_utils.sim import gl


def _gpu(gb):
    return Accelerator("cuda", 0, "GPU", gb, 1.0, 3.0, 40.0, "test")


@pytest.mark.parametrize(
    "accs,level,needle",
    [
        ([_gpu(47.7)], "ok", "enough"),  # an L40 reports a little under 48 GB
        ([_gpu(80)], "ok", "enough"),
        ([_gpu(40)], "tight", "below the recommended 48 GB"),
        ([_gpu(24)], "small", "likely to run out of memory"),
        ([Accelerator("cpu", 0, "cpu")], "none", "mini path runs on this CPU"),
        ([Accelerator("mps", 0, "mps")], "none", "Apple MPS"),
    ],
)
def test_vram_verdict(accs, level, needle):
    got, msg = doctor.vram_verdict(accs)
    assert got == level and needle in msg


def test_accelerators_fall_back_to_the_cpu(monkeypatch):
    """With no GPU found by NVML or nvidia-smi (and torch not asked), the one accelerator is the CPU."""
    monkeypatch.setattr(doctor, "_nvml", lambda: [])
    monkeypatch.setattr(doctor, "_nvidia_smi", lambda: [])
    accs = doctor.accelerators(use_torch=False)
    assert [a.kind for a in accs] == ["cpu"]
    assert doctor.vram_verdict(accs)[0] == "none"


def test_disk_plan_warns_before_no_space_left(tmp_path, monkeypatch):
    monkeypatch.setitem(doctor.DISK_NEEDS_GB, "mini", {"models": 0.0, "data": 1e6, "runs": 1e6})
    roles = doctor.disk_plan("mini", {"models": tmp_path / "m", "data": tmp_path / "d", "runs": tmp_path / "r"})
    bad = [r for r in roles if not r.ok]
    assert {r.role for r in bad} >= {"data", "runs"}
    data = next(r for r in roles if r.role == "data")
    assert "No space left on device" in data.warning and "TUTORIAL_DATA_DIR" in data.warning
    assert set(data.shared_with) == {"models", "runs"}  # same mount: the needs add up


def test_disk_plan_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        doctor.disk_plan("tpu")


def test_proxy_credentials_are_masked(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://me:s3cret@proxy:7890")
    assert doctor.hub_settings()["HTTPS_PROXY"] == "http://me:***@proxy:7890"


def test_gl_verdict_names_the_debian_packages():
    pick, msg = gl.gl_verdict(
        {"egl": {"ok": False, "detail": "x", "package": ""}, "osmesa": {"ok": False, "detail": "y", "package": ""}}
    )
    assert pick is None and "libosmesa6" in msg and "libegl1" in msg


def test_gl_probe_rejects_unknown_backends():
    with pytest.raises(ValueError, match="unknown GL backend"):
        gl.probe_gl("vulkan")


@pytest.mark.libero
def test_an_offscreen_gl_backend_works_here():
    results = gl.gl_backends()
    pick, msg = gl.gl_verdict(results)
    assert pick is not None, msg


def test_gl_verdict_tells_a_missing_python_module_from_a_missing_system_library(tmp_path, monkeypatch):
    """A `mujoco` that is not importable is a pip problem (this interpreter), not Debian GL packages."""
    # a real probe in a child whose `mujoco` import fails as on a machine without the package
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass _Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mujoco':\n            raise ModuleNotFoundError(\"No module named 'mujoco'\", name='mujoco')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    results = gl.gl_backends()
    assert all(not r["ok"] and r["kind"] == "module" for r in results.values()), results
    pick, msg = gl.gl_verdict(results)
    assert pick is None and "pip install mujoco" in msg and "apt-get" not in msg
    # a system library that is missing keeps the Debian hint
    lib = {"ok": False, "detail": "OSError: libEGL.so.1: cannot open shared object file", "package": ""}
    pick, msg = gl.gl_verdict({"egl": lib, "osmesa": dict(lib, detail="AttributeError: 'NoneType' ...")})
    assert pick is None and "apt-get install" in msg and "pip install" not in msg
    assert gl.gl_failure_kind("ModuleNotFoundError: No module named 'mujoco._render'") == ("module", "mujoco")
