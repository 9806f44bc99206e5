"""Decode threads benchmark: chatterm's engine against llama-cpp-python given every core.

With the real default model and the same greedy prompt, it measures decode
tokens/s (first to last token, `TurnMetrics.decode_tok_s`'s formula) of:
- chatterm: the `LocalEngine`, whose decode threads (`model.Threads`) are one
  per physical core less the cores other processes keep busy;
- every core: plain llama-cpp-python with `n_threads` = every CPU this process
  may run on (its own default is half the machine's CPU count);
- one thread: plain llama-cpp-python with `n_threads=1`.
First on the machine as it is, then with a busy process (a pure-Python loop)
holding one core. The three take turns within each run, so they see the same
load. How busy other processes kept the CPU is measured before each scenario
and recorded, with the CPU and the `sum(range(10**6))` calibration before and
after: on a shared machine the "idle" scenario is only as idle as that says.

Targets: chatterm / every core >= 0.97 idle (no loss where nothing competes);
with one core busy, chatterm >= 0.95x the faster of the two fixed counts
(decode does not collapse when another process takes a core). Also printed:
chatterm's slowdown from idle to one core busy. With a core taken, the cores
left bound it: on 2 cores it is every core's idle rate over one thread's
(about 1.4x), so the 1.3x asked of it can only hold with more cores.

Run: .venv/bin/python benchmarks/decode_threads.py [--runs N] [--max-tokens N] [--json FILE]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

IDLE_TARGET = 0.97
BUSY_TARGET = 0.95
PROMPT = "Write a long story about a dragon who learns to cook, with many details."


def library_tok_s(llm, tokens: list[int], max_tokens: int, sampling) -> float | None:
    """Decode tok/s of plain llama-cpp-python over `tokens`, from a cold context,
    with the persona's `sampling` (greedy: the same tokens as chatterm's reply)."""
    import llama_cpp

    llm.reset()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    stamps: list[float] = []
    for token in llm.generate(tokens, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                              temp=0.0, repeat_penalty=sampling.repeat_penalty, reset=True):
        stamps.append(time.perf_counter())
        if llama_cpp.llama_vocab_is_eog(vocab, token) or len(stamps) >= max_tokens:
            break
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="replies per scenario and contender (median kept)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="chatterm-bench-"))
    for name in ("CONFIG", "DATA", "CACHE"):
        os.environ[f"CHATTERM_{name}_DIR"] = str(tmp / name.lower())
    os.environ.pop("CHATTERM_DB", None)

    import llama_cpp

    from chatterm.core.engine.local.engine import LocalEngine
    from chatterm.core.engine.local.model import threads_in_use
    from chatterm.core.system.machine import busy_fraction, calibration_ms, cpu_name, physical_cores, usable_cpus
    from chatterm.core.workspace import Workspace

    cpus = len(usable_cpus())
    calib_before, load_before = calibration_ms(), os.getloadavg()
    print(f"CPU: {cpu_name()} ({cpus} CPUs, {physical_cores()} physical cores); "
          f"calibration {calib_before:.1f} ms; load average {load_before[0]:.2f}")
    ws = Workspace.load(db_path=tmp / "bench.db")
    spec = ws.catalog.get(None)
    base = ws.personas.get(None)
    persona = replace(base, sampling=replace(base.sampling, temperature=0.0, max_tokens=opts.max_tokens))
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=None)
    engine.load()
    tokens = engine.fit_prompt(persona, [], PROMPT, opts.max_tokens).tokens
    libraries = {
        name: llama_cpp.Llama(str(spec.model_path()), n_ctx=spec.n_ctx, n_threads=n, n_threads_batch=cpus,
                              verbose=False)
        for name, n in (("every core", cpus), ("one thread", 1))
    }

    def chatterm_tok_s() -> tuple[float | None, int]:
        engine.reset_context()
        turn = engine.start_turn(persona, [], PROMPT, use_cache=False)
        for _ in turn.stream():
            pass
        return turn.metrics.decode_tok_s, threads_in_use(engine.llm)[0]

    for llm in libraries.values():  # warm up: page cache, the first graph of each size
        library_tok_s(llm, tokens, 4, persona.sampling)
    chatterm_tok_s()

    results: dict[str, dict] = {}
    for scenario, hogs in (("idle", 0), ("one core busy", 1)):
        busy_seen = busy_fraction(0.5)
        procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
        try:
            time.sleep(1.5)  # OtherLoad needs two samples of the new load
            rates: dict[str, list[float]] = {"chatterm": [], **{name: [] for name in libraries}}
            threads_used: list[int] = []
            for _ in range(opts.runs):
                rate, threads = chatterm_tok_s()
                rates["chatterm"].append(rate)
                threads_used.append(threads)
                for name, llm in libraries.items():
                    rates[name].append(library_tok_s(llm, tokens, opts.max_tokens, persona.sampling))
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        medians = {name: statistics.median([r for r in v if r]) for name, v in rates.items()}
        results[scenario] = {"others_busy_before": busy_seen, "chatterm_decode_threads": threads_used,
                             "median_tok_s": medians, "runs_tok_s": rates}
        seen = f"{busy_seen:.0%}" if busy_seen is not None else "unknown"
        print(f"{scenario} (other processes busy {seen} before; chatterm decoded on "
              f"{'/'.join(map(str, threads_used))} threads):")
        for name, value in medians.items():
            print(f"  {name:11s} {value:7.1f} tok/s  ({value / medians['every core']:.2f}x every core)")

    idle, busy = results["idle"]["median_tok_s"], results["one core busy"]["median_tok_s"]
    ratios = {
        "idle_chatterm_over_every_core": idle["chatterm"] / idle["every core"],
        "busy_chatterm_over_every_core": busy["chatterm"] / busy["every core"],
        "busy_chatterm_over_best_fixed": busy["chatterm"] / max(busy["every core"], busy["one thread"]),
        "chatterm_idle_over_busy": idle["chatterm"] / busy["chatterm"],
        "idle_every_core_over_one_thread": idle["every core"] / idle["one thread"],
        "every_core_idle_over_busy": idle["every core"] / busy["every core"],
        "busy_every_core_over_one_thread": busy["every core"] / busy["one thread"],
    }
    ok = (ratios["idle_chatterm_over_every_core"] >= IDLE_TARGET
          and ratios["busy_chatterm_over_best_fixed"] >= BUSY_TARGET)
    print(f"idle: chatterm / every core {ratios['idle_chatterm_over_every_core']:.2f}x (target >= {IDLE_TARGET}x)")
    print(f"one core busy: chatterm / the faster fixed count {ratios['busy_chatterm_over_best_fixed']:.2f}x "
          f"(target >= {BUSY_TARGET}x)")
    print(f"idle / one core busy: chatterm {ratios['chatterm_idle_over_busy']:.2f}x slower, every core "
          f"{ratios['every_core_idle_over_busy']:.2f}x (bound: every core / one thread idle, "
          f"{ratios['idle_every_core_over_one_thread']:.2f}x)")
    calib_after, load_after = calibration_ms(), os.getloadavg()
    print(f"calibration after: {calib_after:.1f} ms; load average {load_after[0]:.2f} (the run's own included)")
    engine.close()
    for llm in libraries.values():
        llm.close()
    if opts.json:
        opts.json.write_text(json.dumps({
            "cpu": cpu_name(), "cpus": cpus, "physical_cores": physical_cores(),
            "calibration_ms": [calib_before, calib_after], "loadavg_1min": [load_before[0], load_after[0]],
            "runs": opts.runs, "max_tokens": opts.max_tokens,
            "prompt_tokens": len(tokens), "scenarios": results, "ratios": ratios,
            "targets": {"idle_chatterm_over_every_core": IDLE_TARGET, "busy_chatterm_over_best_fixed": BUSY_TARGET},
        }, indent=2) + "\n")
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
