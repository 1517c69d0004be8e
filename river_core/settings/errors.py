"""Errors meant for the user: each carries one clear sentence, and the CLI prints only that."""


class RiverError(Exception):
    """Base class: anything River raises on bad input or an unusable environment."""


class ConfigError(RiverError, ValueError):
    """A setting is out of range or names something that does not exist."""


class ModelError(RiverError):
    """A model is missing, unreadable or of an unsupported architecture."""


class CapabilityError(RiverError):
    """A backend was asked for something its capability flags say it cannot do."""


def unknown(kind: str, name: str, known) -> ConfigError:
    """The error for a name that is not registered, listing what is."""
    return ConfigError(f"unknown {kind} {name!r}; available: {', '.join(sorted(known)) or 'none'}")


class NonFiniteError(RiverError):
    """A model's logits went NaN or infinite: its activations overflowed."""
