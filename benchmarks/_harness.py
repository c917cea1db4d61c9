"""Shared by the benchmark scripts: child processes, CPU time from /proc, Dynamo, tables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DYNAMO_VERSION = "1.6.1"
DEFAULT_DYNAMO_VENV = Path(
    os.environ.get(
        "DYN_BENCH_DYNAMO_VENV",
        Path.home() / ".cache" / "dynamo-trio-bench" / f"dynamo-{DYNAMO_VERSION}",
    )
)
READY_MARK = ".dynamo-trio-bench-ready"
"""Written into the venv by ``setup_dynamo.sh`` once Dynamo and the tiny model are in place."""
_TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- processes


class Child:
    """A child process whose JSON stdout lines are collected (other lines are ignored)."""

    def __init__(self, process: trio.Process, name: str = "", log: Path | None = None) -> None:
        self.process = process
        self.name = name
        self.log = log
        self.events: list[dict[str, Any]] = []
        self._changed = trio.Event()

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events.append(event)
            self._changed.set()
            self._changed = trio.Event()
        self._changed.set()

    async def wait_for(
        self, event: str, within: float = 30.0, start: int = 0, **fields: Any
    ) -> dict[str, Any]:
        """The first ``event`` (from index ``start`` on) whose fields match ``fields``."""
        with trio.fail_after(within):
            while True:
                for candidate in self.events[start:]:
                    if candidate.get("event") == event and all(
                        candidate.get(k) == v for k, v in fields.items()
                    ):
                        return candidate
                if self.process.returncode is not None:
                    raise RuntimeError(f"{self.describe()} exited while waiting for {event!r}")
                await self._changed.wait()

    def describe(self) -> str:
        code = self.process.returncode
        state = "running" if code is None else f"exit code {code}"
        where = f"; its log: {self.log}" if self.log is not None else ""
        return f"{self.name or 'child'} (pid {self.pid}, {state}{where})"

    def log_tail(self, lines: int = 15) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


async def spawn(
    nursery: trio.Nursery,
    argv: Sequence[str],
    env: dict[str, str],
    *,
    name: str = "",
    logdir: Path | None = None,
) -> Child:
    """Start ``argv``; its stdout feeds ``Child.events``, its stderr goes to ``logdir/name.log``."""
    log: Path | None = None
    stderr: IO[bytes] | int = subprocess.DEVNULL
    if logdir is not None:
        log = logdir / f"{name or Path(argv[0]).name}.log"
        stderr = log.open("ab")
    try:
        process = await trio.lowlevel.open_process(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    finally:
        if not isinstance(stderr, int):
            stderr.close()
    child = Child(process, name, log)
    nursery.start_soon(child.read)
    return child


async def stop_all(children: Iterable[Child], grace: float = 10.0) -> None:
    """SIGTERM each child, wait up to ``grace`` seconds, then SIGKILL what is left."""
    children = list(children)
    for child in children:
        if child.process.returncode is None:
            child.process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        for child in children:
            await child.process.wait()
    for child in children:
        if child.process.returncode is None:
            print(f"  {child.describe()} ignored SIGTERM: killed", file=sys.stderr, flush=True)
            child.process.kill()
            await child.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def python_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without any DYN_*, NATS or etcd settings of the caller's."""
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith(("DYN_", "NATS_", "ETCD_")) or key == "_DYNAMO_TRIO_BENCH_REEXEC":
            del env[key]
    return env


# ---------------------------------------------------------------------------- CPU time


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of one live process (all its threads), in seconds; 0 if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # stat fields 14 and 15


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, ()))
    return tree


def tree_cpu_seconds(pids: Iterable[int]) -> float:
    """Process CPU time of ``pids`` and all their live descendants."""
    return sum(cpu_seconds(p) for pid in pids for p in descendants(pid))


async def settle(pids: Sequence[int], below: float = 0.1, within: float = 10.0) -> None:
    """Wait until ``pids`` (and children) use under ``below`` of a core, or ``within`` passes."""
    with trio.move_on_after(within):
        while True:
            before = tree_cpu_seconds(pids)
            await trio.sleep(0.2)
            if (tree_cpu_seconds(pids) - before) / 0.2 < below:
                return


