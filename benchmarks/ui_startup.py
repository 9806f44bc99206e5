"""Startup benchmark: process start to first frame of `chatterm launch`. Target <= 1 s.

Runs the real command (`python -m chatterm launch`, default model and persona,
fresh folders in a temp dir) on a pseudo-terminal of 120x40 and reads its
output until the title bar's text appears: that is the first frame a user
sees. The clock starts just before the process is spawned, so interpreter
start-up and every import are included. Reading the pty costs the app
nothing (no polling subprocesses competing for the 2 cores). The model then
loads in a worker; the app is quit with Ctrl+Q once it reports "ready", and
the time to ready is reported too.

Run: .venv/bin/python benchmarks/ui_startup.py [--runs N]
Exit status 1 when the median first frame is over the target.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import statistics
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Sequence

TARGET_S = 1.0
REPO = Path(__file__).resolve().parent.parent
FIRST_FRAME = "chatterm · ".encode()
READY = "· ready".encode()


def one_launch(tmp: Path, timeout_s: float = 60.0, args: Sequence[str] = ("launch",),
               shown: bytes = FIRST_FRAME) -> tuple[float, float, float]:
    """Run `chatterm *args` on a 120x40 pty: (seconds until `shown` is drawn,
    seconds until the app says ready, peak RSS in MiB when it is ready)."""
    env = dict(os.environ)
    env.update(
        CHATTERM_CONFIG_DIR=str(tmp / "config"),
        CHATTERM_DATA_DIR=str(tmp / "data"),
        CHATTERM_CACHE_DIR=str(tmp / "cache"),
        TERM="xterm-256color",
    )
    env.pop("CHATTERM_DB", None)
    t0 = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # child: becomes `chatterm launch` on the pty
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "chatterm", *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    seen = b""
    first_frame = ready = None
    peak_rss_mib = float("nan")
    deadline = t0 + timeout_s
    try:
        while ready is None and time.perf_counter() < deadline:
            readable, _, _ = select.select([fd], [], [], 0.05)
            if not readable:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            now = time.perf_counter()
            seen = (seen + chunk)[-65536:]
            if first_frame is None and shown in seen:
                first_frame = now - t0
            if first_frame is not None and READY in seen:
                ready = now - t0
                peak_rss_mib = _peak_rss_mib(pid)
        os.write(fd, b"\x11")  # Ctrl+Q
        end = time.perf_counter() + 30
        while time.perf_counter() < end:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
    finally:
        os.close(fd)
    if first_frame is None or ready is None:
        raise RuntimeError("the app did not draw its first frame / get ready in time")
    return first_frame, ready, peak_rss_mib


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="chatterm-bench-") as tmp:
            results.append(one_launch(Path(tmp)))
    print(f"`chatterm launch` on a 120x40 pty, fresh folders, {args.runs} runs")
    print(f"{'run':>4} {'first frame s':>14} {'model ready s':>14}")
    for i, (frame, ready, _) in enumerate(results, 1):
        print(f"{i:>4} {frame:>14.3f} {ready:>14.3f}")
    median = statistics.median(f for f, _, _ in results)
    print(f"first frame: median {median:.3f} s, worst {max(f for f, _, _ in results):.3f} s "
          f"(target <= {TARGET_S:.1f} s); ready: median {statistics.median(r for _, r, _ in results):.3f} s")
    ok = median <= TARGET_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
