"""The UI's share of decode: the real TUI's tokens per second against `chatterm ask`'s.

Issue #26 moved decode onto every core and asked that the TUI stay smooth
with it, and that a share of the CPU left to the UI be left on purpose,
measured. This measures what the UI costs decode, and whether leaving it a
core would pay, with the real app drawing on a real terminal:
- TUI: `chatterm launch` on a 120x40 pseudo-terminal (its output read and
  dropped, as a terminal would take it), the same prompt sent N times with
  Ctrl+N between (each turn starts from the cached persona prefix; type-ahead
  off, so typing prefills nothing); each turn's decode tok/s is read back from
  the session database (`TurnMetrics.decode_tok_s`, as stored);
- ask: `chatterm ask --json` with the same persona and prompt, no UI;
- both again with decode pinned to one core less than the machine has
  (`n_threads` in a models.toml entry; prefill keeps every core): what
  leaving the UI a core of its own would give.
The four take turns in each round, so they see the same load. A greedy
persona (`bench`) with a fixed token budget makes every reply the same.

Check: the TUI with every core decodes at least 0.97x as fast as the TUI
with a core left to the UI (else leaving one would be the better default).
Exit status 1 when that misses. Also printed: the TUI's rate as a share of
ask's (what the UI costs), for both settings.

Run: .venv/bin/python benchmarks/ui_decode_share.py [--rounds N] [--turns N] [--max-tokens N] [--json FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import termios
import time
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import bench_workspace, finish, in_temp_home  # noqa: E402

from chatterm.core.system.machine import calibration_ms, cpu_name, physical_cores  # noqa: E402

PROMPT = "Write a detailed essay about the history of computers, with several sections."
READY = "· ready".encode()
CTRL_N, CTRL_Q = b"\x0e", b"\x11"
PINNED = "pinned"
TARGET = 0.97


class Pty:
    """A child process on a 120x40 pseudo-terminal whose output is read and dropped."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: becomes `chatterm launch` on the pty
            try:
                os.chdir(REPO)
                os.execve(sys.executable, [sys.executable, *argv], env)
            finally:
                os._exit(127)  # never back into the parent's stack (its temp-dir cleanup)
        self.exited = False
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.seen = b""

    def pump(self, seconds: float) -> None:
        """Read (and keep the tail of) what the app draws for `seconds`; a
        SystemExit with the tail of its output if the app has ended."""
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > 0:
            if select.select([self.fd], [], [], min(left, 0.05))[0]:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the app closed the terminal
                    chunk = b""
                if not chunk:
                    self._check_alive(wait=True)
                    continue
                self.seen = (self.seen + chunk)[-65536:]
        self._check_alive(wait=False)

    def _check_alive(self, wait: bool) -> None:
        if not self.exited and os.waitpid(self.pid, 0 if wait else os.WNOHANG)[0]:
            self.exited = True
        if self.exited:
            tail = self.seen[-2000:].decode(errors="replace")
            raise SystemExit(f"chatterm launch ended; the last of its output:\n{tail}")

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def close(self) -> None:
        """Quit the app (Ctrl+Q), killing it if it does not go within 30 s."""
        if not self.exited:
            try:
                self.write(CTRL_Q)
            except OSError:
                pass  # the terminal is gone: the app is ending
            end = time.perf_counter() + 30
            while time.perf_counter() < end:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    break
                try:
                    if select.select([self.fd], [], [], 0.05)[0]:
                        os.read(self.fd, 65536)
                except OSError:
                    time.sleep(0.05)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        os.close(self.fd)


def tui_rates(env: dict[str, str], db: Path, model: list[str], turns: int) -> list[float]:
    """Decode tok/s of `turns` turns in one `chatterm launch`."""
    app = Pty(["-m", "chatterm", "launch", "--persona", "bench", "--no-type-ahead", *model], env)
    try:
        deadline = time.perf_counter() + 120
        while READY not in app.seen:
            if time.perf_counter() > deadline:
                raise SystemExit("the TUI did not get ready in 120 s")
            app.pump(0.1)
        app.pump(0.5)
        rates: list[float] = []
        for n in range(1, turns + 1):
            app.write(PROMPT.encode() + b"\r")
            deadline = time.perf_counter() + 300
            while True:
                app.pump(0.2)  # a small query five times a second: the app is not disturbed
                done = _finished_turns(db)
                if len(done) >= n:
                    break
                if time.perf_counter() > deadline:
                    raise SystemExit(f"turn {n} did not finish in 300 s")
            rate, stop = done[n - 1]
            if stop == "error" or rate is None:
                raise SystemExit(f"turn {n} failed in the TUI (stop reason {stop})")
            rates.append(rate)
            app.write(CTRL_N)
            app.pump(0.8)
        return rates
    finally:
        app.close()


