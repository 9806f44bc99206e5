"""Ollama's model store, read in place.

Contract:
- Roots: `$OLLAMA_MODELS`, else `~/.ollama/models`; and
  `/usr/share/ollama/.ollama/models` (the Linux service install, owned by
  the `ollama` user: read only where it exists and this user can read it).
- A model is a JSON manifest at `manifests/HOST/NAMESPACE/MODEL/TAG`. Its
  layer of media type `application/vnd.ollama.image.model` is the GGUF, the
  blob `blobs/sha256-HEX` (the digest with its colon written as a dash).
- Its id is `ollama:MODEL:TAG` for registry.ollama.ai's `library` namespace
  (what `ollama pull MODEL:TAG` fetches), `ollama:NAMESPACE/MODEL:TAG` for
  another namespace there, `ollama:HOST/NAMESPACE/MODEL:TAG` for another host.
  A name without a tag means `latest`.
- Unusable, with the reason: a manifest that is not JSON, one with no model
  layer, one whose weights are tensor layers (Ollama's newer format, not one
  GGUF), one whose blob is missing or not the size the manifest says.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator, Mapping

from chatterm.core.discovery.found import Found, StoreError, entries, is_file
from chatterm.core.system.small_file import read_small

MODEL_LAYER = "application/vnd.ollama.image.model"
TENSOR_LAYER = "application/vnd.ollama.image.tensor"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
SERVICE_ROOT = Path("/usr/share/ollama/.ollama/models")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def roots(env: Mapping[str, str], home: Path) -> list[Path]:
    own = Path(env["OLLAMA_MODELS"]).expanduser() if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
    return [own, SERVICE_ROOT]


def shared_roots() -> list[Path]:
    return [SERVICE_ROOT]


def model_id(host: str, namespace: str, model: str, tag: str) -> str:
    if host == DEFAULT_HOST:
        name = model if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}"
    else:
        name = f"{host}/{namespace}/{model}"
    return f"ollama:{name}:{tag}"


def manifest_parts(name: str) -> tuple[str, str, str, str] | None:
    """HOST, NAMESPACE, MODEL, TAG of a name after `ollama:`; None when malformed."""
    path, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    parts = path.split("/")
    if len(parts) > 3 or not tag or any(p in ("", ".", "..") for p in (*parts, tag)):
        return None
    if len(parts) == 1:
        return DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0], tag
    if len(parts) == 2:
        return DEFAULT_HOST, parts[0], parts[1], tag
    return parts[0], parts[1], parts[2], tag


MANIFEST_MAX_BYTES = 1 << 20
"""Ollama's manifests are a few hundred bytes; a bigger file is not one (read whole otherwise)."""


def read_manifest(root: Path, manifest: Path, mid: str) -> Found:
    def unusable(why: str) -> Found:
        return Found(mid, "ollama", manifest, problem=why)

    try:
        data = json.loads(read_small(manifest, MANIFEST_MAX_BYTES, "a manifest"))
    except OSError as exc:
        return unusable(f"cannot read the manifest: {exc.strerror or exc}")
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        return unusable("the manifest is not JSON")
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return unusable("the manifest has no layers list")
    layers = [layer for layer in layers if isinstance(layer, dict)]
    models = [layer for layer in layers if layer.get("mediaType") == MODEL_LAYER]
    if not models:
        tensors = sum(1 for layer in layers if layer.get("mediaType") == TENSOR_LAYER)
        if tensors:
            return unusable(f"not a single GGUF: its weights are {tensors} tensor layers (Ollama's newer format)")
        return unusable("the manifest has no model layer")
    if len(models) > 1:
        return unusable(f"the manifest has {len(models)} model layers; chatterm loads one GGUF")
    digest = models[0].get("digest")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        return unusable(f"the model layer's digest {str(digest)[:80]!r} is not sha256:HEX")
    blob = root / "blobs" / digest.replace(":", "-")
    if not os.path.lexists(blob):
        return unusable(f"its blob {blob.name} is missing")
    try:
        if not is_file(blob):
            return unusable(f"its blob {blob.name} is not a file")
    except StoreError as exc:
        return unusable(str(exc))
    size = models[0].get("size")
    actual = os.stat(blob).st_size
    if isinstance(size, int) and size != actual:
        return unusable(f"its blob {blob.name} is {actual:,} bytes; the manifest says {size:,}")
    return Found(mid, "ollama", manifest, (blob,))


def scan(root: Path) -> Iterator[Found]:
    """Every manifest under `root`/manifests (four levels: HOST/NAMESPACE/MODEL/TAG)."""
    top = root / "manifests"
    try:
        os.stat(top)
    except FileNotFoundError:
        return
    except OSError as exc:
        yield Found("ollama:*", "ollama", top, problem=f"cannot read folder {top}: {exc.strerror or exc}")
        return
    levels: list[tuple[Path, tuple[str, ...]]] = [(top, ())]
    while levels:
        folder, names = levels.pop()
        try:
            children = entries(folder)
        except StoreError as exc:
            yield Found(f"ollama:{'/'.join(names) or '*'}", "ollama", folder, problem=str(exc))
            continue
        for child in reversed(children):
            path = Path(child.path)
            if len(names) < 3:
                if child.is_dir():
                    levels.append((path, (*names, child.name)))
            elif child.is_file():
                yield read_manifest(root, path, model_id(*names, child.name))


def find(name: str, store_roots: list[Path]) -> list[Found]:
    """The model `ollama:name` names, in the first root that has it."""
    parts = manifest_parts(name)
    if parts is None:
        raise StoreError(f"ollama:{name} is not an Ollama model name (ollama:MODEL[:TAG])")
    for root in store_roots:
        manifest = root.joinpath("manifests", *parts)
        if os.path.isfile(manifest):  # False, not an error, in a root this user cannot read
            return [read_manifest(root, manifest, model_id(*parts))]
    return []
