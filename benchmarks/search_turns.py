"""Search benchmark: `SessionStore.search` over a big database, in process.

Builds a session database through the real store API (`SessionStore.batch()`:
one transaction) — by default 1,000 sessions and 100,000 turns, each a
question and a reply of `--reply-words` words drawn from a vocabulary of a
few hundred words, with one rare word planted in one turn — then times, as
the median of `--runs`, searches that find one turn, that match every turn
(the newest 50 are returned), two words, a prefix typed half-way, and text
full of FTS syntax. The same searches run on a copy built where SQLite has no
FTS5 (the plain scan), for comparison; the target applies to FTS5.
It prints the CPU and a calibration (`sum(range(10**6))` with timeit), and
checks what each search found.

Run: .venv/bin/python benchmarks/search_turns.py [--sessions N] [--turns N] [--reply-words N] [--runs N] [--json FILE]
Exit status 1 when an FTS5 search's median is over TARGET_MS or a search
finds the wrong turns.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import finish  # noqa: E402

from chatterm.core.metrics.turn_metrics import TurnMetrics  # noqa: E402
from chatterm.core.store import schema  # noqa: E402
from chatterm.core.store.session_store import SessionStore  # noqa: E402
from chatterm.core.system.machine import calibration_ms, cpu_name  # noqa: E402

TARGET_MS = 200.0
RARE = "quokka"
COMMON = "cache"
SEARCHES = {
    "one rare word (1 hit)": RARE,
    "a word in every turn (newest 50)": COMMON,
    "two words": "persona latency",
    "a prefix, typed half-way": "quok",
    "FTS syntax characters": '"NEAR(cache* -"latency" AND',
}


def vocabulary(n: int = 400) -> list[str]:
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)}
    return sorted(words - {RARE})


def build(db: Path, sessions: int, turns: int, reply_words: int) -> float:
    words = vocabulary()
    rng = random.Random(11)
    per_session, extra = divmod(turns, sessions)
    planted = (sessions // 2, per_session // 2)
    t0 = time.perf_counter()
    with SessionStore(db) as store, store.batch():
        for s in range(sessions):
            sid = store.create_session(model_id="smollm2-135m", model_identity="sha256:bench", engine="local",
                                       device="CPU", persona_id="assistant", started_at=1.7e9 + s * 60.0)
            for t in range(per_session + (1 if s < extra else 0)):
                reply = " ".join(rng.choice(words) for _ in range(reply_words))
                question = f"How does the {COMMON} help with {rng.choice(words)} and {rng.choice(words)}?"
                if (s, t) == planted:
                    question += f" Also, what is a {RARE}?"
                if t % 10 == 0:
                    reply += " the persona latency"
                m = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="assistant",
                                submitted_at=1.7e9 + s * 60.0 + t, price_profile="gpt-4.1", cache_outcome="memory",
                                prompt_tokens=400, cached_tokens=380, prefilled_tokens=20,
                                generated_tokens=reply_words, ttft_ms=100.0, decode_ms=2000.0,
                                total_ms=2100.0, stop_reason="eos")
                store.record_turn(sid, question, reply, m)
    return time.perf_counter() - t0


def time_searches(db: Path, runs: int) -> dict[str, dict]:
    figures = {}
    with SessionStore(db, readonly=True) as store:
        for name, text in SEARCHES.items():
            times, hits = [], []
            for _ in range(runs):
                t0 = time.perf_counter()
                hits = store.search(text)
                times.append((time.perf_counter() - t0) * 1000.0)
            figures[name] = {"query": text, "median_ms": statistics.median(times), "max_ms": max(times),
                             "hits": len(hits), "first": [hits[0].session_id, hits[0].turn_index] if hits else None}
    return figures


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--reply-words", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(args)

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="chatterm-search-") as tmp:
        for mode in ("fts5", "scan"):
            db = Path(tmp) / f"{mode}.db"
            if mode == "scan":
                schema.fts5_available = lambda conn: False  # a build without FTS5
            build_s = build(db, opts.sessions, opts.turns, opts.reply_words)
            results[mode] = {"build_s": build_s, "db_mb": db.stat().st_size / 1e6,
                             "searches": time_searches(db, opts.runs)}

    calib = calibration_ms()
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); calibration sum(range(10**6)) = {calib:.1f} ms")
    failures = []
    planted = [opts.sessions // 2 + 1, opts.turns // opts.sessions // 2 + 1]
    expected = {"one rare word (1 hit)": (1, planted), "a word in every turn (newest 50)": (50, None),
                "a prefix, typed half-way": (1, planted), "FTS syntax characters": (None, None)}
    for mode, figures in results.items():
        print(f"{mode}: built {opts.sessions:,} sessions / {opts.turns:,} turns in {figures['build_s']:.1f} s; "
              f"database {figures['db_mb']:.0f} MB")
        for name, f in figures["searches"].items():
            ok = mode == "scan" or f["median_ms"] <= TARGET_MS
            print(f"  {name:<34} median {f['median_ms']:7.1f} ms (max {f['max_ms']:.1f}) · {f['hits']} hits"
                  + ("" if mode == "scan" else f" (target <= {TARGET_MS:.0f} ms) {'ok' if ok else 'MISS'}"))
            if not ok:
                failures.append(f"{mode} {name}: {f['median_ms']:.1f} ms")
            count, first = expected.get(name, (None, None))
            if count is not None and f["hits"] != count or first is not None and f["first"] != first:
                failures.append(f"{mode} {name}: found {f['hits']} hits, first {f['first']}")
    return finish(failures, opts.json, {
        "cpu": cpu_name(), "cores": os.cpu_count(), "calibration_ms": calib, "sessions": opts.sessions,
        "turns": opts.turns, "reply_words": opts.reply_words, "runs": opts.runs, "results": results,
        "target_ms": TARGET_MS,
    })


if __name__ == "__main__":
    sys.exit(main())