def machine_busy_seconds() -> float:
    """CPU time every process on the machine has used (all cores), from /proc/stat.

    User, nice and system time, and steal (the hypervisor's).  Interrupt time is left
    out: the loopback traffic of the processes measured is handled there, and is not
    charged to them either.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + steal) / _TICKS


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# ---------------------------------------------------------------------------- the Dynamo venv


def dynamo_python(venv: Path) -> Path | None:
    """The venv's Python if ``setup_dynamo.sh`` completed there, else None."""
    python = venv / "bin" / "python"
    if python.exists() and (venv / READY_MARK).exists():
        return python
    return None


def dynamo_model_dir(venv: Path) -> Path:
    return venv / "tiny-model"


def dynamo_env(kv_dir: str) -> dict[str, str]:
    """Dynamo 1.6.1 on one machine: file discovery, TCP request plane, ZMQ events, loopback."""
    env = python_env()
    env.pop("PYTHONPATH", None)
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=kv_dir,
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="zmq",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="lo",
        DYN_SELF_HOST_METADATA="0",
        DYN_LOG="warn",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


# ---------------------------------------------------------------------------- figures


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Figure:
    """One row of a results table."""

    label: str
    unit: str = ""
    higher_is_better: bool = True
    digits: int = 0
    target: Callable[[float | None, float | None], str] | None = None
    """Given (the primary system's median, its ratio to the baseline), the verdict."""
    ratio: bool = True
    """False for diagnostics (load generator, other processes): no ratio is shown."""


Runs = dict[str, list[dict[str, float]]]
"""``runs[system][k][label]``: the value one figure had in a system's run k."""


def fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    if digits == 0 and abs(value) >= 10_000:
        return f"{value / 1000:,.1f}k"
    return f"{value:,.{digits}f}"


def spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0], digits)
    low, high = fmt(min(values), digits), fmt(max(values), digits)
    return f"{fmt(statistics.median(values), digits)} ({low}-{high})"


def values(runs: Runs, system: str, label: str) -> list[float]:
    return [run[label] for run in runs.get(system, []) if label in run]


def ratio(runs: Runs, system: str, baseline: str, label: str) -> float | None:
    """Median over k of ``system``'s run k / ``baseline``'s run k (minutes apart)."""
    pairs = zip(runs.get(system, []), runs.get(baseline, []), strict=False)
    ratios = [a[label] / b[label] for a, b in pairs if label in a and b.get(label)]
    return statistics.median(ratios) if ratios else None


def print_table(
    title: str,
    figures: Sequence[Figure],
    runs: Runs,
    systems: Sequence[str],
    baseline: str | None = None,
    file: IO[str] | None = None,
) -> None:
    """Medians (min-max) per system; each other system's ratio to ``baseline``; targets.

    The ratio is the median of the per-run ratios: run k of a system is paired with run
    k of the baseline, measured minutes apart on the same machine.  Targets are judged
    for the first system that is not the baseline.
    """
    out = file or sys.stdout
    others = [s for s in systems if s != baseline] if baseline else []
    header = ["figure", *systems, *(f"{s} / {baseline}" for s in others)]
    targets = bool(others) and any(f.target is not None for f in figures)
    if targets:
        header.append(f"target ({others[0]})")
    rows = []
    for figure in figures:
        row = [figure.label + (f" ({figure.unit})" if figure.unit else "")]
        row += [spread(values(runs, s, figure.label), figure.digits) for s in systems]
        for system in others:
            assert baseline is not None
            r = ratio(runs, system, baseline, figure.label) if figure.ratio else None
            lower = "" if figure.higher_is_better else " (lower better)"
            row.append("" if not figure.ratio else "-" if r is None else f"{r:.2f}x{lower}")
        if targets:
            assert baseline is not None
            mine = values(runs, others[0], figure.label)
            verdict = ""
            if figure.target is not None:
                verdict = figure.target(
                    statistics.median(mine) if mine else None,
                    ratio(runs, others[0], baseline, figure.label),
                )
            row.append(verdict)
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}", file=out)
    for row in [header, *rows]:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip(), file=out)


def now_stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")


def git_describe() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"{head[:72]}{' (+ uncommitted changes)' if dirty else ''}"
    return "unknown"
