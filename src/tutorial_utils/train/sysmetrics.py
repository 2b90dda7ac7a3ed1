"""System metrics the training process samples into its ``metrics.jsonl`` rows.

:class:`SystemSampler` is called by :class:`tutorial_utils.train.runlog.RunLog` at each log row
(every ``log_freq`` steps, main process only, when ``system_metrics=true``). One call reads a
few ``/proc`` files through ``psutil`` and, when CUDA is in use, two counters of torch's
caching allocator: tens of microseconds, so sampling never slows training
(``benchmarks/bench_monitor.py`` measures it). The fields, all prefixed ``sys_``:

=============================  ==========================================================
``sys_cpu_process_pct``        CPU of the training process and its DataLoader workers, % of
                               one core (200 = two cores busy), since the previous sample
``sys_cpu_system_pct``         CPU of the whole machine, % of all cores, since the previous
``sys_cpu_count``              logical cores of the machine
``sys_ram_process_bytes``      resident memory of the process and its workers (RSS)
``sys_ram_used_bytes``         memory in use on the machine (total minus available)
``sys_ram_total_bytes``        memory of the machine
``sys_disk_free_bytes``        free space on the disk that holds the run directory
``sys_net_sent_bps``           network bytes sent / received per second, whole machine,
``sys_net_recv_bps``           since the previous sample
``sys_gpu_mem_bytes``          CUDA memory allocated by torch now (current device)
``sys_gpu_mem_max_bytes``      the peak of that since the process started
``sys_gpu_mem_total_bytes``    memory of the GPU
``sys_gpu_util_pct``           GPU utilisation (only when torch can ask NVML for it)
=============================  ==========================================================

A field that cannot be read on this machine is left out; a sampler never raises. torch is
never imported here: the GPU fields appear when the process already uses torch with CUDA.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: the prefix of every system field in a metrics row
PREFIX = "sys_"
#: seconds between two scans of the process table for child processes where /proc cannot list them
CHILD_SCAN_S = 30.0


class SystemSampler:
    """Samples CPU, RAM, disk, network and GPU use for one training process (see the module doc).

    ``run_dir``: the disk whose free space is reported. ``gpu``: ``None`` (auto: when torch is
    loaded and CUDA is initialised), ``True`` or ``False``."""

    def __init__(self, run_dir: str | os.PathLike = ".", gpu: bool | None = None):
        self.run_dir = Path(run_dir)
        self._gpu = gpu
        self._gpu_total: int | None = None
        self._gpu_util_ok = True
        self._children: dict[int, Any] = {}
        self._scan_t, self._scan_pids = 0.0, None
        self._last_t = time.monotonic()
        self._net = None
        try:
            import psutil

            self._ps = psutil
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)  # the first call only starts the interval
            psutil.cpu_percent(None)
            self._cpus = psutil.cpu_count() or 0
            self._net = self._net_counters()
        except Exception:  # psutil missing or /proc unreadable: only the GPU and disk fields
            self._ps = self._proc = None

    # --- parts -----------------------------------------------------------------------------------

    def _net_counters(self) -> tuple[int, int] | None:
        try:
            c = self._ps.net_io_counters()
        except Exception:
            return None
        return (c.bytes_sent, c.bytes_recv) if c is not None else None

    def _child_pids(self) -> list[int]:
        """The children that the calling thread (the training loop's) started, i.e. the
        DataLoader workers: Linux lists them in ``/proc/<pid>/task/<tid>/children`` (one small
        read); elsewhere psutil scans every process (milliseconds), so that scan runs at most
        every :data:`CHILD_SCAN_S` seconds."""
        try:
            text = Path(f"/proc/{self._proc.pid}/task/{threading.get_native_id()}/children").read_text()
        except OSError:
            text = None
        if text is not None:
            return [int(x) for x in text.split()]
        now = time.monotonic()
        if self._scan_pids is None or now - self._scan_t > CHILD_SCAN_S:
            self._scan_t, self._scan_pids = now, [k.pid for k in self._proc.children(recursive=True)]
        return self._scan_pids

    def _process(self, out: dict[str, Any]) -> None:
        """CPU % and RSS of the process and its children (DataLoader workers), children cached so
        their CPU % measures the interval since the previous sample."""
        cpu = self._proc.cpu_percent(None)
        rss = self._proc.memory_info().rss
        alive: dict[int, Any] = {}
        for pid in self._child_pids():
            kid = self._children.get(pid)
            try:
                if kid is None:
                    kid = self._ps.Process(pid)
                    kid.cpu_percent(None)  # starts its interval; counted from the next sample on
                else:
                    cpu += kid.cpu_percent(None)
                rss += kid.memory_info().rss
                alive[kid.pid] = kid
            except Exception:  # a worker that exited between the listing and the read
                continue
        self._children = alive
        out[PREFIX + "cpu_process_pct"] = round(cpu, 1)
        out[PREFIX + "ram_process_bytes"] = int(rss)

    def _system(self, out: dict[str, Any], dt: float) -> None:
        ps = self._ps
        out[PREFIX + "cpu_system_pct"] = round(ps.cpu_percent(None), 1)
        out[PREFIX + "cpu_count"] = self._cpus
        vm = ps.virtual_memory()
        out[PREFIX + "ram_used_bytes"] = int(vm.total - vm.available)
        out[PREFIX + "ram_total_bytes"] = int(vm.total)
        net = self._net_counters()
        if net is not None and self._net is not None and dt > 0:
            out[PREFIX + "net_sent_bps"] = round(max(0, net[0] - self._net[0]) / dt, 1)
            out[PREFIX + "net_recv_bps"] = round(max(0, net[1] - self._net[1]) / dt, 1)
        self._net = net

    def _disk(self, out: dict[str, Any]) -> None:
        import shutil

        path = self.run_dir if self.run_dir.exists() else self.run_dir.parent
        out[PREFIX + "disk_free_bytes"] = int(shutil.disk_usage(path).free)

    def _cuda(self, out: dict[str, Any]) -> None:
        torch = sys.modules.get("torch")  # never import torch here
        if self._gpu is False or torch is None:
            return
        cuda = torch.cuda
        if self._gpu is None and not cuda.is_initialized():
            return
        if not cuda.is_available():
            return
        dev = cuda.current_device()
        out[PREFIX + "gpu_mem_bytes"] = int(cuda.memory_allocated(dev))
        out[PREFIX + "gpu_mem_max_bytes"] = int(cuda.max_memory_allocated(dev))
        if self._gpu_total is None:
            self._gpu_total = int(cuda.get_device_properties(dev).total_memory)
        out[PREFIX + "gpu_mem_total_bytes"] = self._gpu_total
        if self._gpu_util_ok:
            try:
                out[PREFIX + "gpu_util_pct"] = float(cuda.utilization(dev))
            except Exception:  # no pynvml / NVML: leave the field out from now on
                self._gpu_util_ok = False

    # --- the sample ------------------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        """One sample: the fields of the module doc that this machine can give. Never raises."""
        now = time.monotonic()
        dt, self._last_t = now - self._last_t, now
        out: dict[str, Any] = {}
        parts = [self._disk, self._cuda]
        if self._proc is not None:
            parts = [self._process, lambda o: self._system(o, dt), *parts]
        for part in parts:
            try:
                part(out)
            except Exception:  # a metric that cannot be read must never stop training
                continue
        return out


def system_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The system fields of a metrics row (the ``sys_`` ones), prefix removed."""
    return {k[len(PREFIX) :]: v for k, v in row.items() if k.startswith(PREFIX)}


__all__ = ["PREFIX", "SystemSampler", "system_fields"]
