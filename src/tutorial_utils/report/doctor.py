"""The doctor: check the machine before anything runs: accelerators, VRAM, disk, tokens, proxy, GL.

``python -m tutorial_utils doctor`` prints the report; chapter 1 shows the same pieces.
Nothing here prints a secret: tokens are reported as ``set`` or ``missing``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils import paths
from tutorial_utils.secrets import presence, redact
from tutorial_utils.sim.gl import gl_backends, gl_verdict

GB = 1024**3

#: VRAM advice from the seed chapter (an NVIDIA L40, 48 GB, ran evaluation and the smoke test).
VRAM_RECOMMENDED_GB = 48
VRAM_LIKELY_OOM_GB = 24

#: What each backend needs on disk, per role (GB). The dit4dit figures: the official
#: checkpoint plus the Cosmos-Predict2.5-2B backbone (models), the libero_spatial dataset
#: (0.36 GB) plus the other suites (data), and one full final_model (~20 GB) per run (runs).
DISK_NEEDS_GB = {
    "dit4dit": {"models": 60.0, "data": 2.0, "runs": 25.0},
    "mini": {"models": 0.0, "data": 1.0, "runs": 2.0},
}

HUB_VARS = (
    "HF_HOME",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_HUB_DISABLE_XET",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DOWNLOAD_TIMEOUT",
)
PROXY_VARS = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "all_proxy",
    "no_proxy",
)


@dataclass
class Accelerator:
    kind: str  # cuda | mps | cpu
    index: int
    name: str
    memory_total_gb: float | None = None
    memory_used_gb: float | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    source: str = ""


@dataclass
class DiskRole:
    role: str
    path: str
    mount: str
    free_gb: float
    total_gb: float
    need_gb: float
    shared_with: list[str] = field(default_factory=list)
    ok: bool = True
    warning: str = ""


# --- accelerators -------------------------------------------------------------------------------


def _nvidia_smi() -> list[Accelerator]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    q = "index,name,memory.total,memory.used,utilization.gpu,temperature.gpu"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue

        def num(s: str) -> float | None:
            try:
                return float(s)
            except ValueError:
                return None

        total, used = num(parts[2]), num(parts[3])
        gpus.append(
            Accelerator(
                "cuda",
                int(parts[0]),
                parts[1],
                total and total / 1024,
                used and used / 1024,
                num(parts[4]),
                num(parts[5]),
                "nvidia-smi",
            )
        )
    return gpus


def _nvml() -> list[Accelerator]:
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            temp = pynvml.nvmlDeviceGetTemperature(h, 0)
            gpus.append(
                Accelerator(
                    "cuda",
                    i,
                    name.decode() if isinstance(name, bytes) else name,
                    mem.total / GB,
                    mem.used / GB,
                    float(util),
                    float(temp),
                    "nvml",
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return gpus


def _torch_devices() -> list[Accelerator]:
    try:
        import torch
    except ImportError:
        return []
    found = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            found.append(Accelerator("cuda", i, p.name, p.total_memory / GB, None, None, None, "torch"))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append(Accelerator("mps", 0, "Apple Metal (MPS)", None, None, None, None, "torch"))
    return found


def _cpu() -> Accelerator:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        mem = int(m.group(1)) / 1024**2 if m else None
    except OSError:
        pass
    return Accelerator("cpu", 0, f"{name} ({os.cpu_count()} cores)", mem, None, None, None, "cpu")


def accelerators(use_torch: bool = True) -> list[Accelerator]:
    """CUDA GPUs (NVML, else nvidia-smi, else torch), else MPS, else the CPU."""
    gpus = _nvml() or _nvidia_smi()
    if use_torch:
        extra = _torch_devices()
        if not gpus:
            gpus = [a for a in extra if a.kind == "cuda"]
        gpus += [a for a in extra if a.kind == "mps"]
    return gpus or [_cpu()]


def vram_verdict(accs: list[Accelerator]) -> tuple[str, str]:
    """(level, message): level is ``ok``, ``tight``, ``small`` or ``none``."""
    cuda = [a for a in accs if a.kind == "cuda" and a.memory_total_gb]
    if not cuda:
        if any(a.kind == "mps" for a in accs):
            return "none", "Apple MPS: the mini path runs here; the dit4dit path needs an NVIDIA GPU with >= 48 GB."
        return "none", "No GPU: the mini path runs on this CPU; the dit4dit path needs an NVIDIA GPU with >= 48 GB."
    best = max(a.memory_total_gb for a in cuda)
    if best >= VRAM_RECOMMENDED_GB - 1:  # cards sold as 48 GB report a little less
        return (
            "ok",
            f"{best:.0f} GB of VRAM: enough for DiT4DiT evaluation and the 2-step training smoke test (48 GB recommended).",
        )
    if best > VRAM_LIKELY_OOM_GB + 1:
        return (
            "tight",
            f"{best:.0f} GB of VRAM: below the recommended 48 GB; evaluation may fit, the smoke test may run out of memory.",
        )
    return (
        "small",
        f"{best:.0f} GB of VRAM: at 24 GB (an RTX 4090) DiT4DiT is likely to run out of memory; use the mini path or a 48 GB card.",
    )


# --- disk ---------------------------------------------------------------------------------------


def _mount_of(path: Path) -> Path:
    p = path.resolve()
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def default_locations() -> dict[str, Path]:
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return {"models": hf_home, "data": paths.DATA, "runs": paths.RUNS}


def disk_plan(backend: str = "mini", locations: dict[str, Path] | None = None) -> list[DiskRole]:
    """Free space where models, data and runs go, against what the backend needs.

    Roles on the same mount add up: a warning names them before ``No space left on device``
    can happen in the middle of a download or a checkpoint save.
    """
    if backend not in DISK_NEEDS_GB:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(DISK_NEEDS_GB)}")
    locations = locations or default_locations()
    needs = DISK_NEEDS_GB[backend]
    roles: list[DiskRole] = []
    by_mount: dict[str, list[str]] = {}
    for role, path in locations.items():
        mount = _mount_of(Path(path))
        existing = Path(path)
        while not existing.exists():
            existing = existing.parent
        usage = shutil.disk_usage(existing)
        roles.append(
            DiskRole(role, os.fspath(path), os.fspath(mount), usage.free / GB, usage.total / GB, needs.get(role, 0.0))
        )
        by_mount.setdefault(os.fspath(mount), []).append(role)
    for r in roles:
        same = by_mount[r.mount]
        r.shared_with = [x for x in same if x != r.role]
        need_here = sum(x.need_gb for x in roles if x.mount == r.mount)
        if r.free_gb < need_here:
            r.ok = False
            who = " + ".join(same)
            r.warning = (
                f"only {r.free_gb:.1f} GB free on {r.mount} but {who} need about {need_here:.0f} GB: expect "
                f"'No space left on device' during a download or a checkpoint save. Move {r.role} to a bigger "
                f"disk (HF_HOME for models, TUTORIAL_DATA_DIR for data, TUTORIAL_RUNS_DIR for runs)."
            )
    return roles


# --- tokens, hub settings, proxies ----------------------------------------------------------------


def _mask_url_credentials(value: str) -> str:
    """Passwords (``@`` and ``/`` in them included) and token user names masked, secret values
    and token shapes anywhere in the value too; a plain user name stays, to tell proxies apart."""
    return redact(value, keep_url_user=True)


def hub_settings() -> dict[str, str]:
    """``HF_*`` settings and proxies, credentials masked (``HF_ENDPOINT`` can hold them too);
    unset ones as ``unset``."""
    out = {k: _mask_url_credentials(os.environ[k]) if k in os.environ else "unset" for k in HUB_VARS}
    for k in PROXY_VARS:
        if k in os.environ:
            out[k] = _mask_url_credentials(os.environ[k])
    return out


def hub_advice(settings: dict[str, str]) -> list[str]:
    tips = []
    if settings.get("HF_HUB_DISABLE_XET", "unset") in ("unset", "0"):
        tips.append("Downloads that stall on one shard: export HF_HUB_DISABLE_XET=1")
    if settings.get("HF_HUB_ENABLE_HF_TRANSFER", "unset") not in ("0",):
        tips.append("Without the hf_transfer package: export HF_HUB_ENABLE_HF_TRANSFER=0")
    if settings.get("HF_HUB_DOWNLOAD_TIMEOUT", "unset") == "unset":
        tips.append("Slow proxies: export HF_HUB_DOWNLOAD_TIMEOUT=600")
    return tips


# --- the whole report ---------------------------------------------------------------------------


def report(backend: str = "mini", probe_gl_backends: bool = True) -> dict[str, Any]:
    accs = accelerators()
    level, vram_msg = vram_verdict(accs)
    gl = gl_backends() if probe_gl_backends else {}
    gl_pick, gl_msg = gl_verdict(gl) if gl else (None, "not probed")
    return {
        "backend": backend,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "accelerators": [asdict(a) for a in accs],
        "vram": {"level": level, "message": vram_msg},
        "disk": [asdict(r) for r in disk_plan(backend)],
        "tokens": presence(),
        "hub": hub_settings(),
        "gl": gl,
        "gl_backend": gl_pick,
        "gl_message": gl_msg,
    }


def checks(rep: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(item, ready, message) for what each backend needs."""
    mini = rep["backend"] == "mini"
    hf = rep["tokens"].get("HF_TOKEN") == "set" or rep["tokens"].get("HUGGING_FACE_HUB_TOKEN") == "set"
    disk_bad = [d for d in rep["disk"] if not d["ok"]]
    out = [
        ("accelerator", mini or rep["vram"]["level"] in ("ok", "tight"), rep["vram"]["message"]),
        (
            "disk",
            not disk_bad,
            "; ".join(d["warning"] for d in disk_bad) or "enough free space for models, data and runs",
        ),
        ("offscreen GL", rep["gl_backend"] is not None, rep["gl_message"]),
        (
            "Hugging Face token",
            mini or hf,
            ("set (not needed for the mini path)" if hf else "missing: the mini path does not need it")
            if mini
            else (
                "set"
                if hf
                else "missing: `source ~/.secrets/hf.env` with HF_TOKEN=..., and accept the Cosmos licence on the Hub"
            ),
        ),
    ]
    return out


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"backend: {rep['backend']}   python {rep['python']}   {rep['platform']}", "", "accelerators:"]
    for a in rep["accelerators"]:
        bits = [f"  [{a['kind']}:{a['index']}] {a['name']}"]
        if a["memory_total_gb"]:
            used = f"{a['memory_used_gb']:.1f}/" if a["memory_used_gb"] is not None else ""
            bits.append(f"{used}{a['memory_total_gb']:.1f} GB")
        if a["utilization_pct"] is not None:
            bits.append(f"util {a['utilization_pct']:.0f}%")
        if a["temperature_c"] is not None:
            bits.append(f"{a['temperature_c']:.0f} C")
        lines.append("  ".join(bits))
    lines += ["", f"VRAM: {rep['vram']['message']}", "", "disk plan:"]
    for d in rep["disk"]:
        flag = "ok  " if d["ok"] else "LOW "
        lines.append(
            f"  {flag}{d['role']:<7} {d['path']}  (mount {d['mount']}: {d['free_gb']:.1f} GB free, needs ~{d['need_gb']:.0f} GB)"
        )
        if d["warning"]:
            lines.append(f"       {d['warning']}")
    lines += ["", "tokens: " + ", ".join(f"{k}={v}" for k, v in rep["tokens"].items()), "", "hub and proxy settings:"]
    lines += [f"  {k}={v}" for k, v in rep["hub"].items()]
    lines += ["", "offscreen GL (MuJoCo):"]
    for b, r in rep["gl"].items():
        lines.append(f"  {b:<7} {'works' if r['ok'] else 'fails: ' + r['detail']}  (Debian: {r['package']})")
    lines += [f"  -> {rep['gl_message']}", "", "ready?"]
    for item, ok, msg in checks(rep):
        lines.append(f"  [{'x' if ok else ' '}] {item}: {msg}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils doctor", description="Check this machine for the book's two paths."
    )
    ap.add_argument("--backend", choices=sorted(DISK_NEEDS_GB), default="mini")
    ap.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    ap.add_argument("--no-gl", action="store_true", help="skip the MuJoCo GL probe")
    args = ap.parse_args(argv)
    rep = report(args.backend, probe_gl_backends=not args.no_gl)
    print(format_report(rep))
    if args.json:
        from tutorial_utils.io import atomic_write_json

        atomic_write_json(args.json, rep)
    return 0 if all(ok for _, ok, _ in checks(rep)) else 1


def plot_disk_plan(disk: list[dict[str, Any]]):
    """Bar chart: free space per role's mount against what the role needs."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 2.2 + 0.3 * len(disk)))
    roles = [f"{d['role']}\n({d['mount']})" for d in disk]
    free = [d["free_gb"] for d in disk]
    need = [d["need_gb"] for d in disk]
    y = range(len(disk))
    ax.barh(y, free, color=["#4c9f70" if d["ok"] else "#d1495b" for d in disk], label="free on the mount")
    ax.scatter(need, list(y), marker="|", s=400, color="black", label="needed (estimate)", zorder=3)
    ax.set_yticks(list(y), roles)
    ax.set_xlabel("GB")
    ax.set_title("Disk plan: free space where each role writes")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig
