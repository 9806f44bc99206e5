"""The GPU path on a real NVIDIA GPU: offload, persona KV restore, telemetry.

Skipped unless llama-cpp-python was built with GPU offload (CUDA) and torch
sees a CUDA device; run with `pytest -m gpu tests/core/system/test_gpu_real.py` on such a
machine (docs/gpu.md). Uses the real default model, greedy sampling.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")

if not (llama_cpp.llama_supports_gpu_offload() and torch.cuda.is_available()):
    pytest.skip(
        "needs a CUDA build of llama-cpp-python and a CUDA device", allow_module_level=True
    )

from chatterm.core.config import resources  # noqa: E402
from chatterm.core.system.gpu import energy_meter_or_none, gpu_status  # noqa: E402
from chatterm.core.workspace import Workspace  # noqa: E402

pytestmark = pytest.mark.gpu

LONG_PERSONA = "shop-support"


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    # conftest's isolated_dirs points the KV cache folder at tmp_path.
    return Workspace.load(resources.bundled_models_file(), tmp_path / "chatterm.db")


def greedy(persona, max_tokens=16):
    return replace(persona, sampling=replace(persona.sampling, temperature=0.0, max_tokens=max_tokens))


def run_turn(engine, persona, text="Can I return a tent I used once?"):
    turn = engine.start_turn(persona, [], text)
    for _ in turn.stream():
        pass
    assert turn.metrics.stop_reason in ("eos", "length"), turn.metrics.error
    return turn


def test_auto_offloads_every_layer_and_uses_gpu_memory(workspace):
    spec, _ = workspace.resolve(None, None)
    before = gpu_status()
    assert before is not None
    engine = workspace.make_engine(spec)
    engine.load()
    try:
        device = engine.device()
        assert device.n_layers == 30
        assert device.layers_offloaded == 30
        assert device.backend != "CPU"
        assert device.flash_attn is True  # "auto" turns it on when offloaded
        assert device.notes == []
        assert device.name == before.name
        after = gpu_status()
        # Weights (92 MB) and the 8,192-token f16 KV cache (~180 MB) are on the GPU.
        model_mb = spec.model_path().stat().st_size / 2**20
        assert after.memory_used_mb - before.memory_used_mb > 0.8 * model_mb
    finally:
        engine.close()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0"])
def test_restored_persona_state_on_gpu_gives_the_cold_reply(workspace, kv_type):
    spec, persona = workspace.resolve(None, LONG_PERSONA)
    spec = replace(spec, kv_type=kv_type)
    persona = greedy(persona)

    cold_engine = workspace.make_engine(spec)
    cold_engine.load()
    try:
        cold = run_turn(cold_engine, persona)
        cold_engine.wait_for_saves()
    finally:
        cold_engine.close()
    assert cold.metrics.cache_outcome == "cold"

    engine = workspace.make_engine(spec)
    engine.load()
    try:
        assert engine.device().layers_offloaded == 30
        restored = run_turn(engine, persona)
    finally:
        engine.close()
    m = restored.metrics
    assert m.cache_outcome == "restored", m.cache_detail
    assert m.restore_ms is not None and m.restore_ms > 0
    assert m.cached_tokens > 1000  # the long persona's prefix was not prefilled again
    assert m.prefilled_tokens < m.prompt_tokens - 1000
    assert restored.reply == cold.reply


def test_gpu_status_and_energy_of_a_turn(workspace):
    status = gpu_status()
    assert status is not None
    assert status.name
    assert 0 < status.memory_used_mb < status.memory_total_mb
    if status.power_w is None:
        pytest.skip("NVML power not readable (pynvml / nvidia-ml-py missing?)")
    assert status.power_w > 0
    meter = energy_meter_or_none(0.2, interval_s=0.02)
    assert meter is not None
    spec, persona = workspace.resolve(None, LONG_PERSONA)
    engine = workspace.make_engine(spec)
    engine.load()
    try:
        handle = meter.start()
        run_turn(engine, greedy(persona, max_tokens=64))
        wh = meter.stop(handle)
    finally:
        engine.close()
    assert wh is not None and wh > 0
