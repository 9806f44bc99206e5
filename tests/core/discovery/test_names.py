"""`--model` names and models.toml `source`s that point into a store: each
resolves to the file llama.cpp loads, or fails with one line saying why."""

from __future__ import annotations

import pytest

from chatterm.core.config.catalog import load_catalog
from chatterm.core.discovery.names import is_model_name, resolve
from chatterm.errors import ChattermError
from tests.core.discovery.layouts import SMOL_NAME


@pytest.fixture
def stores(layout, monkeypatch, isolated_dirs):
    layout.use(monkeypatch, isolated_dirs["CHATTERM_CACHE_DIR"])
    return layout


def test_every_listed_id_resolves_to_its_file(stores):
    for mid, first_file in stores.usable.items():
        assert resolve(mid).files[0] == first_file, mid


def test_short_forms_resolve(stores):
    assert resolve(f"lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/{SMOL_NAME}").files[0].name == SMOL_NAME
    split = resolve("hf:chatterm/split-test:smol-00001-of-00002.gguf")
    assert [f.name for f in split.files] == [f.name for f in stores.split]
    path = resolve(str(stores.split[0]))  # a path to shard 1 brings its other shards
    assert path.files == tuple(stores.split)


@pytest.mark.parametrize("name, words", [
    ("ollama:smollm2", "not found in Ollama"),  # no tag is :latest, which this store lacks
    ("ollama:../../etc/passwd", "is not an Ollama model name"),
    ("lmstudio:lmstudio-community/mixed", "names 2 models; choose one: lmstudio:lmstudio-community/mixed/"),
    ("lmstudio:just-one-part", "is not an LM Studio model name"),
    ("hf:chatterm/broken:loop.gguf", "loop.gguf is a symlink loop"),
    ("ollama:new-format", "not a single GGUF"),
    ("hf:nobody/nothing", "not found in Hugging Face cache"),
])
def test_bad_names_fail_with_one_line(stores, name, words):
    if name == "ollama:new-format":
        name += ":latest"
    with pytest.raises(ChattermError) as err:
        resolve(name)
    message = str(err.value)
    assert words in message and "\n" not in message and repr(name) in message


def test_is_model_name_tells_store_names_and_paths_from_catalog_ids():
    assert all(map(is_model_name, ["ollama:x", "lmstudio:a/b", "hf:a/b", "./x.gguf", "~/m.gguf", "x.GGUF"]))
    assert not any(map(is_model_name, ["smollm2-135m", "gpt-4.1"]))


def test_catalog_makes_a_spec_for_a_store_name(stores):
    catalog = load_catalog()
    spec = catalog.get("ollama:smollm2:135m")
    assert (spec.id, spec.kind, spec.source) == ("ollama:smollm2:135m", "local", "ollama:smollm2:135m")
    assert spec.model_path() == stores.usable["ollama:smollm2:135m"]
    assert spec.n_ctx == 8192  # the trained context: it fits beside the weights here
    assert spec.price_profile == catalog.get(None).price_profile
    with pytest.raises(ChattermError, match="unknown model 'nope'"):
        catalog.get("nope")


def test_models_toml_source_and_folders(stores, tmp_path):
    models = tmp_path / "models.toml"
    models.write_text(
        '[defaults]\nmodel = "mine"\nmodel_folders = ["my-models", "/abs/elsewhere"]\n'
        '[models.mine]\nsource = "hf:chatterm/split-test"\nn_ctx = 1024\nprice_profile = "p"\n'
        '[prices.p]\ninput = 1.0\noutput = 2.0\nas_of = "2025-01-01"\n'
    )
    catalog = load_catalog(models)
    spec = catalog.get("mine")
    assert spec.n_ctx == 1024  # models.toml's value, not the default
    assert spec.model_path() == stores.usable["hf:chatterm/split-test"]
    assert catalog.defaults.model_folders == (str(tmp_path / "my-models"), "/abs/elsewhere")
    models.write_text('[defaults]\nmodel_folders = "not-a-list"\n[models.m]\nsource = "x.gguf"\nprice_profile = "p"\n'
                      '[prices.p]\ninput = 1.0\noutput = 2.0\nas_of = "2025-01-01"\n')
    bad = load_catalog(models)
    assert any("model_folders" in e and "must be a list of folder paths" in e for e in bad.errors)
