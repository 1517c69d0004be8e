"""The user cache, and the one way River builds anything into it.

Root: RIVER_CACHE, else $XDG_CACHE_HOME/river, else ~/.cache/river. Every entry (a converted
GGUF, an ONNX export, quantized stand-in weights) is a folder `KIND/NAME`, NAME ending in a
digest of its inputs: the content key of the model it was made from (`content_key`: no path,
no modification time, so a copy of a model or a rebuilt conversion finds the same entries) and
the settings. `cached` builds it under an exclusive lock (`.locks/KIND-NAME.lock`: a second
process waits, then finds it built), in a temporary sibling `.partial-NAME-PID` that is renamed
into place with a manifest written last: the cache format, the inputs' digest, the source it
was made from, each file's size and SHA-256, and a seal (the SHA-256 of all that).

Before an entry is used, its manifest's seal and every file's size are checked (milliseconds);
every file's SHA-256 is read only by `river cache --verify` and when a killed run's partial
build shows the last build was unclean. Anything that does not match is reported in one line,
removed and built again, never loaded. An entry whose source is gone or has changed is an
orphan: nothing current refers to it, and `river cache --prune` removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import attrs

from river_core.settings.errors import ModelError
from river_core.settings.user_cache import cache_root  # noqa: F401 (the root, for river_models' users)

FORMAT = 2   # the layout of an entry and its manifest: entries of another format are rebuilt
MANIFEST = "river-cache.json"
PARTIAL = ".partial-"


def digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


SAMPLE = 1 << 20   # bytes hashed at each end of a file for its content key


def content_key(path: Path) -> str:
    """A model file or folder by content: each file's size and the SHA-256 of its first and
    last MiB (weights differ there between models of one shape), and a folder's files' names
    in it. Milliseconds for any size; no path, file name or modification time, so copies,
    renamed ones and rebuilds key alike."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file()
                                                 and f.name != MANIFEST)
    parts = []
    for f in files:
        size = f.stat().st_size
        h = hashlib.sha256()
        with f.open("rb") as data:
            h.update(data.read(SAMPLE))
            if size > 2 * SAMPLE:
                data.seek(size - SAMPLE)
                h.update(data.read(SAMPLE))
        name = "" if f == path else f.relative_to(path).as_posix()   # a file: its bytes alone
        parts.append(f"{name}:{size}:{h.hexdigest()}")
    return digest(*parts)


