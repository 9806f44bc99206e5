"""Decode and prefill threads follow the load of other processes (Threads over
OtherLoad), measured on the real machine with real busy processes and the real
default model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from chatterm.core.config.catalog import load_catalog
from chatterm.core.engine.local.model import Threads, open_model, threads_in_use
from chatterm.core.system.machine import OtherLoad, physical_cores

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or not os.path.exists("/proc/stat"),
    reason="needs Linux /proc/stat and at least 2 cores",
)

STORY = "Write a very long story about a dragon who learns to cook, with many chapters."
"""A prompt the default model answers at length (2,000 greedy tokens), so a reply outlasts the load sampler."""
SETTLE_S = 1.6  # OtherLoad keeps the larger of two 0.5 s windows


def settled(load: OtherLoad) -> float:
    time.sleep(SETTLE_S)
    assert load.cores is not None
    return load.cores


def quiet_load() -> OtherLoad:
    """A started load sampler; skips the test when other processes already keep
    half a core busy (a build or another test run beside it): what the test
    adds could not be told apart from theirs."""
    load = OtherLoad().start()
    before = settled(load)
    if before >= 0.5:
        load.stop()
        pytest.skip(f"other processes already keep {before:.1f} cores busy")
    return load


def still_quiet(load: OtherLoad) -> None:
    """Skips the test when other processes got busy while it measured (a
    build started beside it): a figure taken meanwhile counted their work."""
    after = settled(load)
    if after >= 0.5:
        pytest.skip(f"other processes kept {after:.1f} cores busy by the end of the test")


def test_other_processes_count_and_this_process_does_not():
    load = quiet_load()
    try:
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                pass

        spinner = threading.Thread(target=spin)
        spinner.start()  # a core kept busy by this process
        try:
            own_busy = settled(load)
        finally:
            stop.set()
            spinner.join()
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            other_busy = settled(load)
        finally:
            hog.kill()
            hog.wait()
        still_quiet(load)
    finally:
        load.stop()
    assert other_busy >= 0.6, (own_busy, other_busy)
    assert own_busy <= other_busy - 0.5, (own_busy, other_busy)


def test_work_at_a_lower_priority_is_not_counted():
    if os.getpriority(os.PRIO_PROCESS, 0) > 0:
        pytest.skip("this test process is niced itself")
    load = quiet_load()
    hog = subprocess.Popen([sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"])
    try:
        try:
            niced_busy = settled(load)
        finally:
            hog.kill()
            hog.wait()
        still_quiet(load)
    finally:
        load.stop()
    # It takes a whole idle core, yet yields to chatterm's threads whenever they run.
    assert niced_busy < 0.5


def test_decode_and_prefill_give_a_busy_core_back_and_a_fixed_count_stays():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.2)  # the busy loop is running
    try:
        adaptive = Threads()  # as the engine does: sampling starts before the load
        llm = open_model(load_catalog(None).get(None)).llm
        adaptive.bind(llm)
        most = threads_in_use(llm)
        assert most == (adaptive.cores, adaptive.cores)
        threads = adaptive.apply()  # the first prefill, right after the load (no full window yet)
        assert 1 <= threads <= adaptive.cores - 1 and threads == adaptive.batch
        assert 1 <= adaptive.decode <= adaptive.cores - 1
        assert threads_in_use(llm) == (adaptive.decode, adaptive.batch)  # what llama.cpp holds
    finally:
        hog.kill()
        hog.wait()
        adaptive.close()
    fixed = Threads(adapt_decode=False, adapt_batch=False)
    fixed.bind(llm)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(SETTLE_S)
        assert fixed.apply() == most[1] and fixed.decode == most[0]  # set in models.toml: never adapted
        assert threads_in_use(llm) == most
    finally:
        hog.kill()
        hog.wait()
        llm.close()


def greedy_engine(tmp_path, max_tokens: int):
    """The default model loaded (skips on one physical core: no thread to give
    back), and the default persona made greedy with `max_tokens`."""
    from dataclasses import replace

    from chatterm.core.engine.local.engine import LocalEngine
    from chatterm.core.workspace import Workspace

    if physical_cores() < 2:
        pytest.skip("one physical core: no thread to give back")
    ws = Workspace.load(db_path=tmp_path / "t.db")
    spec = ws.catalog.get(None)
    base = ws.personas.get(None)
    persona = replace(base, sampling=replace(base.sampling, temperature=0.0, max_tokens=max_tokens))
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=None)
    engine.load()
    return engine, persona


def test_a_reply_gives_a_core_back_when_another_process_starts_mid_reply(tmp_path):
    """The decode threads are looked at again while the reply streams, not only
    before its prefill: a busy process started mid-reply takes a core within
    the reply (real model, real busy loop)."""
    engine, persona = greedy_engine(tmp_path, max_tokens=2000)

    def reply_with_a_process_started_mid_reply() -> tuple[list[int], float]:
        """(decode threads after each token, seconds the busy loop ran within the reply)."""
        hog, started = None, 0.0
        seen: list[int] = []
        try:
            turn = engine.start_turn(persona, [], STORY, use_cache=False)
            for n, _ in enumerate(turn.stream()):
                seen.append(threads_in_use(engine.llm)[0])
                if n == 4:
                    if seen[0] < physical_cores():
                        turn.cancel()
                        pytest.skip("other processes already keep a core busy: nothing to take")
                    hog, started = subprocess.Popen([sys.executable, "-c", "while True: pass"]), time.monotonic()
                if hog is not None and seen[-1] < seen[0]:
                    turn.cancel()  # the reply gave the core back: seen enough
            return seen, time.monotonic() - started if hog is not None else 0.0
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()

    try:
        for _ in range(3):  # a reply the model ends before the load shows (about a second) proves nothing
            seen, ran = reply_with_a_process_started_mid_reply()
            if seen[-1] < seen[0] or ran >= 2 * SETTLE_S:
                break
            time.sleep(SETTLE_S)  # the load sampler forgets the busy loop before the next try
        else:
            pytest.skip(f"the model ended each reply {ran:.1f} s after the busy loop started: too soon to tell")
        assert seen[-1] == seen[0] - 1, f"decode threads during the reply: {seen[0]} -> {seen[-1]} ({ran:.1f} s)"
    finally:
        engine.close()


def test_a_long_prefill_takes_a_core_back_when_the_other_process_ends(tmp_path):
    """The prefill's thread count is looked at again between its batches: a
    prompt that starts while another process holds a core gets the core back
    before its prefill ends once that process is gone (real model, real busy loop)."""
    cores = physical_cores()
    engine, persona = greedy_engine(tmp_path, max_tokens=1)
    for _ in engine.start_turn(persona, [], "Hi", use_cache=False).stream():  # the persona's prefix first
        pass
    long_prompt = "The committee weighed cost, light and access for the new library. " * 100  # 3 batches
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    seen: list[tuple[int, int]] = []  # (tokens prefilled, prefill threads), while the prompt prefills
    stop = threading.Event()
    try:
        time.sleep(SETTLE_S)  # the load sampler has seen the busy loop
        turn = engine.start_turn(persona, [], long_prompt, use_cache=False)

        def watch() -> None:
            while not stop.is_set():
                progress = turn.prefill_progress
                done = progress.done if progress is not None else 0
                if done and hog.poll() is None:
                    hog.kill()  # the first batch ran beside it: now the core is free
                if progress is None or done < progress.total:
                    seen.append((done, threads_in_use(engine.llm)[1]))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for _ in turn.stream():
                pass
        finally:
            stop.set()
            watcher.join()
    finally:
        hog.kill()
        hog.wait()
        engine.close()
    beside = [done for done, threads in seen if threads == cores - 1]
    if not beside or beside[0] > 0:
        pytest.skip("the busy loop did not take a core from the prefill's first batch")
    back = [done for done, threads in seen if done > 0 and threads == cores]
    if not back:
        load = OtherLoad().start()
        try:
            busy = settled(load)
        finally:
            load.stop()
        if busy >= 0.5:  # not the busy loop: it is gone
            pytest.skip(f"other processes keep {busy:.1f} cores busy: no core came free")
    assert back, f"(tokens prefilled, prefill threads) while the prompt prefilled: {sorted(set(seen))}"
