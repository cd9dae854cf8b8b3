"""msgspec's validation messages reworded for people: the key at fault and what is accepted."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

import msgspec

from ampscope.core.presets.suggest import did_you_mean

_AT = re.compile(r"\s*-\s*at\s*`\$(?P<path>[^`]*)`\s*$")


def describe_validation_error(message: str, root: type[msgspec.Struct]) -> tuple[str | None, str]:
    """msgspec's message as (dotted key at fault, a message naming it and what is accepted)."""
    match = _AT.search(message)
    path = match.group("path") if match else ""
    body = message[: match.start()] if match else message
    key = re.sub(r"\[(\d+)\]", r".\1", path).lstrip(".")
    unknown = re.match(r"Object contains unknown field `(?P<field>[^`]+)`", body)
    if unknown:
        field = f"{key}.{unknown['field']}" if key else unknown["field"]
        names = _fields_at(root, key)
        hint = did_you_mean(unknown["field"], names)
        return field, f"unknown field '{field}'.{hint} Accepted fields here: {', '.join(names)}."
    missing = re.match(r"Object missing required field `(?P<field>[^`]+)`", body)
    if missing:
        field = f"{key}.{missing['field']}" if key else missing["field"]
        return field, f"missing required field '{field}'."
    accepted = _accepted_at(root, key)
    types = _TYPE_MISMATCH.match(body)
    if types:
        got = _TYPE_WORDS.get(types["got"], types["got"])
        return key or None, f"'{key}' cannot be {got}." + (
            f" Accepted: {accepted}." if accepted else ""
        )
    hint = ""
    bad = re.match(r"Invalid enum value '(?P<value>[^']*)'", body)
    if bad:
        hint = did_you_mean(bad["value"], _literal_values(root, key))
    body = body.replace("Expected `", "expected `").replace("Invalid enum value", "invalid value")
    return key or None, f"'{key}': {body}.{hint}" + (f" Accepted: {accepted}." if accepted else "")


_TYPE_MISMATCH = re.compile(r"Expected `[^`]+`, got `(?P<got>[^`]+)`$")
_TYPE_WORDS = {
    "str": "text",
    "int": "a whole number",
    "float": "a float (a number with a point or an exponent, nan or inf)",
    "bool": "true or false",
    "null": "empty",
    "array": "a list",
    "object": "a table",
}


def _struct_at(root: type[msgspec.Struct], key: str) -> type[msgspec.Struct]:
    struct = root
    for part in [p for p in key.split(".") if p]:
        hint = typing.get_type_hints(struct).get(part)
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            struct = hint
    return struct


def _fields_at(root: type[msgspec.Struct], key: str) -> list[str]:
    return list(_struct_at(root, key).__struct_fields__)


def _accepted_at(root: type[msgspec.Struct], key: str) -> str:
    parts = [p for p in key.split(".") if p]
    if not parts:
        return ""
    struct = _struct_at(root, ".".join(parts[:-1]))
    hint = typing.get_type_hints(struct, include_extras=True).get(parts[-1])
    return _describe_type(hint) if hint is not None else ""


def _literal_values(root: type[msgspec.Struct], key: str) -> list[str]:
    """The text values a Literal field at ``key`` accepts (none for other types)."""
    parts = [p for p in key.split(".") if p]
    if not parts:
        return []
    struct = _struct_at(root, ".".join(parts[:-1]))
    hint = typing.get_type_hints(struct).get(parts[-1])
    for arm in (hint, *typing.get_args(hint)):  # a Literal, or an optional one
        if typing.get_origin(arm) is Literal:
            return [v for v in typing.get_args(arm) if isinstance(v, str)]
    return []


def _describe_type(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(repr(v) for v in typing.get_args(hint))
    if origin is Annotated:
        base, *metas = typing.get_args(hint)
        bounds = []
        for meta in metas:
            for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                if getattr(meta, attr, None) is not None:
                    bounds.append(f"{sign} {getattr(meta, attr)}")
        return f"{_describe_type(base)} {' and '.join(bounds)}".strip()
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_describe_type(a) for a in typing.get_args(hint) if a is not type(None)]
        text = " or ".join(parts)
        return text + (" (or leave unset)" if type(None) in typing.get_args(hint) else "")
    if origin is list:
        return f"a list of {_describe_type(typing.get_args(hint)[0]).removeprefix('a ')}s"
    if origin is dict:
        return f"a table of names to {_describe_type(typing.get_args(hint)[1])}"
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):  # never its class's name
        return f"a table of fields ({', '.join(hint.__struct_fields__)})"
    if isinstance(hint, type):
        return {
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "bool": "true or false",
        }.get(hint.__name__, hint.__name__)
    return str(hint)
