"""The delete-paths harness (bench/delete_paths.py) at a tiny size: every way of applying deletes,
the engine's union read among them, answers the scan and the filter query exactly as the clean file."""

from __future__ import annotations

from mooncake_assets.bench import delete_paths


def test_every_approach_answers_as_the_clean_scan(capsys):
    for extra in ([], ["--clustered", "--mem", "50"]):
        delete_paths.main(["--rows", "20000", "--files", "2", "--share", "0.1", "--rounds", "1", *extra])
        out = capsys.readouterr().out
        lines = [ln for ln in out.splitlines() if ln.startswith("  ")]
        names = {ln.split()[0] for ln in lines}
        assert {"clean", "arrow_keepcol", "hybrid_rowgroups", "lazy_get_bit", "union_query"} <= names
        assert len(lines) == 2 * len(names)  # scan and filter
        assert "MISMATCH" not in out
        assert all(ln.endswith(" ok") or "floor" in ln for ln in lines)
