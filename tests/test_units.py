import pytest

from aifabric.fabric.errors import UnitError
from aifabric.fabric.units import (
    LIMIT,
    format_rate,
    format_size,
    format_time,
    parse_rate,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("400G", 400 * 10**9),
        ("400Gbps", 400 * 10**9),
        ("400 Gb/s", 400 * 10**9),
        ("1.6T", 1_600 * 10**9),
        ("100M", 10**8),
        ("25Gbit/s", 25 * 10**9),
        (10**9, 10**9),
        ("1e9", 10**9),
    ],
)
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    ("text", "ns"),
    [("2us", 2000), ("1.5ms", 1_500_000), ("100ns", 100), ("1s", 10**9), ("250", 250), (7, 7)],
)
def test_parse_time(text, ns):
    assert parse_time(text) == ns


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("32MiB", 32 * 2**20), ("4KiB", 4096), ("1MB", 10**6), ("4096", 4096), ("1.5KiB", 1536)],
)
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bps", [400 * 10**9, 100 * 10**9, 1_600 * 10**9, 25 * 10**6, 12_500])
def test_rate_round_trip(bps):
    assert parse_rate(format_rate(bps)) == bps


@pytest.mark.parametrize("ns", [1, 999, 1500, 2_000_000, 3 * 10**9])
def test_time_round_trip(ns):
    assert parse_time(format_time(ns)) == ns


@pytest.mark.parametrize("nbytes", [1, 4096, 32 * 2**20, 3 * 2**30, 1500])
def test_size_round_trip(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (64 * 2**20, "64MiB"),
        (2_000_000, "2MB"),
        (2_048_000_000, "2.05GB"),
        (3000 * 2**20, "3.15GB"),
        (2**60, "1024PiB"),
    ],
)
def test_size_takes_a_binary_unit_only_below_1024_of_it(nbytes, text):
    # 2,048,000,000 bytes (a 1,024-rank permutation of 2 MB flows) printed '2000000KiB'
    assert format_size(nbytes) == text


@pytest.mark.parametrize(
    ("parse", "text", "fragment"),
    [
        (parse_rate, "400X", "is not a rate"),
        (parse_rate, "fast", "is not a rate"),
        (parse_rate, "0G", "must be positive"),
        (parse_rate, "", "is not a rate"),
        (parse_time, "0.5ns", "whole number of nanoseconds"),
        (parse_time, "3 parsecs", "is not a time"),
        (parse_time, "-3us", "is not a time"),
        (parse_size, "12 apples", "is not a size"),
        (parse_size, "0.5B", "whole number of bytes"),
        (parse_rate, True, "is not a rate"),
        (parse_size, None, "is not a size"),
        (parse_rate, float("inf"), "is not a finite rate"),
        (parse_time, float("nan"), "is not a finite time"),
        (parse_size, float("-inf"), "is not a finite size"),
        (parse_rate, "1e999999999G", "too large for a rate: the limit is 9.2 Ebit/s"),
        (parse_time, "1e12s", "too large for a time: the limit is about 292 years"),
        (parse_size, "1e30", "too large for a size: the limit is 8 EiB"),
        (parse_size, 10**40, "too large for a size"),
        (parse_time, "1e-999999999s", "too small for a time"),
        (parse_size, "1" * 5000, "..."),
    ],
)
def test_nonsense_is_rejected_in_one_sentence(parse, text, fragment):
    with pytest.raises(UnitError) as err:
        parse(text)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 200


@pytest.mark.parametrize(
    ("parse", "largest"),
    [(parse_rate, f"{LIMIT}bps"), (parse_time, f"{LIMIT}ns"), (parse_size, f"{LIMIT}B")],
)
def test_the_limit_is_the_largest_int64(parse, largest):
    assert parse(largest) == LIMIT == 2**63 - 1
    with pytest.raises(UnitError, match="too large"):
        parse(largest.replace(str(LIMIT), str(LIMIT + 1)))
