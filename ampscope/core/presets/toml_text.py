"""Preset text: reading a preset file or a ``--set`` value, and writing values back as TOML.

Whatever a file or a flag holds (deep nesting, a 5,000-digit number, bytes that are not
UTF-8) becomes a ConfigError naming it, never an exception from the parser.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any

from ampscope.core.presets.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


MAX_VALUE_CHARS = 1000
"""No preset value needs more; longer text (a pasted 5,000-digit number) is refused early."""


def parse_value(text: str) -> Any:
    """A value as TOML reads it (50, 1e-3, true, [1, 2]); anything else is a string."""
    if len(text) > MAX_VALUE_CHARS:
        raise ConfigError(
            f"a value of {len(text):,} characters is too long (at most {MAX_VALUE_CHARS:,})."
        )
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"'{text[:40]}' cannot be read as a value ({reason(exc)}).") from None


def toml_value(value: Any) -> str:
    """A TOML literal that reads back as ``value``: any text (newlines, quotes, control
    characters from a description) stays one valid basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table; keys quoted, so dotted names stay one key
        return (
            "{"
            + ", ".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items())
            + "}"
        )
    return '"' + "".join(_TOML_ESCAPES.get(c) or _toml_char(c) for c in str(value)) + '"'


_TOML_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _toml_char(c: str) -> str:
    return f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c


MAX_PRESET_BYTES = 1 << 20


def read_config_file(path: Path, max_bytes: int) -> bytes:
    """A settings file's bytes (at most ``max_bytes`` + 1 of them), read only once it is known
    to be a regular file: a FIFO under a ``.toml`` name, opened as a file is, waited for a
    writer forever and froze the dashboard before it first drew. OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read(max_bytes + 1)


def write_config_file(path: Path, text: str) -> None:
    """Write a settings file (a preset the dashboard saves) as UTF-8, once ``path`` is known to
    be a regular file or none: a FIFO under that name, opened as a file is, waited for a
    reader forever and froze the dashboard. OSError otherwise; nothing else is truncated."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO that no one reads
            raise OSError(errno.EINVAL, "not a regular file", str(path)) from None
        raise
    with os.fdopen(fd, "wb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        fh.truncate(0)
        fh.write(text.encode("utf-8"))


def read_toml(path: Path) -> dict[str, Any]:
    """A preset file's table; ConfigError (naming the file) for anything that is not one."""
    try:
        data = read_config_file(path, MAX_PRESET_BYTES)
        if len(data) > MAX_PRESET_BYTES:
            raise ConfigError("larger than 1 MiB: not a preset.", source=str(path))
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML ({exc}).", source=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text, so not TOML.", source=str(path)) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(
            f"cannot be read as a preset ({reason(exc)}).", source=str(path)
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror}).", source=str(path)) from None


def reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    if "digits" in text or isinstance(exc, OverflowError):
        return "a number too large"
    return text[:200]
