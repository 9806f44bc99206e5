"""Resume benchmark: opening a long stored session costs what is on screen.

Two parts, on sessions of 500 and 5,000 turns (a question and a ~250-word
Markdown reply each) in a real SQLite store:

1. `chatterm launch --resume ID` (the real command, default model, on a 120x40
   pseudo-terminal, as `ui_startup.py` runs it): seconds until the last
   turn's reply is drawn (target <= 1 s), seconds until the app says ready
   (target <= 2 s), and the process's peak RSS then. A first, uncounted launch
   stores the persona's KV state, as any earlier use of chatterm has. Memory must not grow with
   the session: the 5,000-turn peak may exceed the 500-turn one by at most
   `RSS_GROWTH_MIB`.
2. Scrolling to the top (in process, headless `App.run_test`, the real app
   and store, a synthetic engine): the conversation is scrolled to its top
   until `--pages` pages of older turns are mounted; for each page, the time until
   it is on screen, and the worst event-loop stall meanwhile (a task wakes
   every 10 ms). Targets: p95 page <= 250 ms, worst stall <= 100 ms.

Run: .venv/bin/python benchmarks/ui_resume_load.py [--runs N] [--pages N]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from ui_startup import FIRST_FRAME, one_launch

SIZES = (500, 5_000)
SHOWN_TARGET_S = 1.0
READY_TARGET_S = 2.0
RSS_GROWTH_MIB = 25.0
PAGE_P95_TARGET_MS = 250.0
SCROLL_STALL_TARGET_MS = 100.0


def reply(i: int) -> str:
    """About 250 words of LLM-looking Markdown."""
    words = " ".join(f"word{(i * 7 + j) % 97}" for j in range(70))
    return (
        f"## Answer {i}\n\nHere is a reply with **bold** text and `code`.\n\n"
        f"- first point {words}\n- second point {words}\n\n"
        f"```python\nprint({i})\n```\n\n{words} end of reply {i}."
    )


def build_session(store, catalog_model: str, turns: int) -> int:
    from chatterm.core.metrics.turn_metrics import TurnMetrics

    sid = store.create_session(model_id=catalog_model, model_identity="bench", engine="local",
                               device="CPU", persona_id="assistant")
    for i in range(1, turns + 1):
        m = TurnMetrics(engine="local", model_id=catalog_model, persona_id="assistant",
                        submitted_at=1.7e9 + i, ttft_ms=120.0, generated_tokens=330,
                        decode_ms=6000.0, stop_reason="eos")
        text = reply(i) + (f"\n\nLASTTURN{turns}" if i == turns else "")
        store.record_turn(sid, f"Question {i}: tell me more?", text, m)
    return sid


def launch_figures(tmp: Path, sid: int, turns: int) -> tuple[float, float, float]:
    return one_launch(tmp, args=("launch", "--resume", str(sid)), shown=f"LASTTURN{turns}".encode())


def scroll_figures(workspace, store, sid: int, pages: int) -> tuple[list[float], float, int]:
    """(ms per page of older turns, worst loop stall ms, turns mounted at the end)."""
    from chatterm.core.engine.interface import DeviceInfo, Engine, PrefixReport
    from chatterm.core.metrics.turn_metrics import CacheOutcome
    from chatterm.ui.launch import make_app
    from chatterm.ui.transcript import ConversationView, UserMessage

    class IdleEngine(Engine):
        kind = "synthetic"

        def load(self, progress=None):
            pass

        def device(self):
            return DeviceInfo("CPU", "synthetic", n_ctx=8192)

        def prepare_persona(self, persona, progress=None):
            return PrefixReport(CacheOutcome.MEMORY, 0.0, 0)

        def start_turn(self, persona, history, user_text):
            raise NotImplementedError("this benchmark sends nothing")

    async def run() -> tuple[list[float], float, int]:
        app = make_app(workspace, store=store, resume=sid, gpu_status=lambda: None,
                       engine_factory=lambda spec: IdleEngine(spec, workspace.catalog.price(spec.price_profile)))
        stalls: list[float] = []
        page_ms: list[float] = []
        monitoring = True

        async def loop_monitor() -> None:
            while monitoring:
                t = time.perf_counter()
                await asyncio.sleep(0.010)
                stalls.append((time.perf_counter() - t - 0.010) * 1000.0)

        async with app.run_test(size=(120, 40)) as pilot:
            while app.conversation is None:
                await pilot.pause(0.02)
            await pilot.pause(0.3)
            view = app.query_one(ConversationView)
            view.focus()
            monitor = asyncio.create_task(loop_monitor())
            for _ in range(pages):
                before = len(view.query(UserMessage))
                t = time.perf_counter()
                view.scroll_home(animate=False)
                while len(view.query(UserMessage)) == before:
                    await asyncio.sleep(0.002)
                painted = asyncio.get_running_loop().create_future()
                app.call_after_refresh(lambda p=painted: p.done() or p.set_result(time.perf_counter()))
                page_ms.append((await painted - t) * 1000.0)
                await pilot.pause(0.05)
            monitoring = False
            await monitor
            mounted = len(view.query(UserMessage))
            # Order intact: the mounted questions count up without a gap.
            numbers = [int(str(u.render()).split()[1].rstrip(":")) for u in view.query(UserMessage)]
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "older turns out of order"
        return page_ms, max(stalls), mounted

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pages", type=int, default=50, help="pages of older turns to scroll through")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="chatterm-bench-"))
    for name in ("CONFIG", "DATA", "CACHE"):
        os.environ[f"CHATTERM_{name}_DIR"] = str(tmp / name.lower())
    os.environ.pop("CHATTERM_DB", None)
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.workspace import Workspace

    workspace = Workspace.load()
    store = SessionStore(workspace.db_path)
    sessions = {n: build_session(store, workspace.catalog.default_model, n) for n in SIZES}

    # Warm-up (not counted): the first launch prefills the persona's prompt and
    # stores its KV state; every later launch restores it, as a user's would.
    launch_figures(tmp, sessions[SIZES[0]], SIZES[0])
    launches = {n: [launch_figures(tmp, sessions[n], n) for _ in range(args.runs)] for n in SIZES}
    plain = [one_launch(tmp, shown=FIRST_FRAME) for _ in range(args.runs)]
    page_ms, stall_ms, mounted = scroll_figures(workspace, store, sessions[SIZES[-1]], args.pages)
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)  # the benchmark's own folders and database

    print(f"`chatterm launch --resume` on a 120x40 pty, {args.runs} runs per session size")
    print(f"{'turns':>6} {'shown s (median/worst)':>24} {'ready s (median/worst)':>24} {'peak RSS MiB':>13}")
    print(f"{'none':>6} {statistics.median(r[0] for r in plain):>15.3f} / {max(r[0] for r in plain):.3f} "
          f"{statistics.median(r[1] for r in plain):>15.3f} / {max(r[1] for r in plain):.3f} "
          f"{statistics.median(r[2] for r in plain):>13.1f}   (plain `launch`, for comparison)")
    ok = True
    for n in SIZES:
        shown = [r[0] for r in launches[n]]
        ready = [r[1] for r in launches[n]]
        rss = statistics.median(r[2] for r in launches[n])
        print(f"{n:>6} {statistics.median(shown):>15.3f} / {max(shown):.3f} "
              f"{statistics.median(ready):>15.3f} / {max(ready):.3f} {rss:>13.1f}")
        ok &= max(shown) <= SHOWN_TARGET_S and max(ready) <= READY_TARGET_S
    growth = (statistics.median(r[2] for r in launches[SIZES[-1]])
              - statistics.median(r[2] for r in launches[SIZES[0]]))
    print(f"targets: shown <= {SHOWN_TARGET_S:.0f} s, ready <= {READY_TARGET_S:.0f} s; "
          f"peak RSS growth {SIZES[0]} -> {SIZES[-1]} turns: {growth:+.1f} MiB (target <= {RSS_GROWTH_MIB:.0f})")
    ok &= growth <= RSS_GROWTH_MIB
    p95 = sorted(page_ms)[min(len(page_ms) - 1, round(0.95 * (len(page_ms) - 1)))]
    print(f"scrolling up the {SIZES[-1]:,}-turn session: {len(page_ms)} pages, {mounted} turns mounted; "
          f"page on screen median {statistics.median(page_ms):.0f} ms, p95 {p95:.0f} ms "
          f"(target <= {PAGE_P95_TARGET_MS:.0f}); worst loop stall {stall_ms:.0f} ms "
          f"(target <= {SCROLL_STALL_TARGET_MS:.0f})")
    ok &= p95 <= PAGE_P95_TARGET_MS and stall_ms <= SCROLL_STALL_TARGET_MS
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
