"""Units people write in scenario files: rates, durations, sizes, counts, percentages.

Every parser takes a string (or a plain number where that is unambiguous) and returns a number
in a base unit: bits per second, seconds, bytes, a count, a percentage. A bad value raises
`ValueError` whose message says what forms are accepted, so the scenario loader can show it.
Every result is finite (a `1e999` in a string is refused, never infinity), and sizes and counts
are whole, not negative, and fit a signed 64-bit integer, as the kernel and torch hold them.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

# What tc counts for a full-sized TCP segment besides its payload: the goodput a link allows,
# the bytes the crossing check expects and the background flows' byte counts all use these.
ETHERNET_HEADER = 14  # bytes tc counts on top of the IP packet
TCP_IP_HEADERS = 52  # IPv4 20 + TCP 20 + the timestamp option 12 (Linux turns it on)


def header_factor(mtu: int) -> float:
    """Wire bytes per TCP payload byte in full-sized segments, as tc counts them."""
    return (mtu + ETHERNET_HEADER) / (mtu - TCP_IP_HEADERS)


_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

# Decimal prefixes for rates and counts (as tc and networking do); binary ones spelled out.
_DECIMAL = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}

_RATE = re.compile(
    rf"^{_NUMBER}\s*(?P<prefix>[kmgt]i?)?(?P<unit>bit|b)(?:/s|ps)?$", re.IGNORECASE
)
_DURATION = re.compile(rf"^{_NUMBER}\s*(?P<unit>ns|us|µs|ms|s|sec|min)$", re.IGNORECASE)
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0}
_SIZE = re.compile(rf"^{_NUMBER}\s*(?P<prefix>[kmgt]i?)?(?P<unit>b|bytes?)?$", re.IGNORECASE)
_COUNT = re.compile(rf"^{_NUMBER}\s*(?P<prefix>[kmgtb])?$", re.IGNORECASE)
_PERCENT = re.compile(rf"^{_NUMBER}\s*%$")

RATE_FORMS = "'500mbit', '10gbit', '2.5Gbit/s' (bits) or '1.25GB/s' (bytes)"
DURATION_FORMS = "'100us', '0.5ms', '2ms', '1s'"
SIZE_FORMS = "'1500', '64KiB', '64MiB' or '1MB'"
COUNT_FORMS = "'30M', '1.5B', '500k' or a plain integer"
PERCENT_FORMS = "'0.1%' or '5%'"

MAX_INTEGER = 2**63 - 1  # sizes and counts: the kernel's and torch's 64-bit fields


def _multiplier(prefix: str | None) -> float:
    prefix = (prefix or "").lower()
    return _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix]


def _finite_number(value: object, forms: str) -> float:
    """A plain number (never a bool: TOML's `true` is not 1), finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number or a string like {forms}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number; write e.g. {forms}")
    return number


def _scaled(match: re.Match[str], scale: float, value: object, forms: str) -> float:
    """The number in a matched string times its unit's scale, refused unless finite."""
    number = float(match["num"]) * scale
    if not math.isfinite(number):
        raise ValueError(f"{value!r} overflows to infinity; write e.g. {forms}")
    return number


def _whole(number: float, value: object, what: str) -> int:
    """A size or count as an int, within the 64-bit range the kernel and torch use."""
    if number < 0:
        raise ValueError(f"a {what} cannot be negative, got {value!r}")
    if number > MAX_INTEGER:
        raise ValueError(f"{value!r} is too large for a {what} (at most {MAX_INTEGER})")
    return int(round(number))


def parse_rate(value: object) -> float:
    """Rate in bits per second. `bit` means bits and `B` bytes; tc's `mbps` is refused.

    tc reads `mbps` as megaBYTES per second, and most people read it as megabits: an
    ambiguity that silently costs a factor of 8, so it is an error here.
    """
    if not isinstance(value, str):
        raise ValueError(f"a rate needs a unit, e.g. {RATE_FORMS}; got {value!r}")
    text = value.strip()
    if re.search(r"[kmgt]?i?bps$", text, re.IGNORECASE) and not re.search(r"bitps$", text, re.I):
        raise ValueError(
            f"{value!r} is ambiguous (tc reads 'mbps' as megabytes/s, most people as "
            "megabits/s); write '100mbit' for bits or '12.5MB/s' for bytes"
        )
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"cannot read {value!r} as a rate; write e.g. {RATE_FORMS}")
    unit = match["unit"]
    bits = 1 if unit.lower() == "bit" else 8
    if unit == "b":  # lower-case b alone: could be bits or bytes
        raise ValueError(f"{value!r}: write 'bit' for bits or 'B' for bytes, e.g. {RATE_FORMS}")
    return _scaled(match, _multiplier(match["prefix"]) * bits, value, RATE_FORMS)


