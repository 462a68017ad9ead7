"""The source sessions' pinned settings (engine/pg/conninfo.py): one definition for the walsender,
the initial copy, the generated-columns session (OUTPUT_SETTINGS) and every other session (PG_OPTIONS)."""

from psycopg.conninfo import conninfo_to_dict

from mooncake_assets.engine.pg.conninfo import (
    OUTPUT_SETTINGS,
    PG_OPTIONS,
    SESSION_SETTINGS,
    options_string,
    with_options,
)
from mooncake_assets.engine.pg.conninfo import OUTPUT_SETTINGS as DECODER_SETTINGS


def test_one_definition_of_the_session_settings():
    assert DECODER_SETTINGS is OUTPUT_SETTINGS
    assert OUTPUT_SETTINGS == {**SESSION_SETTINGS, "search_path": "pg_catalog"}
    assert PG_OPTIONS == options_string(SESSION_SETTINGS)
    assert "search_path" not in SESSION_SETTINGS  # sessions resolving a user's table name keep the role's
    for k in ("DateStyle", "TimeZone", "IntervalStyle", "bytea_output", "extra_float_digits", "lc_monetary"):
        assert k in SESSION_SETTINGS


def test_with_options_appends_once_and_wins():
    once = with_options("host=h dbname=d")
    assert conninfo_to_dict(once)["options"] == PG_OPTIONS
    assert with_options(once) == once  # applied twice: not repeated
    both = conninfo_to_dict(with_options(once, OUTPUT_SETTINGS))["options"]
    assert both == options_string(OUTPUT_SETTINGS)  # only search_path added
    user = conninfo_to_dict(with_options("host=h options='-c TimeZone=Europe/Paris'"))["options"]
    assert user.startswith("-c TimeZone=Europe/Paris ") and user.endswith(PG_OPTIONS)  # ours come last: they win
