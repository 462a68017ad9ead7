"""``mooncake query --format table`` equals psql's aligned output, character for character, for values
with line breaks, wide (CJK) and combining characters, NULLs, numbers and headers of odd padding."""

from __future__ import annotations

import os
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from mooncake_assets.engine.read.render import display_width, to_table

CASES = [
    # (SQL for psql, the same result as Arrow)
    (
        "SELECT * FROM (VALUES ('line1' || chr(10) || 'line2', 1, '日本語テキスト', 'x', 12.5::numeric(6,1)),"
        " ('z', 22, 'é', 'yyyyyy', NULL)) v(a, b, c, hdr, n)",
        pa.table(
            {
                "a": ["line1\nline2", "z"],
                "b": pa.array([1, 22], pa.int32()),
                "c": ["日本語テキスト", "é"],
                "hdr": ["x", "yyyyyy"],
                "n": pa.array([Decimal("12.5"), None], pa.decimal128(6, 1)),
            }
        ),
    ),
    (
        "SELECT * FROM (VALUES (1, 'a' || chr(10) || 'bb' || chr(10)), (NULL, NULL)) v(b, last)",
        pa.table({"b": pa.array([1, None], pa.int32()), "last": ["a\nbb\n", None]}),
    ),
    (
        "SELECT * FROM (VALUES ('ab', 'abcdefg', 'e' || chr(769) || 'x', 'Ｆｕｌｌ')) v(ab, x, comb, wide)",
        pa.table({"ab": ["ab"], "x": ["abcdefg"], "comb": ["e\u0301x"], "wide": ["Ｆｕｌｌ"]}),
    ),
    ("SELECT * FROM (VALUES (1)) v(n) WHERE false", pa.table({"n": pa.array([], pa.int32())})),
]


def _psql() -> str:
    found = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    assert found, "psql not found"
    return str(found)


@pytest.mark.parametrize("sql,arrow", CASES)
def test_aligned_table_equals_psql(pg_dsn, sql, arrow):
    env = dict(os.environ, PGCLIENTENCODING="UTF8", LC_ALL="C.UTF-8")
    want = subprocess.run(
        [_psql(), "--no-psqlrc", "-d", pg_dsn, "-c", sql], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert to_table(arrow) + "\n" == want, (to_table(arrow), want)  # psql ends with an empty line


def test_display_width():
    assert [display_width(s) for s in ("abc", "日本", "e\u0301", "Ｆ", "")] == [3, 4, 1, 2, 0]
