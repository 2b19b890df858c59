"""A process's CPU, memory and scheduling, and the machine's load, from /proc."""

from __future__ import annotations

import os
import resource

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds process `pid` used so far, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK


def cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` used so far."""
    return sum(cpu_split(pid))


def cpu_children() -> float:
    """CPU of this process's reaped children (a daemon, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def memory(pid: int, field_name: str) -> int:
    """A memory figure of process `pid` from /proc/PID/status, in KiB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/{pid}/status")


def thread_sched(pid: int) -> tuple[float, float]:
    """(seconds running, seconds runnable but waiting for a CPU) of the main thread of
    `pid`: a daemon's event loop, where it serves every request that needs no waiting I/O."""
    with open(f"/proc/{pid}/schedstat") as f:
        running, waiting, _ = (int(n) for n in f.read().split())
    return running / 1e9, waiting / 1e9


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        jiffies = [int(n) for n in f.readline().split()[1:]]
    return jiffies[0] + jiffies[1] + jiffies[2] + sum(jiffies[5:8]), sum(jiffies[:8])
