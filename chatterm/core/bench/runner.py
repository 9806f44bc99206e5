"""`chatterm bench`: prove the persona cache's gain on this machine, in one run.

For one persona (default: the long one) and one model it measures, each as the
median of N runs after a warm-up run:
- cold TTFT: empty context, the whole prompt prefilled;
- restored TTFT: empty context, persona prefix restored from its state file,
  only the user's tokens prefilled (the restore is inside the TTFT);
- memory TTFT: the persona prefix already in the context;
- restore ms, the time to read the same file, state bytes and file bytes;
- decode tokens/s (chatterm's own loop and llama.cpp's perf counters), and
  the decode and prefill thread counts each measured turn ran on (read back
  from llama.cpp: they follow the load of other processes);
- the same cold and warm TTFT for plain llama-cpp-python
  `create_chat_completion(stream=True)` on the same loaded model, as a baseline;
- with `resume=True`, the resume series (`_bench_resume`): the next turn of a
  six-turn conversation of 3,000+ tokens with the conversation in memory,
  restored from RAM, restored from disk, and with only the persona restored.
Figures are ratios within the run so they survive a noisy, shared machine.
The result records the CPU, the calibration (`chatterm.core.system.machine`) before
and after the run, and how busy other processes kept the CPU; `warnings` says
in words when the figures may not hold (a busy machine, a machine whose speed
changed during the run). A remote (openai) model gets the turn-level figures
only: no local state.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from chatterm import __version__
from chatterm.core.cache.prompt_cache import DISK, Candidate, Entry, Miss, PromptCache, Slot
from chatterm.core.config.personas import Persona
from chatterm.core.engine.interface import Engine
from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason
from chatterm.core.system.atomic import replace_output
from chatterm.core.system.machine import (
    BUSY_WARNING,
    busy_fraction,
    calibration_ms,
    cpu_name,
    physical_cores,
    usable_cpus,
)
from chatterm.errors import ChattermError

QUESTIONS = [
    "Hello! What can you help me with today?",
    "Can I return hiking boots I wore once?",
    "How long does shipping to Spain take?",
    "My parcel is late. What should I do?",
    "Do you offer gift cards?",
    "Is there a warranty on tents?",
    "Can I change my delivery address?",
    "What payment methods do you take?",
]

Report = Callable[[str], None]


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _question(i: int) -> str:
    return QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (#{i})")


def run_bench(
    engine: Engine,
    persona: Persona,
    runs: int = 5,
    max_tokens: int = 32,
    report: Report | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the benchmark on a loaded engine; returns a JSON-ready dict
    (`resume`: add the resume series, see `_bench_resume`)."""
    if runs < 1:
        raise ChattermError(f"--runs must be at least 1 (got {runs})")
    say = report or (lambda _msg: None)
    persona = replace(
        persona, sampling=replace(persona.sampling, temperature=0.0, max_tokens=max_tokens)
    )
    say("measuring how busy the machine is")
    busy = busy_fraction()
    calibration = calibration_ms()
    result: dict[str, Any] = {
        "chatterm_version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpu": cpu_name(),
                 "cores": os.cpu_count(), "usable_cpus": len(usable_cpus()), "physical_cores": physical_cores(),
                 "calibration_ms": calibration, "busy_before": busy},
        "model_id": engine.spec.id,
        "engine": engine.kind,
        "device": engine.device().__dict__,
        "persona_id": persona.id,
        "runs": runs,
        "max_tokens": max_tokens,
    }
    if engine.capabilities.kv_control:
        result.update(_bench_local(engine, persona, runs, say))
        if resume:
            result["resume"] = _bench_resume(engine, persona, runs, say)
    else:
        result.update(_bench_turns(engine, persona, runs, say))
    result["host"]["calibration_after_ms"] = after = calibration_ms()
    result["warnings"] = machine_warnings(busy, calibration, after)
    return result


CALIBRATION_DRIFT = 0.25
"""A calibration that moved more than this between the start and the end of
the run means the machine's speed changed while it was measured."""


def machine_warnings(busy: float | None, before_ms: float, after_ms: float) -> list[str]:
    """Why the figures may not hold on this machine, in words (none: nothing seen)."""
    warnings = []
    if busy is not None and busy > BUSY_WARNING:
        warnings.append(f"other processes used {busy:.0%} of the CPU before the run: "
                        "the ratios may not hold; run it again on a quieter machine")
    if before_ms > 0 and abs(after_ms - before_ms) / before_ms > CALIBRATION_DRIFT:
        warnings.append(f"the machine's speed changed during the run (calibration {before_ms:.1f} ms "
                        f"before, {after_ms:.1f} ms after): compare runs made under the same load")
    return warnings


