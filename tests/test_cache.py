"""The user cache never lies: builds are atomic and locked, entries are checked against their
manifest before use, and whatever does not match is reported, removed and rebuilt.

Interruptions and races run real processes and real signals."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from river_models.cache import MANIFEST, cached, entries, problem, remove

# a child process building one entry: the build writes a file, waits until the `release`
# file exists (at most `pause` seconds), then writes another
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from river_models.cache import cached

    # Ctrl-C as at a terminal, even when the test runner's shell ignores SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target, pause, log = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
    release = log.with_name("release")

    def build(folder):
        with log.open("a") as f:
            f.write(f"{os.getpid()}\\n")
        (folder / "a.bin").write_bytes(b"a" * 1000)
        print("building", flush=True)
        end = time.time() + pause
        while time.time() < end and not release.exists():
            time.sleep(0.02)
        (folder / "b.bin").write_bytes(os.urandom(1000))

    cached(target, build, "inputs-1")
    print("done", flush=True)
""")


def _child(target, pause, log):
    return subprocess.Popen([sys.executable, "-c", CHILD, str(target), str(pause), str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _build(folder):
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "sub").mkdir()
    (folder / "sub" / "config.json").write_text("{}")


@pytest.fixture
def target(tmp_path):
    return tmp_path / "kind" / "model-abc123"


def _counting(calls):
    def build(folder):
        calls.append(folder)
        _build(folder)
    return build


def test_an_entry_is_built_once_and_then_reused(target):
    calls = []
    assert cached(target, _counting(calls), "k") == target
    cached(target, _counting(calls), "k")
    assert len(calls) == 1 and problem(target, "k") is None
    manifest = json.loads((target / MANIFEST).read_text())
    assert set(manifest["files"]) == {"weights.bin", "sub/config.json"}


def _edit_manifest(t, change):
    manifest = json.loads((t / MANIFEST).read_text())
    change(manifest)
    (t / MANIFEST).write_text(json.dumps(manifest))


def _flip_first_byte(t):
    (t / "weights.bin").write_bytes(b"\x01" + (t / "weights.bin").read_bytes()[1:])


@pytest.mark.parametrize("damage, reported", [
    (lambda t: os.truncate(t / "weights.bin", 100), "truncated"),
    (lambda t: (t / "sub" / "config.json").unlink(), "missing file"),
    (lambda t: (t / MANIFEST).unlink(), "no manifest"),
    (lambda t: (t / MANIFEST).write_text(json.dumps({"format": 0})), "cache format 0"),
    (lambda t: (t / "stray.bin").write_bytes(b"x"), "unexpected file"),
    (lambda t: _edit_manifest(t, lambda m: m["files"]["weights.bin"].update(size=1)),
     "altered manifest"),
])
def test_a_damaged_entry_is_reported_removed_and_rebuilt(target, capsys, damage, reported):
    calls = []
    cached(target, _counting(calls), "k")
    damage(target)
    assert reported in problem(target, "k")
    cached(target, _counting(calls), "k")
    assert len(calls) == 2 and problem(target, "k") is None
    assert reported in capsys.readouterr().err


def test_a_flipped_byte_is_found_by_the_full_checksum_not_by_the_check_on_load(target, capsys):
    """Loading checks the manifest's seal and every size (milliseconds); every checksum is read
    by `river cache --verify`, and on load after an unclean build."""
    calls = []
    cached(target, _counting(calls), "k")
    _flip_first_byte(target)
    assert problem(target, "k") is None
    assert "checksum mismatch" in problem(target, "k", checksums=True)
    cached(target, _counting(calls), "k")
    assert len(calls) == 1   # the cheap check passes: no rebuild
    (target.parent / f".partial-{target.name}-99999").mkdir()   # a killed run's leftover
    cached(target, _counting(calls), "k")
    assert len(calls) == 2 and problem(target, "k", checksums=True) is None
    assert "checksum mismatch" in capsys.readouterr().err


def test_other_inputs_under_the_same_name_rebuild(target):
    calls = []
    cached(target, _counting(calls), "k")
    cached(target, _counting(calls), "other")
    assert len(calls) == 2


def test_a_failed_build_leaves_nothing(target):
    def broken(folder):
        _build(folder)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cached(target, broken, "k")
    assert list(target.parent.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_an_interrupted_build_is_cleaned_up_and_rebuilt(tmp_path, target, sig):
    log = tmp_path / "builds.log"
    child = _child(target, 30, log)
    assert child.stdout.readline().strip() == "building"
    child.send_signal(sig)
    assert child.wait(10) != 0
    assert not target.exists()
    again = _child(target, 0, log)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0 and out.split()[-1] == "done"
    assert problem(target, "inputs-1") is None
    left = "removing an incomplete build" in err
    assert left == (sig == signal.SIGKILL)   # Ctrl-C cleans up itself; a kill cannot
    assert len(log.read_text().split()) == 2


def test_two_processes_building_at_once_build_once(tmp_path, target):
    log = tmp_path / "builds.log"
    first = _child(target, 60, log)
    assert first.stdout.readline().strip() == "building"
    second = _child(target, 60, log)
    assert "waiting for another process" in second.stderr.readline()   # while first builds
    (tmp_path / "release").touch()
    first.communicate(timeout=60)
    second.communicate(timeout=60)
    assert first.returncode == second.returncode == 0
    assert len(log.read_text().split()) == 1 and problem(target, "inputs-1") is None


def test_entries_lists_sizes_and_states_and_removes(tmp_path, monkeypatch):
    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    good, bad = tmp_path / "onnx" / "m-1", tmp_path / "stand-ins" / "m-2"
    cached(good, _build, "1")
    cached(bad, _build, "2")
    os.truncate(bad / "weights.bin", 10)
    (tmp_path / "onnx" / ".partial-m-3-999").mkdir()
    listed = {e.path.name: e for e in entries()}
    assert listed["m-1"].problem is None and listed["m-1"].kind == "onnx"
    assert listed["m-1"].size == 256 * 64 + 2 + (good / MANIFEST).stat().st_size
    assert "truncated" in listed["m-2"].problem
    assert listed[".partial-m-3-999"].problem == "partial build"
    remove(listed["m-2"])
    assert "m-2" not in {e.path.name for e in entries()}


def test_river_cache_lists_and_removes(tmp_path, monkeypatch, capsys):
    from river_cli.main import main

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    cached(tmp_path / "onnx" / "m-1", _build, "1")
    cached(tmp_path / "stand-ins" / "m-2", _build, "2")
    (tmp_path / "stand-ins" / "m-2" / "weights.bin").write_bytes(b"changed")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "m-1" in out and "ok" in out and "truncated" in out
    assert main(["cache", "--remove", "nope"]) == 2
    assert "no cache entry named nope" in capsys.readouterr().err
    assert main(["cache", "--prune"]) == 0
    assert "removed stand-ins/m-2" in capsys.readouterr().out
    assert [e.path.name for e in entries()] == ["m-1"]
    assert main(["cache", "--clear"]) == 0 and entries() == []


def test_content_keys_follow_content_not_paths_or_times(tmp_path):
    import shutil

    from river_models.cache import content_key

    a = tmp_path / "a"
    _build(a.mkdir() or a)
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    os.utime(b / "weights.bin", (0, 0))
    assert content_key(a) == content_key(b)
    (b / "weights.bin").write_bytes(bytes(range(256))[::-1] * 64)
    assert content_key(a) != content_key(b)


def test_an_entry_whose_source_is_gone_or_changed_is_an_orphan_and_pruned(tmp_path, monkeypatch,
                                                                            capsys):
    from river_cli.main import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("RIVER_CACHE", str(cache))
    kept, changed, gone = (tmp_path / name for name in ("kept", "changed", "gone"))
    for source in (kept, changed, gone):
        source.mkdir()
        (source / "model.bin").write_bytes(os.urandom(100))
        cached(cache / "stand-ins" / f"m-{source.name}", _build, "k", source=source)
    (changed / "model.bin").write_bytes(os.urandom(100))
    (gone / "model.bin").unlink()
    gone.rmdir()
    states = {e.path.name: e.problem for e in entries()}
    assert states["m-kept"] is None
    assert "orphan: its source" in states["m-changed"] and "has changed" in states["m-changed"]
    assert "orphan: its source" in states["m-gone"] and "is gone" in states["m-gone"]
    assert main(["cache", "--prune"]) == 0
    assert {e.path.name for e in entries()} == {"m-kept"}
    assert "removed stand-ins/m-changed" in capsys.readouterr().out


def test_a_rebuilt_conversion_keeps_its_stand_ins_current(tmp_path, monkeypatch):
    """A converted GGUF damaged and rebuilt has the same content: the stand-ins made from it
    stay its own, and no orphan is left behind (once, a rebuild left 141 MB listed as ok)."""
    from river_core import QuantSpec
    from river_conformance.fixtures.tiny_gguf import gguf_file
    from river_models import open_model, stand_ins
    from river_models.source import locate

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    gguf = gguf_file(0)
    checkpoint = open_model(str(gguf))
    stand_ins(checkpoint, QuantSpec(bits=8))
    converted = locate(str(gguf))
    (converted / "config.json").write_text("{}")          # damaged: rebuilt on next use
    again = open_model(str(gguf))
    stand_ins(again, QuantSpec(bits=8))
    assert again.key == checkpoint.key
    states = {e.path.name: e.problem for e in entries()}
    assert len(states) == 2 and set(states.values()) == {None}


@contextlib.contextmanager
def _read_only(folder):
    """`folder` read-only for this process: a read-only bind mount where it runs as root
    (permissions do not stop root), else its write bits taken away."""
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)],
                                 capture_output=True).returncode == 0 and subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode == 0
        if not mounted:
            subprocess.run(["umount", str(folder)], capture_output=True)
            pytest.skip("cannot make a read-only directory here (no mount as root)")
        try:
            yield
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_a_read_only_cache_serves_what_it_holds_and_names_what_it_lacks(tiny_folder, tmp_path):
    """A team's prebuilt cache on a read-only mount: a run that needs only what it holds
    writes nothing, takes no lock and answers as before; one that needs an entry it lacks
    stops with one line saying so."""
    cache = tmp_path / "cache"
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "river_cli.main", "generate", "abc", "--model",
         tiny_folder("llama"), "--no-chat", "--max-new-tokens", "4", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RIVER_CACHE": str(cache)})
    built = run()
    assert built.returncode == 0, built.stderr
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    with _read_only(cache):
        again = run()
        assert again.returncode == 0 and again.stdout == built.stdout, again.stderr
        lacking = run("--bits", "8")
    assert lacking.returncode == 2 and "Traceback" not in lacking.stderr
    assert f"cache at {cache} is read-only and has no stand-ins for" in lacking.stderr
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == before
