"""The one exception a config that cannot run raises, and the message for a key the schema does not know."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config that cannot run; the message names the key path.

    ``keys``: the dotted paths of the keys the error is about, where one rule checked them (``Config.check`` sets
    them), so that ``resolve`` can tell whether a command-line override set the bad value. ``override``: the text
    of that override (``"train.lr=abc"``) once the message names it, so that ``load_config`` does not blame the
    file for it.
    """

    def __init__(self, message: str, keys: Iterable[str] = (), override: str | None = None):
        super().__init__(message)
        self.keys = tuple(keys)
        self.override = override


def unknown_key(key: str, valid: Iterable[str], path: str) -> ConfigError:
    """The error for ``key`` under ``path`` ("" at the top): the closest valid key, when one is close, and all."""
    valid = sorted(valid)
    prefix = f"{path}." if path else ""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
    return ConfigError(f"Unknown config key '{prefix}{key}'.{hint} Valid keys here: {valid}.")
