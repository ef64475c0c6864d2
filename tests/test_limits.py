"""The limit parser as Python sees it: the one C parser through cffi."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpulimit.limits import (
    LimitError,
    MemoryLimit,
    ascii_number,
    cores_forms,
    format_bytes,
    memory_forms,
    memory_in_units,
    parse_cores,
    parse_memory,
)

GiB = 1 << 30
MiB = 1 << 20


@pytest.mark.parametrize(
    "text, limit_bytes, described",
    [
        ("1GiB", GiB, "1 GiB"),
        ("4Gi", 4 * GiB, "4 GiB"),
        ("3000m", 3000 * MiB, "3000 MiB"),  # HAMi: m is MiB
        ("512Mi", 512 * MiB, "512 MiB"),
        ("4G", 4_000_000_000, "3.7 GiB"),   # decimal units are decimal
        ("1073741824", GiB, "1 GiB"),
        (" 2GiB ", 2 * GiB, "2 GiB"),
    ],
)
def test_sizes(text, limit_bytes, described):
    limit = parse_memory(text)
    assert limit == MemoryLimit(bytes=limit_bytes, ppm=0)
    assert limit.describe() == described


@pytest.mark.parametrize(
    "text, ppm, described",
    [
        ("50%", 500_000, "50% of the device"),
        ("0.2", 200_000, "20% of the device"),   # Run:ai --gpu 0.2
        ("12.5%", 125_000, "12.5% of the device"),
        ("1.0", 1_000_000, "100% of the device"),
    ],
)
def test_shares(text, ppm, described):
    limit = parse_memory(text)
    assert limit == MemoryLimit(bytes=0, ppm=ppm)
    assert limit.describe() == described


@pytest.mark.parametrize("text", ["lots", "8GBx", "1.5g?", "", "   ", "GiB", "1 GiB"])
def test_rejects_what_is_not_a_size(text):
    with pytest.raises(LimitError) as info:
        parse_memory(text)
    assert str(info.value).startswith(f"--memory: {text!r} is not a valid value; accepted forms: ")


def test_a_negative_size_is_said_to_be_negative():
    with pytest.raises(LimitError) as info:
        parse_memory("-1GiB")
    assert str(info.value).startswith("--memory: '-1GiB' is negative (a limit is a size or a share above "
                                      "zero); accepted forms: ")


@pytest.mark.parametrize("text", ["0", "0%", "101%", "99999999999999999999999"])
def test_rejects_what_is_out_of_range(text):
    with pytest.raises(LimitError, match="out of range"):
        parse_memory(text)


def test_error_names_the_source_and_shows_the_forms_from_c():
    with pytest.raises(ValueError) as info:
        parse_memory("lots", source="VGPULIMIT_MEMORY_1")
    message = str(info.value)
    assert message.startswith("VGPULIMIT_MEMORY_1: 'lots' is not a valid value")
    assert message.endswith(memory_forms())
    assert "3000m" in memory_forms() and "50%" in memory_forms()
    assert "\n" not in message


def test_nul_in_text_is_not_silently_cut():
    with pytest.raises(LimitError):
        parse_memory("1GiB\0junk")


@pytest.mark.parametrize("text, pct", [("30", 30), ("30%", 30), ("1", 1), ("100%", 100)])
def test_cores(text, pct):
    assert parse_cores(text) == pct


@pytest.mark.parametrize("text", ["0", "101", "abc", "30.5", "", "1000%"])
def test_cores_rejects(text):
    with pytest.raises(LimitError) as info:
        parse_cores(text, source="VGPULIMIT_CORES")
    assert str(info.value).startswith(f"VGPULIMIT_CORES: {text!r} is ")
    assert str(info.value).endswith(cores_forms())


@pytest.mark.parametrize("text, pct", [("0030", 30), ("0030%", 30), ("0100", 100),
                                       (" 001 ", 1), ("0" * 100 + "7", 7)])
def test_cores_with_leading_zeros_are_the_number(text, pct):
    assert parse_cores(text) == pct


@pytest.mark.parametrize("text", ["000", "0000%", "01000", "0" * 100])
def test_cores_with_leading_zeros_are_still_checked(text):
    with pytest.raises(LimitError, match="out of range"):
        parse_cores(text)


@pytest.mark.parametrize("text, limit", [
    ("0001GiB", MemoryLimit(bytes=GiB, ppm=0)), ("0" * 100 + "1GiB", MemoryLimit(bytes=GiB, ppm=0)),
    ("050%", MemoryLimit(bytes=0, ppm=500_000)), ("00.5", MemoryLimit(bytes=0, ppm=500_000)),
])
def test_memory_with_leading_zeros_is_the_number(text, limit):
    assert parse_memory(text) == limit


@pytest.mark.parametrize("text", ["000", "00GiB", "000%", "00.0"])
def test_memory_of_zeros_is_still_zero(text):
    with pytest.raises(LimitError, match="out of range"):
        parse_memory(text)


@pytest.mark.parametrize("parse, text", [(parse_cores, "３０"), (parse_cores, "3０%"),
                                         (parse_memory, "１GiB"), (parse_memory, "0.５")])
def test_only_ascii_digits_are_digits(parse, text):
    with pytest.raises(LimitError, match="not a valid value"):
        parse(text)


@pytest.mark.parametrize("text, below, number", [
    ("7", 16, 7), ("0015", 16, 15), ("0" * 5000 + "3", 16, 3), ("16", 16, None),
    ("9" * 5000, 16, None), ("²", 16, None), ("１", 16, None), ("٣", 16, None), ("", 16, None),
    ("-1", 16, None), (" 1", 16, None),
])
def test_ascii_number(text, below, number):
    assert ascii_number(text, below) == number


def test_cap_bytes_resolves_against_the_device():
    assert parse_memory("50%").cap_bytes(16 * GiB) == 8 * GiB
    assert parse_memory("4GiB").cap_bytes(16 * GiB) == 4 * GiB
    assert parse_memory("4GiB").cap_bytes(2 * GiB) == 2 * GiB   # never above the device


@given(st.integers(min_value=1, max_value=2**62))
def test_any_byte_count_parses_to_itself(count):
    assert parse_memory(str(count)) == MemoryLimit(bytes=count, ppm=0)


@given(st.integers(min_value=1, max_value=100))
def test_any_percentage_is_a_share(pct):
    assert parse_memory(f"{pct}%").ppm == pct * 10_000
    assert parse_cores(f"{pct}%") == pct


@pytest.mark.parametrize(
    "count, text",
    [(0, "0 B"), (512, "512 B"), (1536 * MiB, "1536 MiB"), (GiB + 1, "1.0 GiB"), (2**40, "1 TiB")],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "KiB": 2**10, "MiB": 2**20,
         "GiB": 2**30, "TiB": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
         "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KB": 10**3, "MB": 10**6,
         "GB": 10**9, "TB": 10**12}


@given(st.integers(min_value=1, max_value=2**20), st.sampled_from(sorted(UNITS)))
def test_a_count_of_units_is_that_many_bytes(count, unit):
    assert parse_memory(f"{count}{unit}") == MemoryLimit(bytes=count * UNITS[unit], ppm=0)


@given(st.integers(min_value=1, max_value=999_999))
def test_a_fraction_is_parts_per_million_of_the_device(ppm):
    text = f"0.{ppm:06d}".rstrip("0")
    assert parse_memory(text) == MemoryLimit(bytes=0, ppm=ppm)
    assert parse_memory(text).cap_bytes(10**6) == ppm


@given(st.text(max_size=12))
def test_anything_else_is_a_clear_refusal_or_a_limit(text):
    """Whatever the text, the parser gives a limit or a LimitError that lists
    the accepted forms (or, for a number above one with no unit, names the
    unit it lacks), never another exception."""
    try:
        limit = parse_memory(text)
    except LimitError as err:
        assert ("accepted forms" in str(err) and "4Gi" in str(err)) or "sizes need a unit" in str(err)
    else:
        assert (limit.bytes > 0) != (limit.ppm > 0)


@pytest.mark.parametrize("count, unit, expected", [
    ("16", "128Mi", 16 * 128 * MiB), ("4", "1GiB", 4 * GiB), (" 2 ", "1g", 2 * GiB),
])
def test_memory_in_units_as_gpushare_counts(count, unit, expected):
    assert memory_in_units(count, unit) == MemoryLimit(bytes=expected, ppm=0)


@pytest.mark.parametrize("count, unit, source", [
    ("0", "1GiB", "--memory-units"), ("1.5", "1GiB", "--memory-units"),
    ("two", "1GiB", "--memory-units"), ("4", "50%", "--unit"), ("4", "lots", "--unit"),
])
def test_memory_in_units_refuses_with_the_flag_named(count, unit, source):
    with pytest.raises(LimitError) as err:
        memory_in_units(count, unit)
    assert str(err.value).startswith(f"{source}: ")
