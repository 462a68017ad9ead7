"""The Lsn value type: Postgres's ``pg_lsn`` text ``X/Y`` (high/low 32 bits in hex) and back."""

import pytest

from mooncake_assets.engine.lsn import MAX_LSN, Lsn

VECTORS = [
    ("0/0", 0),
    ("0/1", 1),
    ("0/16B3748", 0x16B3748),
    ("1/AB", 0x1_0000_00AB),
    ("16/B374D848", 0x16_B374D848),
    ("0/FFFFFFFF", 0xFFFFFFFF),
    ("1/0", 1 << 32),
    ("FFFFFFFF/FFFFFFFF", MAX_LSN),
]


@pytest.mark.parametrize("text,value", VECTORS)
def test_parse_and_format(text, value):
    assert Lsn.parse(text) == value
    assert int(Lsn.parse(text)) == value and type(int(Lsn.parse(text))) is int
    assert str(Lsn(value)) == text
    assert f"{Lsn(value)}" == text
    assert Lsn(text) == value


def test_parse_accepts_lower_case_leading_zeros_and_blanks():
    assert Lsn.parse(" 0/00abc ") == 0xABC
    assert Lsn.parse("000016/b374d848") == 0x16_B374D848


@pytest.mark.parametrize("bad", ["12345", "", "0/", "/1", "1/2/3", "G/0", "0/x", "100000000/0", "0/100000000", "-1/0"])
def test_bad_text_names_it(bad):
    with pytest.raises(ValueError, match="expected an LSN like '0/16B3748', got " + repr(bad).replace("/", "/")):
        Lsn.parse(bad)


def test_not_text():
    with pytest.raises(ValueError, match="expected an LSN"):
        Lsn.parse(None)  # type: ignore[arg-type]


def test_range():
    with pytest.raises(ValueError, match="outside"):
        Lsn(-1)
    with pytest.raises(ValueError, match="outside"):
        Lsn(MAX_LSN + 1)


def test_compare_and_arithmetic():
    a, b = Lsn.parse("0/FFFFFFFF"), Lsn.parse("1/0")
    assert a < b and b > a and a != b and max(a, b) is b
    assert sorted([b, a]) == [a, b]
    assert b - a == 1 and type(b - a) is int  # a distance in bytes
    assert Lsn(a + 1) == b
    assert {a: 1}[0xFFFFFFFF] == 1  # hashes as its position
    assert repr(b) == "Lsn('1/0')"
    assert f"{b:d}" == str(1 << 32)  # a numeric format spec formats the byte position


def test_lsn_text():
    assert str(Lsn(0)) == "0/0"
    assert str(Lsn(0x1_0000_00AB)) == "1/AB"
    assert Lsn.parse("16/B374D848") == 0x16_B374D848
    for v in (0, 1, 0xFFFFFFFF, 1 << 32, (1 << 64) - 1):
        assert Lsn.parse(str(Lsn(v))) == v
    with pytest.raises(ValueError, match="expected an LSN"):
        Lsn.parse("12345")
