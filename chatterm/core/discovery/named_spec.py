"""A `ModelSpec` for a store name or a GGUF path given as `--model`.

Contract:
- `spec_for_name(name, catalog)`: a local model with that name as id, label
  and `source`; its `n_ctx` is the default this machine affords (see
  `fit.default_n_ctx`; the smallest context when it does not fit, so the
  load says why); its price profile is `[defaults] price_profile`, else the
  default model's (the API-equivalent cost needs one); every other setting is ModelSpec's default.
  A models.toml entry whose `source` is such a name sets its own values.
- `model_path(source)`: the file llama.cpp loads for such a source (shard 1
  of a split: llama.cpp finds the others).
- Either raises a one-line `ChattermError` when the name cannot be used.
"""

from __future__ import annotations

from pathlib import Path

from chatterm.core.config.catalog import ModelCatalog, ModelSpec
from chatterm.core.discovery.facts_cache import FactsCache
from chatterm.core.discovery.fit import MIN_CTX, default_n_ctx, machine_memory
from chatterm.core.discovery.gguf_facts import Unusable
from chatterm.core.discovery.names import resolve
from chatterm.errors import ChattermError

SPEC_MIN_CTX = 256
"""ModelSpec's smallest n_ctx."""


def model_path(source: str) -> Path:
    return resolve(source).files[0]


def spec_for_name(name: str, catalog: ModelCatalog) -> ModelSpec:
    found = resolve(name)
    cache = FactsCache()
    try:
        facts = cache.facts(found.files)
    except Unusable as exc:
        raise ChattermError(f"model {name!r}: {exc}") from None
    finally:
        cache.save()
    n_ctx = default_n_ctx(facts, machine_memory()) or min(facts.context_length or MIN_CTX, MIN_CTX)
    profile = _price_profile(catalog)
    return ModelSpec(id=name, label=name, source=name, n_ctx=max(n_ctx, SPEC_MIN_CTX), price_profile=profile)


def _price_profile(catalog: ModelCatalog) -> str:
    if catalog.defaults.price_profile in catalog.prices:
        return catalog.defaults.price_profile
    default = catalog.models.get(catalog.default_model)
    if default is not None:
        return default.price_profile
    if catalog.prices:
        return next(iter(catalog.prices))
    raise ChattermError("no price profile in models.toml for a model named by its store ([prices.ID])")
