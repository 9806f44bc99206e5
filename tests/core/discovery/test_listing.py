"""Discovery over real store layouts (Ollama, LM Studio, HF cache, a folder)
around the real default model and Gemma 3: every model listed once with its
header facts, every damaged entry listed with its reason, nothing written."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from chatterm.core.discovery.facts_cache import FactsCache
from chatterm.core.discovery.fit import BUDGET_SHARE, Memory
from chatterm.core.discovery.listing import list_models
from chatterm.core.discovery.row_text import fmt_bytes
from tests.core.discovery.layouts import tree

PLENTY = Memory("RAM", 64 << 30)


def rows_of(layout, cache_file: Path | None = None, memory: Memory = PLENTY):
    rows = list_models([layout.folder], env={}, home=layout.home,
                       cache=FactsCache(cache_file or layout.facts_file), memory=memory)
    return {row.id: row for row in rows}


def test_every_store_model_is_listed_with_the_file_it_loads(layout):
    rows = rows_of(layout)
    for mid, first_file in layout.usable.items():
        assert mid in rows, mid
        assert rows[mid].usable, (mid, rows[mid].problem)
        assert rows[mid].found.files[0] == first_file
    assert set(rows) == set(layout.usable) | set(layout.unusable)


def test_each_damaged_entry_is_a_row_with_its_reason(layout):
    rows = rows_of(layout)
    for mid, reason in layout.unusable.items():
        assert not rows[mid].usable
        assert reason in rows[mid].problem, (mid, rows[mid].problem)
        assert rows[mid].problem.isprintable()


def test_an_id_is_one_row_listed_again_for_the_same_file_and_shadowed_for_another(tmp_path):
    """Folders that overlap list a file twice; LM Studio's two homes may hold
    one repo each (copies): a second row of one id broke the picker's table
    (DuplicateKey), and `--model ID` loads only the first anyway."""
    from tests.core.discovery.layouts import link, smol_path

    home, folder = tmp_path / "home", tmp_path / "m"
    repo = Path("HuggingFaceTB") / "SmolLM2"
    first = link(smol_path(), home / ".cache" / "lm-studio" / "models" / repo / "smol.gguf")
    second = home / ".lmstudio" / "models" / repo / "smol.gguf"
    second.parent.mkdir(parents=True)
    second.write_bytes(smol_path().read_bytes()[: 1 << 20])
    link(smol_path(), folder / "sub" / "own.gguf")
    rows = list_models([folder, folder / "sub", folder], env={}, home=home,
                       cache=FactsCache(tmp_path / "facts.json"), memory=PLENTY)
    ids = [row.id for row in rows]
    own = str(folder / "sub" / "own.gguf")
    assert sorted(ids) == sorted([own, "lmstudio:HuggingFaceTB/SmolLM2", "lmstudio:HuggingFaceTB/SmolLM2"]), ids
    kept, shadowed = [row for row in rows if row.id == "lmstudio:HuggingFaceTB/SmolLM2"]
    assert kept.usable and kept.found.files == (first,)
    assert shadowed.problem == (f"{first} has the same id, listed first; "
                                "--model lmstudio:HuggingFaceTB/SmolLM2 loads that one")


def test_unusable_rows_of_one_id_keep_their_own_reasons():
    """A folder with two unreadable subfolders is two rows of its id, each with its reason."""
    from chatterm.core.discovery.found import Found
    from chatterm.core.discovery.listing import unique

    rows = [Found("/m", "folder", Path("/m"), problem=f"cannot read folder /m/{n}") for n in "ab"]
    assert [f.problem for f in unique(rows)] == ["cannot read folder /m/a", "cannot read folder /m/b"]


def test_fifos_deep_json_and_a_huge_manifest_in_the_stores_are_reasons_not_hangs(tmp_path):
    """A FIFO as LM Studio's settings or home pointer or as a Hugging Face ref
    hung `chatterm models` (and the TUI's exit); JSON nested 100,000 deep was a
    RecursionError; a 3 GiB manifest was read whole."""
    from tests.core.system.test_small_file import returns_soon

    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    os.mkfifo(home / ".lmstudio" / "settings.json")
    os.mkfifo(home / ".lmstudio-home-pointer")
    refs = home / ".cache" / "huggingface" / "hub" / "models--o--f" / "refs"
    refs.mkdir(parents=True)
    os.mkfifo(refs / "main")
    library = home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library"
    (library / "deep").mkdir(parents=True)
    (library / "deep" / "latest").write_text("[" * 100_000 + "]" * 100_000)
    (library / "huge").mkdir()
    with open(library / "huge" / "latest", "wb") as fh:
        fh.truncate(3 << 30)
    (library / "fifo").mkdir()
    os.mkfifo(library / "fifo" / "latest")
    rows = returns_soon(lambda: list_models([], env={}, home=home, cache=FactsCache(tmp_path / "facts.json"),
                                            memory=PLENTY))
    problems = {row.id: row.problem for row in rows}
    assert problems["ollama:deep:latest"] == "the manifest is not JSON"
    assert problems["ollama:huge:latest"] == ("cannot read the manifest: 3,221,225,472 bytes, "
                                              "more than the 1 MiB a manifest is")


def test_a_path_that_is_not_utf8_is_listed_as_unusable_and_written_as_json(tmp_path):
    """Listed as usable, it failed when chosen (llama-cpp-python encodes the
    path as UTF-8), and `models --json` raised TypeError on it."""
    import json

    from chatterm.core.report.escape import json_document
    from tests.core.discovery.layouts import link, smol_path

    folder = tmp_path / "m"
    odd = Path(os.fsdecode(bytes(folder) + b"/\xff\xfe"))
    link(smol_path(), odd / "smol.gguf")
    (row,) = list_models([folder], env={}, home=tmp_path, cache=FactsCache(tmp_path / "facts.json"), memory=PLENTY)
    assert not row.usable and row.problem.startswith("its path is not UTF-8")
    written = json.loads(json_document(row.to_dict()))
    assert written["files"] == [f"{folder}/\\xff\\xfe/smol.gguf"]


def test_a_newline_in_a_folder_name_stays_in_its_row(tmp_path):
    """`chatterm models` piped is one line a model, for grep and awk: a folder
    named with a newline split its row in two."""
    from chatterm.core.discovery.row_text import cells
    from tests.core.discovery.layouts import link, smol_path

    link(smol_path(), tmp_path / "m" / "two\nlines" / "smol.gguf")
    (row,) = list_models([tmp_path / "m"], env={}, home=tmp_path, cache=FactsCache(tmp_path / "f.json"),
                         memory=PLENTY)
    assert all("\n" not in text for text in cells(row)) and "two↵lines" in cells(row)[0]


def test_projector_files_are_not_chat_models(layout):
    rows = rows_of(layout)
    assert not [mid for mid in rows if "mmproj" in mid.lower()]
    assert not any("mmproj" in str(f) for row in rows.values() for f in row.found.files)


def test_header_facts_of_the_two_real_models(layout):
    rows = rows_of(layout)
    smol = rows["ollama:smollm2:135m"].facts
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims (its published config).
    assert (smol.architecture, smol.quantization, smol.context_length) == ("llama", "Q4_1", 8192)
    assert smol.kv_bytes_per_token == 30 * 3 * (64 + 64) * 2
    assert 134e6 < smol.parameters < 136e6 and smol.has_chat_template
    assert smol.file_size == layout.smol.stat().st_size
    gemma = rows["ollama:gemma3:270m"].facts
    # Gemma 3 270M: 18 layers, 1 KV head of 256 dims; its GGUF has no chat template.
    assert (gemma.architecture, gemma.quantization, gemma.context_length) == ("gemma3", "Q4_K_M", 32768)
    assert gemma.kv_bytes_per_token == 18 * 1 * (256 + 256) * 2
    assert 260e6 < gemma.parameters < 280e6 and not gemma.has_chat_template


def test_a_split_gguf_is_one_model_of_all_its_shards(layout):
    rows = rows_of(layout)
    split = rows["hf:chatterm/split-test"]
    assert [f.name for f in split.found.files] == ["smol-00001-of-00002.gguf", "smol-00002-of-00002.gguf"]
    single = rows["ollama:smollm2:135m"].facts
    assert split.facts.parameters == single.parameters
    assert split.facts.file_size == sum(f.stat().st_size for f in layout.split)
    assert not [mid for mid in rows if "00002-of" in mid]


def test_fit_and_default_context_follow_the_memory_given(layout):
    rows = rows_of(layout)
    assert rows["ollama:gemma3:270m"].n_ctx == 32768 and rows["ollama:gemma3:270m"].fits
    gemma = rows["ollama:gemma3:270m"].facts
    # Room for the weights and 4,000 tokens of KV cache: 3,840 (in steps of 256).
    tight = Memory("GPU", int((gemma.file_size + 4000 * gemma.kv_bytes_per_token) / 0.9) + 1)
    squeezed = rows_of(layout, memory=tight)["ollama:gemma3:270m"]
    assert squeezed.n_ctx == 3840 and squeezed.fits
    too_small = rows_of(layout, memory=Memory("GPU", 100 << 20))["ollama:gemma3:270m"]
    assert too_small.n_ctx is None and not too_small.fits and too_small.usable
    assert too_small.to_dict()["fits"] is False


@pytest.mark.parametrize("trained", [300, 514, 1000, 2048, 8192])
def test_a_trained_context_under_2048_off_the_256_steps_fits_whole(trained):
    """Cut to a step first, 514 became 512, below the trained 514 it was then
    held to: "no" for a model that fits many times over."""
    from chatterm.core.discovery.fit import default_n_ctx
    from chatterm.core.discovery.gguf_facts import GgufFacts

    facts = GgufFacts("bert", 100, "F16", 1 << 20, trained, False, 18432)
    assert default_n_ctx(facts, PLENTY) == trained


def test_fit_is_judged_on_ram_where_layers_cannot_go_to_the_gpu(tmp_path, monkeypatch, layout):
    """A GPU seen by nvidia-smi beside a CPU-only llama-cpp-python (the plain
    wheel), or an entry with n_gpu_layers = 0: its weights load into RAM."""
    from chatterm.core.discovery import fit
    from chatterm.core.discovery.found import Found
    from chatterm.core.discovery.listing import CONFIGURED, describe

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 81000\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(fit, "_nvml_free", lambda: None)
    monkeypatch.setattr(fit, "_ram_available", lambda: 200 << 20)
    monkeypatch.setattr(fit, "_llama_offloads", lambda: False)
    assert fit.machine_memory() == Memory("RAM", 200 << 20)
    monkeypatch.setattr(fit, "_llama_offloads", lambda: True)
    gpu = fit.machine_memory()
    assert gpu == Memory("GPU", 81000 << 20)
    entry = Found("e", CONFIGURED, layout.smol, (layout.smol,), n_ctx=8192)
    assert describe(entry, FactsCache(layout.facts_file), gpu).fits  # 274 MiB against 79 GiB
    assert not describe(replace(entry, on_cpu=True), FactsCache(layout.facts_file), gpu).fits  # against 200 MiB


def test_a_models_toml_entry_naming_shard_1_is_the_whole_split(layout, tmp_path):
    """Listed with shard 1 alone: 75.2M params and 58 MiB for the 135M, 94 MiB model."""
    from chatterm.core.config.catalog import load_catalog
    from chatterm.core.discovery.listing import configured

    models = tmp_path / "models.toml"
    models.write_text(f'[models.split]\nsource = "{layout.split[0]}"\nprice_profile = "local"\n'
                      '[prices.local]\ninput = 0\noutput = 0\n')
    (split,) = [f for f in configured(load_catalog(models)) if f.id == "split"]
    assert split.files == tuple(layout.split)
    whole = rows_of(layout)[str(layout.folder / "nested" / layout.smol.name)]
    row = list_models([], env={}, home=tmp_path, cache=FactsCache(layout.facts_file), memory=PLENTY,
                      configured=[split])[0]
    assert (row.facts.parameters, row.facts.file_size) == (whole.facts.parameters, sum(
        p.stat().st_size for p in layout.split))


def test_a_models_toml_entry_is_judged_at_its_own_context_and_kv_type(layout):
    from chatterm.core.discovery.found import Found
    from chatterm.core.discovery.listing import CONFIGURED, describe

    cache = FactsCache(layout.facts_file)
    entry = Found("e", CONFIGURED, layout.smol, (layout.smol,), n_ctx=4096)
    f16 = describe(entry, cache, PLENTY)
    q8 = describe(replace(entry, kv_type="q8_0"), cache, PLENTY)
    q4 = describe(replace(entry, kv_type="q4_0"), cache, PLENTY)
    header = f16.facts.kv_bytes_per_token
    # ggml blocks of 32 elements: f16 64 bytes, q8_0 34, q4_0 18.
    assert (f16.kv_bytes_per_token, q8.kv_bytes_per_token, q4.kv_bytes_per_token) == (
        header, round(header * 34 / 64), round(header * 18 / 64))
    assert f16.n_ctx == q8.n_ctx == 4096  # the entry's context, not the trained 8,192
    assert f16.needed_bytes == f16.facts.file_size + 4096 * header
    assert q4.needed_bytes < q8.needed_bytes < f16.needed_bytes
    # Memory for the weights and the q8_0 cache only: the f16 entry does not fit.
    between = Memory("RAM", int(q8.needed_bytes / BUDGET_SHARE) + 1)
    assert describe(replace(entry, kv_type="q8_0"), cache, between).fits
    assert describe(entry, cache, between).n_ctx is None


def test_listing_writes_nothing_in_the_stores(layout):
    # The layout fixture's first listing read every header (and the cache was empty).
    rows_of(layout)
    assert tree(layout.home) == layout.tree_before
    assert layout.facts_file.exists()


def test_json_rows_have_one_shape(layout):
    dicts = [row.to_dict() for row in rows_of(layout).values()]
    assert len({tuple(d) for d in dicts}) == 1
    bad = next(d for d in dicts if d["id"] == "ollama:missing-blob:latest")
    assert bad["usable"] is False and bad["architecture"] is None and bad["files"] == []


def test_ollamas_service_folder_is_scanned_only_where_it_exists(layout, monkeypatch, tmp_path):
    from chatterm.core.discovery import ollama
    from chatterm.core.discovery.listing import store_roots

    monkeypatch.setattr(ollama, "SERVICE_ROOT", tmp_path / "usr-share-ollama" / "models")
    states = {str(r.path): r.state for r in store_roots(env={}, home=layout.home)}
    assert states[str(ollama.SERVICE_ROOT)] == "not there"
    assert states[str(layout.home / ".ollama" / "models")] == "scanned"
    # The service folder holding the same store (a symlink to it) is not listed twice.
    ollama.SERVICE_ROOT.parent.mkdir()
    ollama.SERVICE_ROOT.symlink_to(layout.home / ".ollama" / "models")
    roots = store_roots(env={}, home=layout.home)
    assert [r.state for r in roots if r.path == ollama.SERVICE_ROOT] == [
        f"the same folder as {layout.home / '.ollama' / 'models'}"]
    rows = rows_of(layout)
    assert len([mid for mid in rows if mid == "ollama:smollm2:135m"]) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_an_unreadable_service_folder_is_skipped_not_listed(layout, monkeypatch, tmp_path):
    from chatterm.core.discovery import ollama
    from chatterm.core.discovery.listing import store_roots

    service = tmp_path / "ollama-home"
    (service / "models" / "manifests").mkdir(parents=True)
    service.chmod(0)  # as the service install leaves it to other users
    monkeypatch.setattr(ollama, "SERVICE_ROOT", service / "models")
    try:
        (root,) = [r for r in store_roots(env={}, home=layout.home) if r.path == ollama.SERVICE_ROOT]
        assert root.state.startswith("skipped: this user cannot read it")
        assert not [r for r in rows_of(layout).values() if str(service) in str(r.found.location)]
    finally:
        service.chmod(0o700)


@pytest.mark.parametrize(("n", "text"), [
    (None, "?"), (512, "512 B"), (1023 << 10, "1023 KiB"), (1000 << 20, "1000 MiB"),
    (int(1.8 * (1 << 20)), "1.8 MiB"), (3 << 30, "3 GiB"), (123_456_789_012, "115 GiB"),
])
def test_sizes_are_binary_units_named_as_such_never_in_e_notation(n, text):
    assert fmt_bytes(n) == text
