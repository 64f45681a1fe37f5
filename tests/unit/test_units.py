import math

import pytest

from netsim_ddp.scenario import units


@pytest.mark.parametrize("text, bits", [
    ("10gbit", 10e9), ("2.5Gbit/s", 2.5e9), ("500mbit", 500e6), ("1.25GB/s", 10e9),
    ("100kbit", 100e3), ("1Mibit", 2**20), ("12.5MB/s", 100e6), ("64 kbit", 64e3),
])
def test_rates(text, bits):
    assert math.isclose(units.parse_rate(text), bits)


@pytest.mark.parametrize("text, needle", [
    ("100mbps", "ambiguous"), ("10MBps", "ambiguous"), ("fast", "cannot read"),
    ("10gb", "'bit' for bits"), (1000, "needs a unit"), ("-1gbit", "cannot read"),
])
def test_bad_rates(text, needle):
    with pytest.raises(ValueError, match=needle):
        units.parse_rate(text)


@pytest.mark.parametrize("text, seconds", [
    ("100us", 100e-6), ("0.5ms", 0.5e-3), ("2ms", 2e-3), ("1s", 1.0), (0, 0.0), ("250µs", 250e-6),
])
def test_durations(text, seconds):
    assert math.isclose(units.parse_duration(text), seconds)


@pytest.mark.parametrize("bad", ["5", 5, "2 hours", "ms"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        units.parse_duration(bad)


@pytest.mark.parametrize("text, size", [
    ("64MiB", 64 * 2**20), ("1MB", 10**6), (1500, 1500), ("1500", 1500), ("2KiB", 2048),
])
def test_sizes(text, size):
    assert units.parse_size(text) == size


def test_bad_size():
    with pytest.raises(ValueError):
        units.parse_size("64M")  # a prefix without a unit: megabytes or mebibytes?


@pytest.mark.parametrize("text, count", [("30M", 30_000_000), ("1.5B", 1_500_000_000),
                                         ("500k", 500_000), (1234, 1234)])
def test_counts(text, count):
    assert units.parse_count(text) == count


@pytest.mark.parametrize("text, pct", [("0.1%", 0.1), ("5 %", 5.0), (0, 0.0)])
def test_percent(text, pct):
    assert units.parse_percent(text) == pct


@pytest.mark.parametrize("bad", [0.1, "0.1", "ten%"])
def test_bad_percent(bad):
    with pytest.raises(ValueError, match="percent"):
        units.parse_percent(bad)


def test_formatting_round_trips():
    assert units.parse_rate(units.format_rate(2.5e9)) == 2.5e9
    assert units.format_duration(0.0005) == "500us"
    assert units.format_size(3 * 2**20) == "3MiB"