def _turn(engine: Engine, persona: Persona, question: str, **options):
    turn = engine.start_turn(persona, [], question, **options)
    for _ in turn.stream():
        pass
    if turn.metrics.stop_reason == StopReason.ERROR:
        raise ChattermError(f"benchmark turn failed: {turn.metrics.error}")
    return turn


def _bench_turns(engine: Engine, persona: Persona, runs: int, say: Report) -> dict[str, Any]:
    say("warm-up turn")
    _turn(engine, persona, _question(0))
    ttfts, rates = [], []
    for i in range(runs):
        say(f"turn {i + 1}/{runs}")
        m = _turn(engine, persona, _question(i + 1)).metrics
        ttfts.append(m.ttft_ms)
        rates.append(m.decode_tok_s)
    return {"ttft_ms": _median(ttfts), "decode_tok_s": _median(rates), "ttft_runs_ms": ttfts}


def _disk_entry(cache: PromptCache, model_id: str, slot: Slot) -> Entry:
    """The slot's state on disk (a chain of KV blocks, or a state file)."""
    cache.flush()
    for entry in cache.entries(model_id):
        if entry.slot == slot and entry.tier == DISK and not entry.problem:
            return entry
    raise ChattermError(f"benchmark: no {slot.label} state on disk for model {model_id!r}")


def _read_ms(cache: PromptCache, entry: Entry) -> float:
    """Time to read the stored state's bytes (no llama.cpp): what a restore reads."""
    t0 = time.perf_counter()
    opened = cache.open(Candidate(entry, len(entry.tokens)))
    if isinstance(opened, Miss):
        raise ChattermError(f"benchmark: {opened.reason}")
    try:
        memoryview(opened.payload).cast("B").tobytes()
    finally:
        opened.close()
    return (time.perf_counter() - t0) * 1000.0


def _bench_local(engine, persona: Persona, runs: int, say: Report) -> dict[str, Any]:
    """Cold / restored / in-memory series on an engine with `kv_control`."""
    from chatterm.core.engine.local.model import threads_in_use

    cache = engine.kv_cache
    if cache is None:
        raise ChattermError("the benchmark needs the persona KV cache (no cache folder)")
    prefix = engine.prefix_tokens(persona)

    def cold():
        engine.reset_context()
        return _turn(engine, persona, q, use_cache=False)  # nothing restored, nothing saved

    def restored():
        engine.reset_context()
        cache.clear_ram()  # from disk, as after a relaunch
        return _turn(engine, persona, q)

    def memory():
        engine.reset_context(keep=persona)  # only the persona prefix stays
        return _turn(engine, persona, q)

    # Make sure a valid state file exists (and is fresh) before measuring restores.
    say(f"preparing {persona.id}'s state file ({len(prefix):,} prompt tokens)")
    engine.reset_context()
    _turn(engine, persona, _question(0))
    engine.wait_for_saves()
    if cache.write_error:
        raise ChattermError(f"cannot benchmark restores: {cache.write_error}")

    series: dict[str, list] = {"cold": [], "restored": [], "memory": []}
    perf_rates: list[float] = []
    restore_ms: list[float] = []
    threads: list[tuple[int, int]] = []
    for label, fn in (("cold", cold), ("restored", restored), ("memory", memory)):
        q = _question(0)
        say(f"{label}: warm-up")
        fn()
        for i in range(runs):
            q = _question(i + 1)
            say(f"{label}: run {i + 1}/{runs}")
            turn = fn()
            m = turn.metrics
            if m.cache_outcome != CacheOutcome(label):
                raise ChattermError(
                    f"benchmark expected a {label} turn, got {m.cache_outcome} ({m.cache_detail})"
                )
            series[label].append(m)
            threads.append(threads_in_use(engine.llm))  # set before this turn's prefill, kept for its decode
            if label == "restored" and m.restore_ms is not None:
                restore_ms.append(m.restore_ms)
            if turn.perf.get("n_eval") and turn.perf.get("t_eval_ms"):
                perf_rates.append(turn.perf["n_eval"] / (turn.perf["t_eval_ms"] / 1000.0))

    stored = _disk_entry(cache, engine.spec.id, Slot.persona(persona.id))
    file_bytes = stored.nbytes
    read_ms = [_read_ms(cache, stored) for _ in range(runs)]
    state_bytes = stored.info.get("state_size", file_bytes)

    baseline = _bench_baseline(engine, persona, runs, say)

    def med(label: str, attr: str):
        return _median([getattr(m, attr) for m in series[label]])

    cold_ttft, restored_ttft, memory_ttft = (
        med("cold", "ttft_ms"), med("restored", "ttft_ms"), med("memory", "ttft_ms"),
    )
    all_rates = [m.decode_tok_s for label in series for m in series[label]]
    return {
        "prefix_tokens": len(prefix),
        "prompt_tokens": series["cold"][0].prompt_tokens,
        "ttft_cold_ms": cold_ttft,
        "ttft_restored_ms": restored_ttft,
        "ttft_memory_ms": memory_ttft,
        "prefilled_tokens_restored": series["restored"][0].prefilled_tokens,
        "restore_ms": _median(restore_ms),
        "state_read_ms": _median(read_ms),
        "state_bytes": state_bytes,
        "state_file_bytes": file_bytes,
        "decode_tok_s": _median(all_rates),
        "decode_tok_s_llama_perf": _median(perf_rates),
        "threads": {"decode": [d for d, _ in threads], "prefill": [p for _, p in threads]},
        "baseline_ttft_cold_ms": baseline["cold"],
        "baseline_ttft_warm_ms": baseline["warm"],
        "ratios": {
            "restored_over_cold": _ratio(restored_ttft, cold_ttft),
            "restored_over_memory": _ratio(restored_ttft, memory_ttft),
            "file_over_state_bytes": _ratio(file_bytes, state_bytes),
            "restore_over_read": _ratio(_median(restore_ms), _median(read_ms)),
            "cold_speedup": _ratio(cold_ttft, restored_ttft),
            "baseline_cold_over_restored": _ratio(baseline["cold"], restored_ttft),
            "memory_over_baseline_warm": _ratio(memory_ttft, baseline["warm"]),
        },
        "runs_ms": {
            label: [m.ttft_ms for m in series[label]] for label in series
        },
    }