def parse_duration(value: object) -> float:
    """Duration in seconds. A bare 0 is allowed (no unit needed for nothing)."""
    if not isinstance(value, str):
        if _finite_number(value, DURATION_FORMS) == 0:
            return 0.0
        raise ValueError(f"a duration needs a unit, e.g. {DURATION_FORMS}; got {value!r}")
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"cannot read {value!r} as a duration; write e.g. {DURATION_FORMS}")
    return _scaled(match, _SECONDS[match["unit"].lower()], value, DURATION_FORMS)


def parse_size(value: object) -> int:
    """Size in bytes. Plain integers are bytes; `KiB`/`MiB` are binary, `KB`/`MB` decimal."""
    if not isinstance(value, str):
        number = _finite_number(value, SIZE_FORMS)
        if number != int(number):
            raise ValueError(f"a size in bytes must be whole, got {value!r}")
        return _whole(number, value, "size")
    match = _SIZE.match(value.strip())
    if not match or (match["prefix"] and not match["unit"]):
        raise ValueError(f"cannot read {value!r} as a size; write e.g. {SIZE_FORMS}")
    return _whole(_scaled(match, _multiplier(match["prefix"]), value, SIZE_FORMS), value, "size")


def parse_count(value: object) -> int:
    """A count such as a parameter count: `30M`, `1.5B` (billion), `500k`."""
    if not isinstance(value, str):
        number = _finite_number(value, COUNT_FORMS)
        if number != int(number):
            raise ValueError(f"a count must be whole, got {value!r}")
        return _whole(number, value, "count")
    match = _COUNT.match(value.strip())
    if not match:
        raise ValueError(f"cannot read {value!r} as a count; write e.g. {COUNT_FORMS}")
    prefix = (match["prefix"] or "").lower()
    scale = _DECIMAL["g" if prefix == "b" else prefix]
    return _whole(_scaled(match, scale, value, COUNT_FORMS), value, "count")


def parse_percent(value: object) -> float:
    """A percentage as a number of percent (`'0.1%'` -> 0.1). A bare 0 is allowed."""
    if not isinstance(value, str):
        if _finite_number(value, PERCENT_FORMS) == 0:
            return 0.0
        raise ValueError(f"write a percentage with its sign, e.g. {PERCENT_FORMS}; got {value!r}")
    match = _PERCENT.match(value.strip())
    if not match:
        raise ValueError(f"cannot read {value!r} as a percentage; write e.g. {PERCENT_FORMS}")
    return _scaled(match, 1.0, value, PERCENT_FORMS)


def format_rate(bits_per_second: float) -> str:
    for prefix, scale in (("t", 1e12), ("g", 1e9), ("m", 1e6), ("k", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:g}{prefix}bit"
    return f"{bits_per_second:g}bit"


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g}{unit}"
    return f"{seconds / 1e-9:.4g}ns"


def format_size(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size:.0f}B"


# -- the same units as typed fields of the configuration models -------------------------------

def unit_annotations(parser: Any, forms: str, example: str, suffix: str) -> tuple[Any, ...]:
    """A unit string parsed to a number, shown as a string in the schema and written back to
    JSON with its unit, so a dumped scenario loads again."""
    return (
        BeforeValidator(parser),
        PlainSerializer(lambda value: f"{value!r}{suffix}", return_type=str, when_used="json"),
        WithJsonSchema({"type": ["string", "number"], "description": f"e.g. {forms}",
                        "examples": [example]}),
    )


Rate = Annotated[float, *unit_annotations(parse_rate, RATE_FORMS, "1gbit", "bit")]
Duration = Annotated[float, *unit_annotations(parse_duration, DURATION_FORMS, "100us", "s"),
                     Field(ge=0)]
Percent = Annotated[float, *unit_annotations(parse_percent, PERCENT_FORMS, "0.1%", "%"),
                    Field(ge=0, le=100)]
Count = Annotated[int, BeforeValidator(parse_count, json_schema_input_type=int | str)]
Size = Annotated[int, BeforeValidator(parse_size, json_schema_input_type=int | str)]
