"""The model package's plugin: the `river cache` command."""

from __future__ import annotations

import argparse

from river_core.settings.errors import ConfigError
from river_core.contract.hookspecs import hookimpl

from .cache import cache_root, entries, remove


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cache(parser: argparse.ArgumentParser):
    """List the user cache's entries with their sizes and state; remove them."""
    parser.add_argument("--verify", action="store_true",
                        help="check every file's checksum too (reads everything)")
    parser.add_argument("--remove", nargs="+", metavar="NAME", default=[],
                        help="remove these entries (names as listed)")
    parser.add_argument("--prune", action="store_true",
                        help="remove every entry that is not usable and every partial build")
    parser.add_argument("--clear", action="store_true", help="remove every entry")

    def run(args) -> int:
        found = entries(checksums=args.verify)
        by_name = {e.path.name: e for e in found}
        unknown = [n for n in args.remove if n not in by_name]
        if unknown:
            raise ConfigError(f"no cache entry named {', '.join(unknown)} under {cache_root()}")
        doomed = [by_name[n] for n in args.remove] + \
            [e for e in found if args.clear or (args.prune and e.problem is not None)]
        for e in {id(e): e for e in doomed}.values():
            remove(e)
            print(f"removed {e.kind}/{e.path.name} ({_size(e.size)})")
        if doomed:
            return 0
        print(f"{cache_root()}: {len(found)} entries, {_size(sum(e.size for e in found))}")
        for e in found:
            state = "ok" if e.problem is None else e.problem
            print(f"  {e.kind:<10} {e.path.name:<60} {_size(e.size):>9}  {state}")
        return 0
    return run


@hookimpl
def river_commands():
    return {"cache": cache}
