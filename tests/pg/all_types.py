"""The all-types table of the Postgres tests: one column per mapped type, rows of edge values
(tests/pg/test_describe_table.py, tests/pg/test_replication_connection.py,
tests/integration/test_status_trust.py)."""

from __future__ import annotations

ALL_TYPES_DDL = """
CREATE TABLE public.all_types (
    id        int PRIMARY KEY,
    b         boolean,
    i2        smallint,
    i4        integer,
    i8        bigint,
    f4        real,
    f8        double precision,
    n12_2     numeric(12,2),
    n38       numeric(38,10),
    n_free    numeric,
    n_big     numeric(50,5),
    t         text,
    vc        varchar(20),
    c5        char(5),
    nm        name,
    d         date,
    ts        timestamp,
    tstz      timestamptz,
    tm        time,
    u         uuid,
    j         json,
    jb        jsonb,
    by        bytea,
    gen       bigint GENERATED ALWAYS AS (i4::bigint * 2) STORED
)
"""


ALL_TYPES_ROWS = """
INSERT INTO all_types (id, b, i2, i4, i8, f4, f8, n12_2, n38, n_free, n_big, t, vc, c5, nm, d, ts, tstz, tm, u, j, jb, by)
VALUES
 (1, true, 32767, 2147483647, 9223372036854775807, 1.1, 0.1, 1234567890.12, 1234567890123456789012345678.0123456789,
  123456789012345678901234567890123456789012345678901234567890.000000000000000000001, 1.5,
  'héllo wörld ✓ 😀', 'abc', 'ab', 'pg_name', '2024-02-29', '2024-02-29 13:14:15.123456',
  '2024-07-01 12:00:00.5+00', '23:59:59.999999', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
  '{"a": [1, 2, {"b": null}]}', '{"z": 1, "a": "ü"}', '\\x00ff10deadbeef'),
 (2, false, -32768, -2147483648, -9223372036854775808, 'NaN', 'Infinity', -0.01, -1, 'NaN', -99999.99999,
  '', '', '', '', '1970-01-01', '1970-01-01 00:00:00', '1999-12-31 23:59:59+05:30', '00:00:00',
  '00000000-0000-0000-0000-000000000000', '[]', 'null', '\\x'),
 (3, NULL, NULL, NULL, NULL, '-Infinity', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, true, 0, 0, 0, 3.4028235e38, 1.7976931348623157e308, 0, 0.0000000001, '-0.000000000000000000000000000000000000001',
  0, E'line1\\nline2, "quoted",\\ttab \\\\ backslash', 'x,y', 'a"b', 'n', '0001-01-01',
  '0001-01-01 00:00:00', '2262-04-11 23:47:16.854775+00', '12:00:00.000001',
  'ffffffff-ffff-ffff-ffff-ffffffffffff', '"\\u00e9"', '{"k": "v\\"q"}', '\\x5c78'),
 (5, false, 1, 1, 1, 1e-45, 5e-324, 9999999999.99, 9999999999999999999999999999.9999999999, '1e-30',
  1234567890123456789012345678901234567890123.45678, 'NULL', 'null', '  ', 'x', '9999-12-31',
  '9999-12-31 23:59:59.999999', '1901-12-13 20:45:52-03', '01:02:03', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12',
  'null', '{}', '\\x0a0d09')
"""
