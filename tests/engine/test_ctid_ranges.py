"""plan_ctid_ranges (pure): the ranges cover pages [0, ∞) in order, without overlap or gaps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mooncake_assets.engine.cdc.ranges import CtidRange, plan_ctid_ranges


@given(st.integers(-5, 10**7), st.integers(-2, 64), st.integers(0, 5000))
def test_ranges_cover_every_page_once(pages, parts, min_pages):
    rs = plan_ctid_ranges(pages, parts, min_pages)
    assert rs[0].start == 0 and rs[-1].end is None  # from page 0, open-ended: pages added later are covered
    for a, b in zip(rs, rs[1:]):
        assert a.end == b.start and a.start < a.end  # contiguous, no overlap, none empty
    assert 1 <= len(rs) <= max(1, parts)
    if pages > 0 and len(rs) > 1:
        assert rs[-1].start < pages  # the last range holds pages of the heap as it was read
        assert all(r.end - r.start >= max(1, min_pages) for r in rs[:-1])


def test_small_cases():
    assert plan_ctid_ranges(0, 4) == [CtidRange(0, None)]  # an empty table: one range
    assert plan_ctid_ranges(100, 1) == [CtidRange(0, None)]
    assert plan_ctid_ranges(10, 4, min_pages=8) == [CtidRange(0, None)]  # under two ranges of min_pages
    assert plan_ctid_ranges(10, 2) == [CtidRange(0, 5), CtidRange(5, None)]
    assert plan_ctid_ranges(3, 8) == [CtidRange(0, 1), CtidRange(1, 2), CtidRange(2, None)]


def test_predicate_text():
    from psycopg import sql  # noqa: F401 (as_string needs no connection for these literals)

    assert CtidRange(0, None).predicate().as_string(None) == "TRUE"
    assert CtidRange(0, 7).predicate().as_string(None) == "ctid < '(7,0)'::tid"
    assert CtidRange(3, None).predicate().as_string(None) == "ctid >= '(3,0)'::tid"
    assert CtidRange(3, 7).predicate().as_string(None) == "ctid >= '(3,0)'::tid AND ctid < '(7,0)'::tid"
    assert str(CtidRange(3, None)) == "pages [3, ∞)"