RESUME_SESSION = -1
"""The session slot the resume series uses (no stored session has a negative id)."""


def _long_history(engine, persona: Persona, min_tokens: int = 3000) -> list:
    """Six turns whose prompt holds at least `min_tokens` tokens beyond the persona."""
    from chatterm.core.engine.interface import ChatMessage

    prefix = len(engine.prefix_tokens(persona))
    history: list = []
    words = "Please note these order details for later reference: " + "item, size, colour, qty; " * 10
    repeat = 1
    while True:
        history = []
        for i in range(6):
            history += [ChatMessage("user", f"Order {i + 1}. " + words * repeat),
                        ChatMessage("assistant", f"Noted order {i + 1}.")]
        if len(engine.fit_prompt(persona, history, "ok", 32).tokens) - prefix >= min_tokens:
            return history
        repeat += 1


def _bench_resume(engine, persona: Persona, runs: int, say: Report) -> dict[str, Any]:
    """TTFT of the next turn of a six-turn, 3,000+ token conversation, four ways:
    conversation in memory (live context), restored from the RAM tier, restored
    from disk (as after a relaunch), and the old path: persona prefix restored
    from disk and the whole history prefilled."""
    cache = engine.kv_cache
    history = _long_history(engine, persona)
    say("resume: building the conversation")
    engine.reset_context()
    first = engine.start_turn(persona, history, _question(0))
    for _ in first.stream():
        pass
    engine.wait_for_saves()
    if cache.write_error:
        raise ChattermError(f"cannot benchmark resumes: {cache.write_error}")
    conversation_tokens = first.metrics.prompt_tokens

    def memory(q):
        # Every way leaves the conversation (and its last question) in the context.
        return _drain(engine.start_turn(persona, history, q))

    def ram(q):
        engine.reset_context()
        return _drain(engine.start_turn(persona, history, q))

    def disk(q):
        engine.reset_context()
        cache.clear_ram()
        return _drain(engine.start_turn(persona, history, q))

    def persona_only(q):
        engine.reset_context()
        cache.clear_ram()
        saved = _disk_entry(cache, engine.spec.id, cache.session_slot(RESUME_SESSION)).path
        assert saved is not None
        hidden = saved.with_name(saved.name + ".bench")
        saved.rename(hidden)  # today's path: no conversation state
        try:
            return _drain(engine.start_turn(persona, history, q))
        finally:
            hidden.rename(saved)

    ways = (("memory", memory, "live context"), ("ram", ram, "restored from RAM"),
            ("disk", disk, "restored from disk"), ("persona_only", persona_only, "persona prefix"))
    series: dict[str, list] = {label: [] for label, _, _ in ways}
    # Interleaved (each run measures every way in turn), so a machine that gets
    # busier or quieter during the run shifts all four series alike.
    for i in range(runs + 1):
        for label, fn, expect in ways:
            say(f"resume {label}: " + (f"run {i}/{runs}" if i else "warm-up"))
            if label == "memory":
                # The context holds the conversation again: keep it (the disk and
                # persona-only ways emptied the RAM tier), outside the timing.
                engine.keep_conversation(RESUME_SESSION)
                engine.wait_for_saves()
            m = fn(_question(i + 1))
            if expect not in m.cache_detail:
                raise ChattermError(f"resume benchmark expected {expect!r}, got {m.cache_detail!r}")
            if i:
                series[label].append(m)
    cache.clear(kind="session", key=cache.session_slot(RESUME_SESSION).key)
    ttft = {label: _median([m.ttft_ms for m in ms]) for label, ms in series.items()}
    return {
        "conversation_tokens": conversation_tokens,
        "history_tokens_beyond_persona": conversation_tokens - len(engine.prefix_tokens(persona)),
        "prefilled_tokens_disk": series["disk"][0].prefilled_tokens,
        "prefilled_tokens_persona_only": series["persona_only"][0].prefilled_tokens,
        "ttft_memory_ms": ttft["memory"],
        "ttft_ram_ms": ttft["ram"],
        "ttft_disk_ms": ttft["disk"],
        "ttft_persona_only_ms": ttft["persona_only"],
        "restore_ram_ms": _median([m.restore_ms for m in series["ram"]]),
        "restore_disk_ms": _median([m.restore_ms for m in series["disk"]]),
        "ratios": {
            "disk_over_persona_only": _ratio(ttft["disk"], ttft["persona_only"]),
            "disk_over_memory": _ratio(ttft["disk"], ttft["memory"]),
            "ram_over_memory": _ratio(ttft["ram"], ttft["memory"]),
        },
        "targets": {"disk_over_persona_only": 0.1, "disk_over_memory": 1.3, "ram_over_memory": 1.1},
        "runs_ms": {label: [m.ttft_ms for m in ms] for label, ms in series.items()},
    }


