"""Everything a command needs, resolved once: catalog, personas, paths, engines.

The commands that chat (`launch`, `ask`, `bench`) and the TUI get their catalog,
personas, database path and engine from one `Workspace`, so `--models`, `--db`
and the environment overrides in `chatterm.core.config.paths` mean the same thing
everywhere. The commands that open the database (`launch`, `ask`, `sessions`,
`export`) take its path from `chatterm.cli.common.db_path`: the same path as
`db_path` here, once a database the user named is known to have a folder.
`sessions` and `export` read only the database, so a broken user models.toml
never stops a user from listing or exporting what is stored (an `--models`
FILE the user named is still read, and its errors are errors everywhere). Nothing here
loads a model or opens a file until asked; a local engine's model file starts
loading when the engine is made (`early_load`), and its `load` finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chatterm.core.config import paths
from chatterm.core.config.catalog import ModelCatalog, load_catalog
from chatterm.core.config.personas import Persona, PersonaSet, load_personas
from chatterm.core.config.schema import skipped
from chatterm.errors import ChattermError

if TYPE_CHECKING:
    from chatterm.core.cache.prompt_cache import PromptCache
    from chatterm.core.config.catalog import ModelSpec
    from chatterm.core.engine.interface import Engine


@dataclass
class Workspace:
    catalog: ModelCatalog
    personas: PersonaSet
    db_path: Path
    kv_dir: Path = field(default_factory=paths.kv_cache_dir)
    models_file: Path | None = None
    """`--models FILE` (None: the bundled catalog and the user's models.toml)."""
    _reload_told: set[str] = field(default_factory=set, repr=False)
    """The problems the last `reload_catalog` told."""

    @classmethod
    def load(cls, models_file: Path | None = None, db_path: Path | None = None) -> "Workspace":
        return cls(
            catalog=load_catalog(models_file),
            personas=load_personas(),
            db_path=db_path or paths.default_db_path(),
            models_file=models_file,
        )

    def reload_catalog(self) -> list[str]:
        """Read the catalog again (the TUI's models picker: models.toml may have
        been edited since the launch). It replaces this one only when it reads
        with no problem that was not there before: a file saved half-edited
        (not TOML, a bad value) would drop the user's models, the one running
        included, and the sessions on it could not be opened. Those new
        problems, one line each, each once (none: the new catalog is in use, or
        the problems were told at the reload before)."""
        before = set(self.catalog.errors)
        try:
            catalog = load_catalog(self.models_file)
        except ChattermError as exc:
            new = [f"{exc} (the models read before are kept)"]
        else:
            new = [f"{skipped(error)} (the models read before are kept until it is fixed)"
                   for error in catalog.errors if error not in before]
            if not new:
                self.catalog = catalog
        told, self._reload_told = self._reload_told, set(new)
        return [line for line in new if line not in told]  # each told once, not on every reload

    def reload_personas(self, keep: Persona | None = None) -> list[str]:
        """Read the persona files again (the TUI's persona picker: one may have
        been added or edited since the launch). `keep`, the persona in use,
        stays listed when its file is gone or broken now (its conversation
        goes on). The problems of files that do not read, each told once."""
        personas = load_personas()
        if keep is not None and keep.id not in personas.personas:
            personas.personas[keep.id] = keep
            personas.broken.pop(keep.id, None)
        before = set(self.personas.errors)  # told at the launch or a reload before
        self.personas = personas
        return [skipped(error) for error in personas.errors if error not in before]

    def reprice(self, engine: "Engine") -> bool:
        """Give the running `engine` the price its model has in the catalog as it
        reads now (`reload_catalog`): an edited [prices] table applies to the next
        turn, as it already does to reports. True when the price changed."""
        spec = self.catalog.models.get(engine.spec.id)
        profile = spec.price_profile if spec is not None else engine.spec.price_profile
        price = self.catalog.prices.get(profile)
        if price is None or price == engine.price:
            return False
        engine.price = price
        return True

    def resolve(self, model_id: str | None, persona_id: str | None) -> tuple["ModelSpec", Persona]:
        """The persona (default "assistant") and the model: explicit id, else the
        persona's preferred model, else the catalog default."""
        persona = self.personas.get(persona_id)
        spec = self.catalog.get(model_id or persona.model)
        return spec, persona

    def kv_cache(self) -> "PromptCache":
        from chatterm.core.cache.prompt_cache import PromptCache

        return PromptCache(
            self.kv_dir,
            disk_budget_bytes=self.catalog.kv_cache_budget_mb << 20,
            ram_budget_bytes=self.catalog.ram_cache_budget_mb << 20,
            session_scope=session_scope(self.db_path),
        )

    def make_engine(self, spec: "ModelSpec") -> "Engine":
        price = self.catalog.price(spec.price_profile)
        if spec.kind == "openai":
            from chatterm.core.engine.remote import RemoteEngine

            return RemoteEngine(spec, price)
        from chatterm.core.engine.local import early_load

        # The model file starts loading while the engine's import of
        # llama-cpp-python runs; the engine's load takes it (early_load).
        early = early_load.begin(spec)
        try:
            from chatterm.core.engine.local.engine import LocalEngine

            early.unhook()
            return LocalEngine(spec, price, kv_cache=self.kv_cache(), early=early)
        except BaseException:  # an interrupted import included
            early.close()
            raise


def session_scope(db_path: Path) -> str:
    """The prompt cache's name for the sessions of database `db_path`: session
    ids are unique within one database only, and every database shares the
    cache folder, so `--db other.db`'s session 1 is not the data folder's
    session 1 (deleting one removed the other's states). The data folder's own
    database keeps bare ids, so the states it cached before stay found; any
    other is its resolved path's digest."""
    import hashlib

    own = paths.data_db_path()
    try:
        resolved, own = db_path.resolve(), own.resolve()
    except (OSError, RuntimeError):  # a looping link: the path as given
        resolved = db_path.absolute()
    return "" if resolved == own else hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
