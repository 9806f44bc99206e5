"""Long-conversation benchmark: a 30-turn conversation that outgrows the context.

With the real default model, one stored conversation of `--turns` turns (user
messages of about n_ctx / 12 tokens, greedy replies of up to 64 tokens) runs at
each `--n-ctx` under each overflow policy, and every turn's TTFT and prefilled
tokens are recorded:
- `shift`: the median TTFT of the turns at which the context overflowed (the
  oldest turns left it) over the median TTFT of the turns that fit as they
  were. Target <= 1.5x.
- `truncate`: the mean TTFT over all turns over the median TTFT of the turns
  that fit. Target <= 3x.
Each configuration must overflow at least three times, or the run says so.

Then, for the `shift` run at the smallest n_ctx, how often a shift changes the
reply: each turn after the first shift is also answered by a second copy of
the model from a fresh prefill of exactly the same prompt tokens, and the
greedy replies are compared token for token.

The CPU, the `sum(range(10**6))` calibration and the load average are recorded
before and after; the figures are ratios within one run.

Run: .venv/bin/python benchmarks/context_overflow.py [--turns N] [--n-ctx 1024 4096] [--json FILE]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHIFT_TARGET = 1.5
TRUNCATE_TARGET = 3.0
MAX_TOKENS = 64
WORDS = ("river", "lantern", "copper", "meadow", "signal", "harbor", "violet", "engine", "quartz", "garden")


def message(i: int, tokens: int) -> str:
    words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(max(tokens - 12, 4)))
    return f"Note {i}: {words}. Answer in one sentence."


def run(ws, n_ctx: int, policy: str, turns: int, fresh=None) -> dict:
    from chatterm.core.cache.prompt_cache import PromptCache
    from chatterm.core.engine.conversation import Conversation
    from chatterm.core.engine.local.engine import LocalEngine
    from chatterm.core.store.session_store import SessionStore
    from tests.conftest import greedy

    spec = replace(ws.catalog.get(None), id=f"bench-{n_ctx}-{policy}", n_ctx=n_ctx, context_overflow=policy)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(ws.kv_dir))
    engine.load()
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=MAX_TOKENS)
    prompts: list[list[int]] = []
    fit = engine.fit_prompt

    def recording_fit(*args, **kwargs):
        fitted = fit(*args, **kwargs)
        prompts.append(list(fitted.tokens))
        return fitted

    engine.fit_prompt = recording_fit
    rows, diverged, compared, shifted_once = [], 0, 0, False
    try:
        with SessionStore(ws.db_path) as store:
            conversation = Conversation(engine, persona, store=store)
            for i in range(turns):
                turn = conversation.send(message(i, n_ctx // 12))
                for _ in turn.stream():
                    pass
                m = turn.metrics
                reply_tokens = engine._live_tokens()[len(prompts[-1]):]
                rows.append({"turn": i + 1, "ttft_ms": m.ttft_ms, "prompt": m.prompt_tokens,
                             "prefilled": m.prefilled_tokens, "cut_turns": m.cut_turns,
                             "shifted": m.shifted_tokens, "shift_ms": m.shift_ms})
                shifted_once = shifted_once or m.shifted_tokens > 0
                if fresh is not None and shifted_once:
                    compared += 1
                    diverged += fresh(prompts[-1], len(reply_tokens)) != reply_tokens
    finally:
        engine.close()
    fits = [r["ttft_ms"] for r in rows[1:] if not r["cut_turns"]]
    cuts = [r["ttft_ms"] for r in rows if r["cut_turns"]]
    result = {"n_ctx": n_ctx, "policy": policy, "turns": rows, "overflows": len(cuts),
              "median_fit_ms": statistics.median(fits), "median_overflow_ms": statistics.median(cuts) if cuts else None,
              "mean_all_ms": statistics.fmean(r["ttft_ms"] for r in rows[1:])}
    if policy == "shift":
        result["ratio"] = result["median_overflow_ms"] / result["median_fit_ms"] if cuts else None
    else:
        result["ratio"] = result["mean_all_ms"] / result["median_fit_ms"]
    if fresh is not None:
        result["divergence"] = {"compared": compared, "diverged": diverged}
    return result


def fresh_replier(ws, n_ctx: int):
    """Greedy reply tokens from a fresh prefill of exactly `tokens`, on a second copy of the model."""
    import llama_cpp

    from chatterm.core.engine.local.engine import LocalEngine

    spec = replace(ws.catalog.get(None), id=f"fresh-{n_ctx}", n_ctx=n_ctx)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=None)
    engine.load()
    vocab = llama_cpp.llama_model_get_vocab(engine.llm.model)

    def reply(tokens: list[int], n: int) -> list[int]:
        with engine.exclusive() as llm:
            out = []
            for token in llm.generate(tokens, temp=0.0, reset=True):
                if llama_cpp.llama_vocab_is_eog(vocab, token) or len(out) >= n:
                    break
                out.append(token)
            return out

    return engine, reply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--n-ctx", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "cpu-context-overflow.json")
    args = parser.parse_args()

    from chatterm.core.system.machine import calibration_ms, cpu_name

    calib_before, load_before = calibration_ms(), os.getloadavg()
    print(f"CPU {cpu_name()}, {os.cpu_count()} CPUs; calibration {calib_before:.1f} ms; "
          f"load average {load_before[0]:.2f}")
    results, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("CONFIG", "DATA", "CACHE"):
            os.environ[f"CHATTERM_{key}_DIR"] = str(Path(tmp) / key.lower())
        from chatterm.core.workspace import Workspace

        ws = Workspace.load(db_path=Path(tmp) / "bench.db")
        for n_ctx in args.n_ctx:
            for policy in ("shift", "truncate"):
                fresh_engine, fresh = (fresh_replier(ws, n_ctx) if policy == "shift" and n_ctx == min(args.n_ctx)
                                       else (None, None))
                try:
                    r = run(ws, n_ctx, policy, args.turns, fresh)
                finally:
                    if fresh_engine is not None:
                        fresh_engine.close()
                target = SHIFT_TARGET if policy == "shift" else TRUNCATE_TARGET
                met = r["ratio"] is not None and r["ratio"] <= target and r["overflows"] >= 3
                ok &= met
                what = "median overflowed / median fitting" if policy == "shift" else "mean all / median fitting"
                prefilled = [t["prefilled"] for t in r["turns"]]
                print(f"n_ctx {n_ctx:>5} {policy:<8} overflows {r['overflows']}  fitting median "
                      f"{r['median_fit_ms']:.0f} ms  {what} {r['ratio'] or float('nan'):.2f}x "
                      f"(<= {target}x) {'ok' if met else 'MISSED'}")
                print(f"      prefilled per turn: {prefilled}")
                if "divergence" in r:
                    d = r["divergence"]
                    print(f"      replies after a shift that differ from a fresh prefill: "
                          f"{d['diverged']} of {d['compared']}")
                results.append(r)
    calib_after, load_after = calibration_ms(), os.getloadavg()
    print(f"calibration after: {calib_after:.1f} ms; load average {load_after[0]:.2f}")
    args.json.write_text(json.dumps({
        "host": {"cpu": cpu_name(), "cpus": os.cpu_count(), "calibration_ms": [calib_before, calib_after],
                 "loadavg_1min": [load_before[0], load_after[0]]},
        "targets": {"shift": SHIFT_TARGET, "truncate": TRUNCATE_TARGET},
        "configs": results,
    }, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