def _drain(turn):
    for _ in turn.stream():
        pass
    if turn.metrics.stop_reason == StopReason.ERROR:
        raise ChattermError(f"benchmark turn failed: {turn.metrics.error}")
    return turn.metrics


def _bench_baseline(engine, persona: Persona, runs: int, say: Report) -> dict[str, float | None]:
    """Plain llama-cpp-python: create_chat_completion(stream=True), time to first chunk."""
    s = persona.sampling

    def ttft(llm, question: str) -> float:
        t0 = time.perf_counter()
        stream = llm.create_chat_completion(
            messages=[
                {"role": "system", "content": persona.system_prompt},
                {"role": "user", "content": question},
            ],
            stream=True,
            temperature=0.0,
            max_tokens=s.max_tokens,
        )
        first = None
        for chunk in stream:
            delta = chunk["choices"][0].get("delta", {})
            if first is None and delta.get("content"):
                first = (time.perf_counter() - t0) * 1000.0
        return first if first is not None else (time.perf_counter() - t0) * 1000.0

    out: dict[str, list[float]] = {"cold": [], "warm": []}
    with engine.exclusive() as llm:
        for label in ("cold", "warm"):
            say(f"baseline {label}: warm-up")
            if label == "cold":
                llm.reset()  # no prefix to match: the whole prompt is evaluated
            ttft(llm, _question(0))
            for i in range(runs):
                say(f"baseline {label}: run {i + 1}/{runs}")
                if label == "cold":
                    llm.reset()
                out[label].append(ttft(llm, _question(i + 1)))
    return {k: _median(v) for k, v in out.items()}


def write_json(result: dict[str, Any], path: Path, database: Path | None = None) -> None:
    """The results as JSON at `path`, a file the user named (`replace_output`:
    never over the session `database`, a FIFO streamed to, a link followed)."""
    replace_output(path, [(json.dumps(result, indent=2) + "\n").encode()], database)
