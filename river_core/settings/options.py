"""Plugin options. Each policy, predictor and KV strategy declares its own as an attrs class
(defaults, ranges, a one-line doc per field), names it in its plugin entry, and receives an
instance of it:

    @attrs.frozen
    class Options:
        threshold: float = option(0.15, "largest predicted error to exit with", between(0, 1))

    def my_policy(options: Options, num_layers: int): ...

    PolicyPlugin(my_policy, Options)

Users set them by name: `river generate -o threshold=0.2` or `options={"threshold": 0.2}`; each
name goes to every chosen plugin that declares it, and a name none declares is an error.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import attrs

from .errors import ConfigError


@attrs.frozen
class NoOptions:
    """What a plugin that declares no options receives."""


def option(default: Any, doc: str, *validators: Callable,
           tune: tuple[float, float] | None = None) -> Any:
    """An option field. `tune=(strict, permissive)` marks the one option `river calibrate`
    fits, with the value that lets the fewest tokens exit and the value that lets the most."""
    metadata = {"doc": doc} if tune is None else {"doc": doc, "tune": tune}
    return attrs.field(default=default, validator=list(validators), metadata=metadata)


def _check(test: Callable[[Any], bool], expected: str) -> Callable:
    def validate(instance, attribute, value) -> None:
        if value is not None and not test(value):
            raise ConfigError(f"{attribute.name} must be {expected}, got {value!r}")
    return validate


def between(lo: float, hi: float) -> Callable:
    return _check(lambda v: isinstance(v, (int, float)) and lo <= v <= hi, f"in [{lo}, {hi}]")


def at_least(lo: int) -> Callable:
    return _check(lambda v: isinstance(v, int) and v >= lo, f"an integer >= {lo}")


def describe(options: type) -> list[tuple[str, Any, str]]:
    """(name, default, doc) of each field of an options class."""
    return [(f.name, f.default, f.metadata.get("doc", "")) for f in attrs.fields(options)]


def tuned(options: type) -> tuple[str, float, float] | None:
    """(name, strict, permissive) of the option calibration fits, if the class marks one; of
    a subclass that marks its own, that one (cascade fits its margin, not the rule's tau)."""
    marked = [f for f in attrs.fields(options) if "tune" in f.metadata]
    return (marked[-1].name, *marked[-1].metadata["tune"]) if marked else None


def parse(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings as a dict; values are read as JSON where they parse (0.2, 3, null,
    true, [1, 2]), else kept as text."""
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"options are key=value, got {pair!r}")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    return out


def bind(values: Mapping[str, Any], roles: Mapping[str, type]) -> dict[str, Any]:
    """One options instance per role (policy, predictor, kv_strategy) from user values, each
    name going to every role whose options class declares it."""
    declared = {role: {f.name for f in attrs.fields(cls)} for role, cls in roles.items()}
    for key in values:
        if not any(key in names for names in declared.values()):
            known = sorted(set().union(*declared.values()))
            raise ConfigError(f"unknown option {key!r}; the chosen plugins take: "
                              f"{', '.join(known) or 'none'}")
    return {role: cls(**{k: v for k, v in values.items() if k in declared[role]})
            for role, cls in roles.items()}
