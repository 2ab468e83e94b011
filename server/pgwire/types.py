"""Postgres type OIDs, and the text and binary codecs for the types the proxy sends and receives.

Results: every value the engine returns is one of a few portable types (``integer``, ``float``,
``text``, ``date``, ``timestamp``, ``boolean``); they go out as int8, float8, text, date,
timestamp and bool, in text or binary format as the client asks.  Parameters: the common scalar
types are decoded from text or binary into Python values, which the session turns into SQL
literal nodes (never pasted text).
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal, InvalidOperation
from typing import Any

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR = 114, 700, 701, 705, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC, UUID, JSONB = (
    1082, 1083, 1114, 1184, 1186, 1700, 2950, 3802)
TEXT_ARRAY, INT8_ARRAY, INT2_ARRAY, INT4_ARRAY, FLOAT8_ARRAY, BOOL_ARRAY, OID_ARRAY = (
    1009, 1016, 1005, 1007, 1022, 1000, 1028)
REGCLASS, REGTYPE = 2205, 2206

#: wire type of each portable result type of the engine
PORTABLE_OIDS = {"integer": INT8, "float": FLOAT8, "text": TEXT, "date": DATE,
                 "timestamp": TIMESTAMP, "boolean": BOOL}
#: wire type of each policy column type
POLICY_OIDS = {"int": INT8, "float": FLOAT8, "text": TEXT, "bool": BOOL, "date": DATE,
               "timestamp": TIMESTAMP}
#: (name as format_type shows it, size) of the types the proxy describes
TYPE_INFO = {BOOL: ("boolean", 1), INT8: ("bigint", 8), INT2: ("smallint", 2),
             INT4: ("integer", 4), TEXT: ("text", -1), FLOAT4: ("real", 4),
             FLOAT8: ("double precision", 8), DATE: ("date", 4),
             TIMESTAMP: ("timestamp without time zone", 8),
             TIMESTAMPTZ: ("timestamp with time zone", 8), NUMERIC: ("numeric", -1),
             VARCHAR: ("character varying", -1), OID: ("oid", 4), NAME: ("name", 64),
             CHAR: ('"char"', 1), BYTEA: ("bytea", -1), JSON: ("json", -1),
             TEXT_ARRAY: ("text[]", -1), INT8_ARRAY: ("bigint[]", -1),
             INT4_ARRAY: ("integer[]", -1), INT2_ARRAY: ("smallint[]", -1),
             FLOAT8_ARRAY: ("double precision[]", -1), BOOL_ARRAY: ("boolean[]", -1),
             OID_ARRAY: ("oid[]", -1)}
ARRAY_ELEMENT = {TEXT_ARRAY: TEXT, INT8_ARRAY: INT8, INT4_ARRAY: INT4, INT2_ARRAY: INT2,
                 FLOAT8_ARRAY: FLOAT8, BOOL_ARRAY: BOOL, OID_ARRAY: OID}

_EPOCH_DATE = dt.date(2000, 1, 1)
_EPOCH = dt.datetime(2000, 1, 1)
_EPOCH_TZ = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_INTS = {INT2: struct.Struct("!h"), INT4: struct.Struct("!i"), INT8: struct.Struct("!q"),
         OID: struct.Struct("!I")}
_F4, _F8, _I32, _I64 = struct.Struct("!f"), struct.Struct("!d"), struct.Struct("!i"), \
    struct.Struct("!q")


class ParameterError(ValueError):
    """A parameter value that does not decode as its type (SQLSTATE 22P02)."""


def duckdb_oid(type_name: str) -> int:
    """The wire type of a DuckDB column type (the fake catalog's results)."""
    n = type_name.upper()
    if n.endswith("[]"):
        element = duckdb_oid(n[:-2])
        return {TEXT: TEXT_ARRAY, INT8: INT8_ARRAY, INT4: INT4_ARRAY, INT2: INT2_ARRAY,
                FLOAT8: FLOAT8_ARRAY, BOOL: BOOL_ARRAY}.get(element, TEXT_ARRAY)
    if n in ("BIGINT", "HUGEINT", "UBIGINT", "UINTEGER", "UHUGEINT"):
        return INT8
    if n in ("INTEGER", "USMALLINT"):
        return INT4
    if n in ("SMALLINT", "TINYINT", "UTINYINT"):
        return INT2
    if n in ("DOUBLE", "FLOAT") or n.startswith("DECIMAL"):
        return FLOAT8 if n != "FLOAT" else FLOAT4
    if n == "BOOLEAN":
        return BOOL
    if n == "DATE":
        return DATE
    if n == "TIMESTAMP":
        return TIMESTAMP
    if n.startswith("TIMESTAMP WITH"):
        return TIMESTAMPTZ
    return TEXT


# -- results ------------------------------------------------------------------------------------


def coerce(value: Any, oid: int) -> Any:
    """Bring a result value to the Python type of the wire type it was described with."""
    if value is None:
        return None
    if oid in (FLOAT8, FLOAT4):
        return float(value) if isinstance(value, int | float | Decimal) else value
    if oid in (INT8, INT4, INT2):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value
    return value


def encode_text(value: Any, oid: int) -> bytes:
    """Postgres text output of a value (extra_float_digits >= 1: shortest exact floats)."""
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, float):
        if math.isnan(value):
            return b"NaN"
        if math.isinf(value):
            return b"Infinity" if value > 0 else b"-Infinity"
        text = repr(value)
        if oid in (INT8, INT4, INT2) and value.is_integer():
            text = str(int(value))
        return text.encode()
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, dt.datetime):
        text = value.isoformat(sep=" ")
        if value.tzinfo is not None:
            text = value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ") + "+00"
        return text.encode()
    if isinstance(value, dt.date):
        return value.isoformat().encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return b"\\x" + bytes(value).hex().encode()
    if isinstance(value, list | tuple):
        return _text_array(value)
    if isinstance(value, Decimal):
        return str(value).encode()
    return str(value).encode("utf-8")


