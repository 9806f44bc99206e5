"""GPU offload decisions (chatterm.core.engine.local.offload): pure logic plus the real
default model loading through `load_with_fallback` on this machine's build."""

from __future__ import annotations

from dataclasses import replace

import llama_cpp
import pytest

from chatterm.core.config import resources
from chatterm.core.config.catalog import ModelSpec, load_catalog
from chatterm.core.engine.local.offload import (
    ALL_LAYERS,
    OffloadPlan,
    fallback_layers,
    gguf_block_count,
    kv_type_to_ggml,
    load_with_fallback,
    plan_offload,
)
from chatterm.errors import ChattermError

OOM = "Failed to create llama_context"  # what llama-cpp-python raises when CUDA runs out


def spec(**overrides) -> ModelSpec:
    base = ModelSpec(id="m", label="m", kind="local", price_profile="p", source="m.gguf")
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def default_spec() -> ModelSpec:
    # The bundled catalog only: a user's models.toml must not change these tests.
    return load_catalog(resources.bundled_models_file()).get(None)


# -- plan_offload -----------------------------------------------------------


def test_auto_offloads_every_layer_with_flash_attention_when_gpu_supported():
    plan = plan_offload(spec(), supports_gpu=True)
    assert plan.n_gpu_layers == ALL_LAYERS
    assert plan.offloaded
    assert plan.flash_attn is True
    assert (plan.type_k, plan.type_v) == (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F16)
    assert plan.notes == ()


def test_auto_runs_on_cpu_without_flash_attention_for_f16_when_no_gpu():
    plan = plan_offload(spec(), supports_gpu=False)
    assert plan.n_gpu_layers == 0
    assert not plan.offloaded
    assert plan.flash_attn is False
    assert plan.notes == ()  # a CPU-only install is normal, not worth a note


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_auto_flash_attention_is_on_for_quantized_kv_even_on_cpu(kv_type):
    plan = plan_offload(spec(kv_type=kv_type), supports_gpu=False)
    assert plan.flash_attn is True
    assert plan.type_k == plan.type_v == kv_type_to_ggml(kv_type)


def test_explicit_layers_are_kept_when_gpu_supported():
    plan = plan_offload(spec(n_gpu_layers=12), supports_gpu=True)
    assert plan.n_gpu_layers == 12
    assert plan.flash_attn is True
    assert plan.notes == ()


def test_explicit_layers_without_gpu_support_run_on_cpu_with_a_note():
    plan = plan_offload(spec(n_gpu_layers=12), supports_gpu=False)
    assert plan.n_gpu_layers == 0
    assert len(plan.notes) == 1
    assert "n_gpu_layers = 12 ignored" in plan.notes[0]
    assert "CPU" in plan.notes[0]


def test_explicit_zero_layers_with_gpu_stays_on_cpu_and_auto_flash_follows():
    plan = plan_offload(spec(n_gpu_layers=0), supports_gpu=True)
    assert plan.n_gpu_layers == 0
    assert plan.flash_attn is False
    assert plan.notes == ()


def test_explicit_flash_attention_wins_over_auto():
    assert plan_offload(spec(flash_attn=False), supports_gpu=True).flash_attn is False
    assert plan_offload(spec(flash_attn=True), supports_gpu=False).flash_attn is True


def test_quantized_kv_with_flash_attention_off_is_one_clear_error():
    with pytest.raises(ChattermError) as err:
        plan_offload(spec(id="big", kv_type="q4_0", flash_attn=False), supports_gpu=True)
    message = str(err.value)
    assert "'big'" in message and "q4_0" in message and "flash_attn" in message
    assert "\n" not in message


def test_kv_type_names_map_to_llama_cpp_ggml_types():
    assert kv_type_to_ggml("f16") == llama_cpp.GGML_TYPE_F16
    assert kv_type_to_ggml("q8_0") == llama_cpp.GGML_TYPE_Q8_0
    assert kv_type_to_ggml("q4_0") == llama_cpp.GGML_TYPE_Q4_0
    with pytest.raises(ChattermError, match="'fp8'"):
        kv_type_to_ggml("fp8")