def _say(message: str) -> None:
    print(f"river: {message}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _seal(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "seal"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _manifest(target: Path) -> dict | str:
    """The entry's manifest, or why it cannot be read."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except FileNotFoundError:
        return "incomplete or made by an older River (no manifest)"
    except (OSError, ValueError):
        return "unreadable manifest"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        return f"cache format {found}, this River reads {FORMAT}"
    if manifest.get("seal") != _seal(manifest):
        return "altered manifest (its seal does not match)"
    return manifest


def problem(target: Path, inputs: str | None = None, checksums: bool = False) -> str | None:
    """Why `target` cannot be used (None: it can): the manifest's seal and every file's size,
    and with `checksums` every file's SHA-256 too (reads everything)."""
    if not target.is_dir():
        return "not built"
    manifest = _manifest(target)
    if isinstance(manifest, str):
        return manifest
    if inputs is not None and manifest.get("inputs") != inputs:
        return "built from other inputs"
    files = manifest.get("files", {})
    for name, meta in files.items():
        path = target / name
        if not path.is_file():
            return f"missing file {name}"
        if path.stat().st_size != meta["size"]:
            return f"truncated or altered file {name} (size {path.stat().st_size}, " \
                   f"expected {meta['size']})"
        if checksums and _sha256(path) != meta["sha256"]:
            return f"corrupted file {name} (checksum mismatch)"
    extra = {p.relative_to(target).as_posix() for p in _files(target)} - set(files)
    return f"unexpected file {sorted(extra)[0]}" if extra else None


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    # lock files stay (removing one would let a waiter and a newcomer lock different files),
    # out of the way in one folder
    locks = target.parent.parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{target.parent.name}-{target.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another process building {target.name} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield   # released when the file closes, or when the process dies


def orphaned(target: Path) -> str | None:
    """Why nothing current refers to `target` (None: its source is there, unchanged)."""
    manifest = _manifest(target)
    source = manifest.get("source") if isinstance(manifest, dict) else None
    if not source:
        return None
    path = Path(source["path"])
    if not path.exists():
        return f"orphan: its source {path} is gone"
    if content_key(path) != source["key"]:
        return f"orphan: its source {path} has changed"
    return None


WHAT = {"converted": "converted copy", "stand-ins": "stand-ins", "onnx": "ONNX export",
        "onnx-optimized": "ONNX Runtime's optimized graphs", "spec": "spec and tokenizer",
        "gguf": "F16 copy", "ggml-stand-ins": "ggml stand-ins"}


def ready(target: Path, inputs: str) -> bool:
    """Whether `target` holds a sound build of `inputs`, no build of it under way or cut
    short: what `cached` then uses as it is."""
    partials = list(target.parent.glob(f"{PARTIAL}{target.name}-*")) \
        if target.parent.is_dir() else []
    return not partials and problem(target, inputs) is None


def cached(target: Path, build: Callable[[Path], object], inputs: str,
           source: Path | None = None) -> Path:
    """`target`, built by `build(folder)` first unless a valid build of `inputs` is there.
    `source`: the model file or folder it is made from, recorded for `orphaned`.

    A sound entry is used without a lock or any write, so a cache on a read-only mount (a
    team's prebuilt one, a container's) serves what it holds; one it lacks is a clear error."""
    if ready(target, inputs):
        return target
    _writable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target):
        unclean = False
        for partial in target.parent.glob(f"{PARTIAL}{target.name}-*"):
            _say(f"removing an incomplete build of {target.name} (an interrupted run)")
            shutil.rmtree(partial, ignore_errors=True)
            unclean = True
        why = problem(target, inputs, checksums=unclean)
        if why is None:
            return target
        if target.exists():
            _say(f"{target.name}: {why}; rebuilding it")
            shutil.rmtree(target)
        tmp = target.with_name(f"{PARTIAL}{target.name}-{os.getpid()}")
        tmp.mkdir()
        try:
            build(tmp)
            files = {p.relative_to(tmp).as_posix(): {"size": p.stat().st_size,
                                                     "sha256": _sha256(p)}
                     for p in _files(tmp)}
            manifest = {"format": FORMAT, "inputs": inputs, "files": files, "source": None if
                        source is None else {"path": str(Path(source).resolve()),
                                             "key": content_key(source)}}
            manifest["seal"] = _seal(manifest)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _writable(target: Path) -> None:
    """Refuse, in one line, to build into a cache this process cannot write."""
    existing = next(p for p in (target.parent, *target.parents) if p.exists())
    try:   # a probe, not os.access: root passes that on a read-only mount
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError:
        what = WHAT.get(target.parent.name, target.parent.name)
        raise ModelError(f"cache at {cache_root()} is read-only and has no {what} for "
                         f"{target.name}; build it where the cache is writable (the same "
                         f"command, once) or set RIVER_CACHE to a writable folder")


@attrs.frozen
class Entry:
    """One cache entry, as `river cache` lists it."""

    path: Path
    size: int
    problem: str | None   # None: usable

    @property
    def kind(self) -> str:
        return self.path.parent.name


def entries(checksums: bool = False) -> list[Entry]:
    """Every entry and partial build under the cache root, with its size and state."""
    found = []
    root = cache_root()
    kinds = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] \
        if root.is_dir() else []
    for kind in sorted(kinds):
        for path in sorted(p for p in kind.iterdir() if p.is_dir()):
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            why = "partial build" if path.name.startswith(PARTIAL) else \
                problem(path, checksums=checksums) or orphaned(path)
            found.append(Entry(path, size, why))
    return found


def remove(entry: Entry) -> None:
    with _locked(entry.path):
        shutil.rmtree(entry.path, ignore_errors=True)
