"""The bench's read-time plot gives every reader a line of its own."""

from __future__ import annotations

from mooncake_assets.bench.report import _LINES, _SHORT
from mooncake_assets.bench.union_read import READERS


def test_every_reader_has_a_line_style_and_colour_of_its_own():
    assert {r for r, _, _ in _LINES} == set(_SHORT) >= set(READERS)
    assert len({(style, colour) for _, style, colour in _LINES}) == len(_LINES)
    assert len({colour for _, _, colour in _LINES}) == len(_LINES)