def test_plan_types_and_layers_offloaded():
    plan = plan_offload(spec(kv_type="q8_0"), supports_gpu=True)
    assert (plan.n_gpu_layers, plan.flash_attn) == (-1, True)
    assert (plan.type_k, plan.type_v) == (llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q8_0)
    assert plan.layers_offloaded(30) == 30
    assert replace(plan, n_gpu_layers=15).layers_offloaded(30) == 15
    assert replace(plan, n_gpu_layers=99).layers_offloaded(30) == 30
    assert replace(plan, n_gpu_layers=0).layers_offloaded(30) == 0


# -- load_with_fallback with a fake loader -----------------------------------


class FakeLoader:
    """Fails like llama-cpp-python when more than `fits` layers go on the GPU."""

    def __init__(self, fits: int | None, cpu_fails: bool = False):
        self.fits = fits
        self.cpu_fails = cpu_fails
        self.calls: list[tuple[int, bool]] = []
        self.errors: list[Exception] = []

    def __call__(self, n_gpu_layers: int, flash_attn: bool) -> str:
        self.calls.append((n_gpu_layers, flash_attn))
        too_big = n_gpu_layers == ALL_LAYERS or (self.fits is not None and n_gpu_layers > self.fits)
        if (n_gpu_layers == 0 and self.cpu_fails) or (n_gpu_layers != 0 and (self.fits is None or too_big)):
            exc = ValueError(OOM)
            self.errors.append(exc)
            raise exc
        return f"model@{n_gpu_layers}"


def gpu_plan(**overrides) -> OffloadPlan:
    return plan_offload(spec(**overrides), supports_gpu=True)


def test_a_load_that_fits_is_not_retried():
    loader = FakeLoader(fits=1000)
    plan = replace(gpu_plan(), n_gpu_layers=30)
    model, used, notes = load_with_fallback(plan, loader, n_layers=30)
    assert model == "model@30"
    assert loader.calls == [(30, True)]
    assert used == plan
    assert notes == []


def test_out_of_memory_halves_the_layers_until_the_model_fits():
    loader = FakeLoader(fits=10)
    model, used, notes = load_with_fallback(gpu_plan(), loader, n_layers=30)
    assert loader.calls == [(-1, True), (15, True), (7, True)]
    assert model == "model@7"
    assert used.n_gpu_layers == 7
    assert notes == [
        "load failed with all 30 layers on the GPU (out of GPU memory?); retried with 15",
        "load failed with 15 layers on the GPU (out of GPU memory?); retried with 7",
    ]
    assert used.notes == tuple(notes)
    assert used.layers_offloaded(30) == 7


def test_out_of_memory_at_every_size_falls_back_to_the_cpu():
    loader = FakeLoader(fits=None)
    model, used, notes = load_with_fallback(gpu_plan(), loader, n_layers=30)
    assert [n for n, _ in loader.calls] == [-1, 15, 7, 3, 1, 0]
    assert model == "model@0"
    assert used.n_gpu_layers == 0 and not used.offloaded
    assert notes[-1] == "load failed with 1 layer on the GPU (out of GPU memory?); retried on the CPU"
    # flash_attn is part of what a persona KV state file must match: never changed.
    assert {fa for _, fa in loader.calls} == {True}


def test_unknown_layer_count_goes_straight_to_the_cpu():
    loader = FakeLoader(fits=None)
    _, used, notes = load_with_fallback(gpu_plan(), loader, n_layers=None)
    assert [n for n, _ in loader.calls] == [-1, 0]
    assert notes == ["load failed with all layers on the GPU (out of GPU memory?); retried on the CPU"]
    assert used.n_gpu_layers == 0


def test_explicit_layer_count_halves_from_itself():
    loader = FakeLoader(fits=2)
    plan = replace(gpu_plan(), n_gpu_layers=12)
    _, used, _ = load_with_fallback(plan, loader, n_layers=30)
    assert [n for n, _ in loader.calls] == [12, 6, 3, 1]
    assert used.n_gpu_layers == 1


def test_plan_notes_are_kept_before_the_fallback_notes():
    plan = replace(gpu_plan(), notes=("from the plan",))
    _, used, notes = load_with_fallback(plan, FakeLoader(fits=20), n_layers=30)
    assert used.notes == ("from the plan", *notes)
    assert len(notes) == 1


def test_a_failure_on_the_cpu_is_re_raised():
    loader = FakeLoader(fits=None, cpu_fails=True)
    with pytest.raises(ValueError) as err:
        load_with_fallback(gpu_plan(), loader, n_layers=4)
    assert [n for n, _ in loader.calls] == [-1, 2, 1, 0]
    assert err.value is loader.errors[-1]


