"""The one error type of presets and overrides (its own module: the readers below need it), and
the override a command-line flag stands for, so that an error names the flag the user typed."""

from __future__ import annotations


class ConfigError(Exception):
    """A user error in a preset or an override: the message is meant to be shown as is.

    ``key`` is the dotted field at fault (``workload.layers``) when one is, and ``source``
    where its value came from (a preset file, or ``--set KEY=VALUE``), so that a form can
    mark the field and a command line can name the flag, without reading the message.
    """

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        super().__init__(f"{source}: {message}" if source else message)
        self.detail = message
        self.key = key
        self.source = source


class FlagOverride(str):
    """An override that a flag stands for: ``--steps 0`` is ``steps=0``. It is the override
    string itself; an error in it names ``flag``, not a ``--set`` the user never typed."""

    flag: str

    def __new__(cls, override: str, flag: str) -> FlagOverride:
        made = super().__new__(cls, override)
        made.flag = flag
        return made