def _finished_turns(db: Path) -> list[tuple[float | None, str]]:
    """(decode tok/s as stored, stop reason) of each finished turn, oldest first."""
    if not db.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as con:
            return con.execute("SELECT decode_tok_s, stop_reason FROM turns "
                               "WHERE stop_reason IS NOT NULL ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # not created yet, or mid-write
        return []


def ask_rate(env: dict[str, str], model: list[str]) -> float:
    out = subprocess.run([sys.executable, "-m", "chatterm", "ask", "--json", "--persona", "bench", *model, PROMPT],
                         cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"chatterm ask failed:\n{out.stderr}")
    m = json.loads(out.stdout)["metrics"]
    if m["decode_tok_s"] is None:
        raise SystemExit(f"chatterm ask decoded {m['generated_tokens']} tokens: no rate to compare")
    return m["decode_tok_s"]


def run(args: argparse.Namespace, tmp: Path) -> int:
    ws = bench_workspace(tmp, max_tokens=args.max_tokens)
    cores = physical_cores()
    if cores < 2:
        raise SystemExit("one core: there is no core to leave to the UI")
    spec = ws.catalog.get(None)
    config = Path(os.environ["CHATTERM_CONFIG_DIR"])
    (config / "models.toml").write_text(
        f'[models.{PINNED}]\nsource = "{spec.source}"\nn_ctx = {spec.n_ctx}\n'
        f"n_threads = {cores - 1}\nn_threads_batch = {cores}\n")
    settings = {"every core": [], f"decode on {cores - 1} of {cores} cores": ["--model", PINNED]}
    rates: dict[str, dict[str, list[float]]] = {name: {"tui": [], "ask": []} for name in settings}
    calib_before, load_before = calibration_ms(), os.getloadavg()[0]
    for r in range(args.rounds):
        for name, model in settings.items():
            env = dict(os.environ, TERM="xterm-256color", CHATTERM_DB=str(tmp / f"tui-{r}-{len(model)}.db"))
            rates[name]["tui"] += tui_rates(env, Path(env["CHATTERM_DB"]), model, args.turns)
            env["CHATTERM_DB"] = str(tmp / "ask.db")
            rates[name]["ask"] += [ask_rate(env, model) for _ in range(args.turns)]
            print(f"round {r + 1}, {name}: TUI {', '.join(f'{x:.1f}' for x in rates[name]['tui'][-args.turns:])}; "
                  f"ask {', '.join(f'{x:.1f}' for x in rates[name]['ask'][-args.turns:])} tok/s", flush=True)
    calib_after, load_after = calibration_ms(), os.getloadavg()[0]

    medians = {name: {k: statistics.median(v) for k, v in kinds.items()} for name, kinds in rates.items()}
    every, pinned = (medians[name] for name in settings)
    ratio = every["tui"] / pinned["tui"]
    print(f"\n{cpu_name()}, {cores} cores · calibration {calib_before:.1f} / {calib_after:.1f} ms · "
          f"load {load_before:.2f} / {load_after:.2f} · {args.rounds} rounds of {args.turns} turns, "
          f"{args.max_tokens} tokens each")
    for name, m in medians.items():
        print(f"  {name:<24} TUI {m['tui']:6.1f} tok/s, ask {m['ask']:6.1f} tok/s: the TUI decodes at "
              f"{m['tui'] / m['ask']:.0%} of ask's")
    print(f"TUI, every core / a core left to the UI: {ratio:.2f}x (target >= {TARGET}x)")
    failures = [] if ratio >= TARGET else [f"the TUI decodes faster with a core left to the UI ({ratio:.2f}x)"]
    return finish(failures, args.json, {
        "cpu": cpu_name(), "cores": cores, "calibration_ms": [calib_before, calib_after],
        "loadavg_1min": [load_before, load_after], "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rounds": args.rounds, "turns": args.turns, "max_tokens": args.max_tokens,
        "decode_tok_s": rates, "median_tok_s": medians, "every_core_over_core_left": ratio,
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3, help="turns per TUI launch, and ask runs per round")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--json", type=Path, help="write the figures here")
    return in_temp_home(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
