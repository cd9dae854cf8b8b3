"""The one error type of presets and overrides (its own module: the readers below need it)."""

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