def test_a_cpu_plan_loads_once_and_re_raises_its_failure():
    cpu = plan_offload(spec(), supports_gpu=False)
    loader = FakeLoader(fits=None, cpu_fails=True)
    with pytest.raises(ValueError):
        load_with_fallback(cpu, loader, n_layers=30)
    assert loader.calls == [(0, False)]


def test_errors_that_are_not_load_failures_are_not_retried():
    calls = []

    def loader(n_gpu_layers, flash_attn):
        calls.append(n_gpu_layers)
        raise ChattermError("model file changed while loading")

    with pytest.raises(ChattermError):
        load_with_fallback(gpu_plan(), loader, n_layers=30)
    assert calls == [-1]


def test_fallback_layer_sequence():
    assert fallback_layers(ALL_LAYERS, 32) == [16, 8, 4, 2, 1, 0]
    assert fallback_layers(ALL_LAYERS, None) == [0]
    assert fallback_layers(40, 30) == [15, 7, 3, 1, 0]  # more than the model has = all
    assert fallback_layers(1, 30) == [0]


# -- GGUF header -------------------------------------------------------------


def test_gguf_block_count_matches_what_llama_cpp_loads(default_spec, tmp_path):
    path = default_spec.model_path()
    assert gguf_block_count(path) == 30  # SmolLM2-135M has 30 layers
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"definitely not gguf")
    assert gguf_block_count(bad) is None
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:64])
    assert gguf_block_count(truncated) is None
    assert gguf_block_count(tmp_path / "missing.gguf") is None


# -- the real default model ----------------------------------------------------


def real_loader(spec_: ModelSpec, plan: OffloadPlan, calls: list):
    def try_load(n_gpu_layers: int, flash_attn: bool) -> llama_cpp.Llama:
        calls.append((n_gpu_layers, flash_attn))
        return llama_cpp.Llama(
            str(spec_.model_path()),
            n_ctx=512,
            n_gpu_layers=n_gpu_layers,
            flash_attn=flash_attn,
            type_k=plan.type_k,
            type_v=plan.type_v,
            verbose=False,
        )

    return try_load


def test_default_model_loads_through_the_plan_on_this_build(default_spec):
    supports_gpu = llama_cpp.llama_supports_gpu_offload()
    plan = plan_offload(default_spec, supports_gpu)
    n_layers = gguf_block_count(default_spec.model_path())
    calls: list = []
    llm, used, notes = load_with_fallback(plan, real_loader(default_spec, plan, calls), n_layers)
    try:
        assert notes == [] and calls == [(plan.n_gpu_layers, plan.flash_attn)]
        assert llama_cpp.llama_model_n_layer(llm.model) == n_layers
        if not supports_gpu:  # the CPU build this suite runs on in CI
            assert used.n_gpu_layers == 0 and used.flash_attn is False
            assert llm.model_params.n_gpu_layers == 0
        assert llm.context_params.type_k == llama_cpp.GGML_TYPE_F16
        # The loaded context works: a short prompt evaluates and yields logits.
        tokens = llm.tokenize(b"Hello", add_bos=True)
        llm.eval(tokens)
        assert llm.n_tokens == len(tokens)
    finally:
        llm.close()


def test_default_model_with_q8_0_kv_loads_with_flash_attention(default_spec):
    q8 = replace(default_spec, kv_type="q8_0")
    plan = plan_offload(q8, llama_cpp.llama_supports_gpu_offload())
    calls: list = []
    llm, _, notes = load_with_fallback(plan, real_loader(q8, plan, calls), 30)
    try:
        assert notes == []
        assert plan.flash_attn is True
        assert llm.context_params.type_k == llm.context_params.type_v == llama_cpp.GGML_TYPE_Q8_0
        assert llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    finally:
        llm.close()


def test_llama_cpp_really_refuses_quantized_kv_without_flash_attention(default_spec):
    # Why plan_offload rejects this combination up front: llama.cpp's own
    # failure is the opaque "Failed to create llama_context".
    with pytest.raises(ValueError, match="llama_context"):
        llama_cpp.Llama(
            str(default_spec.model_path()),
            n_ctx=512,
            flash_attn=False,
            type_k=llama_cpp.GGML_TYPE_Q8_0,
            type_v=llama_cpp.GGML_TYPE_Q8_0,
            verbose=False,
        )