def _text_array(values: list[Any] | tuple[Any, ...]) -> bytes:
    parts = []
    for v in values:
        if v is None:
            parts.append(b"NULL")
            continue
        item = encode_text(v, TEXT)
        if isinstance(v, str) and (not item or any(c in item for c in b'{},"\\ ') or
                                   item.upper() == b"NULL"):
            item = b'"' + item.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'
        parts.append(item)
    return b"{" + b",".join(parts) + b"}"


def encode_binary(value: Any, oid: int) -> bytes:
    """Postgres binary (send) format of a value of wire type ``oid``."""
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid in _INTS:
        return _INTS[oid].pack(int(value))
    if oid == FLOAT8:
        return _F8.pack(float(value))
    if oid == FLOAT4:
        return _F4.pack(float(value))
    if oid == DATE:
        return _I32.pack((value - _EPOCH_DATE).days)
    if oid == TIMESTAMP:
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        delta = value - _EPOCH
        return _I64.pack((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if oid == TIMESTAMPTZ:
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - _EPOCH_TZ
        return _I64.pack((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if oid == BYTEA:
        return bytes(value)
    if oid in ARRAY_ELEMENT:
        return _binary_array(value, ARRAY_ELEMENT[oid])
    return encode_text(value, oid)  # text, varchar, name, json: the binary form is the text


def _binary_array(values: list[Any] | tuple[Any, ...], element: int) -> bytes:
    has_null = any(v is None for v in values)
    head = struct.pack("!iiiii", 1 if values else 0, int(has_null), element, len(values), 1)
    if not values:
        head = struct.pack("!iii", 0, 0, element)
    parts = [head]
    for v in values:
        if v is None:
            parts.append(b"\xff\xff\xff\xff")
        else:
            item = encode_binary(v, element)
            parts.append(_I32.pack(len(item)) + item)
    return b"".join(parts)


# -- parameters ---------------------------------------------------------------------------------


def decode_parameter(raw: bytes | None, oid: int, binary: bool) -> Any:
    """A Bind parameter as a Python value (str for text, unknown and unhandled types)."""
    if raw is None:
        return None
    try:
        return _decode_binary(raw, oid) if binary else _decode_text(raw, oid)
    except (ValueError, struct.error, UnicodeDecodeError, InvalidOperation, OverflowError):
        kind = "binary" if binary else "text"
        name = TYPE_INFO.get(oid, (f"type {oid}",))[0]
        raise ParameterError(f"invalid {kind} value for a parameter of type {name}") from None


def _decode_text(raw: bytes, oid: int) -> Any:
    text = raw.decode("utf-8")
    if oid in (INT2, INT4, INT8, OID):
        return int(text.strip())
    if oid in (FLOAT4, FLOAT8):
        value = float(text.strip())
        return value
    if oid == NUMERIC:
        return Decimal(text.strip())
    if oid == BOOL:
        low = text.strip().lower()
        if low in ("t", "true", "y", "yes", "on", "1"):
            return True
        if low in ("f", "false", "n", "no", "off", "0"):
            return False
        raise ValueError(text)
    if oid == DATE:
        return dt.date.fromisoformat(text.strip())
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        value = _parse_timestamp(text.strip())
        if oid == TIMESTAMP and value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value
    if oid == BYTEA:
        raise ValueError("bytea parameters are not supported")
    return text


def _parse_timestamp(text: str) -> dt.datetime:
    t = text.replace("T", " ", 1)
    if t.endswith(("+00", "-00")) or (len(t) > 3 and t[-3] in "+-" and t[-2:].isdigit()):
        t += ":00"
    return dt.datetime.fromisoformat(t)


def _decode_binary(raw: bytes, oid: int) -> Any:
    if oid in _INTS:
        (value,) = _INTS[oid].unpack(raw)
        return int(value)
    if oid == FLOAT8:
        return float(_F8.unpack(raw)[0])
    if oid == FLOAT4:
        return float(_F4.unpack(raw)[0])
    if oid == BOOL:
        if len(raw) != 1:
            raise ValueError("bool")
        return raw != b"\x00"
    if oid == DATE:
        (days,) = _I32.unpack(raw)
        return _EPOCH_DATE + dt.timedelta(days=days)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        (micros,) = _I64.unpack(raw)
        value = _EPOCH + dt.timedelta(microseconds=micros)
        return value
    if oid == NUMERIC:
        return _decode_binary_numeric(raw)
    if oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN, CHAR, JSON, 0):
        return raw.decode("utf-8")
    raise ValueError(f"binary parameters of type {oid} are not supported")


def _decode_binary_numeric(raw: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHH", raw, 0)
    if len(raw) != 8 + 2 * ndigits or ndigits < 0:
        raise ValueError("numeric")
    if sign == 0xC000:
        return Decimal("NaN")
    digits = struct.unpack_from(f"!{ndigits}H", raw, 8)
    value = Decimal(0)
    for i, d in enumerate(digits):
        if d > 9999:
            raise ValueError("numeric")
        value += Decimal(d) * (Decimal(10000) ** (weight - i))
    value = value.quantize(Decimal(1).scaleb(-dscale)) if dscale < 1000 else value
    return -value if sign == 0x4000 else value


def is_finite_number(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float | Decimal) and
                                      math.isfinite(float(value)))
