"""Passwords kept out of messages (``engine/pg/conninfo.py``): every shape of DSN libpq reads (PG docs,
"libpq: Connection Strings": key/value strings with quoted and backslash-escaped values, URIs with the
password in the user info or a ``password=`` query parameter) and the shapes it refuses (an unterminated
quote, a space or an unencoded character in a URI, ``PASSWORD=``); and the Iceberg catalog's login
failure: one line naming the catalog, with the catalog's hint, not the source's."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from mooncake_assets.engine.pg import conninfo
from mooncake_assets.engine.pg.conninfo import (
    CATALOG_HINT,
    PASSWORD_HINT,
    catalog_error,
    connect_error,
    dsn_problem,
    redact,
    scrub,
    split_password,
    with_password_hint,
)


def _problem(dsn: str) -> str:
    out = dsn_problem(dsn)
    assert out is not None, dsn
    return out


# ------------------------------------------------------------------------------------ shapes, one by one
def test_unterminated_quote_masks_the_rest_of_the_string():
    out = _problem("host=127.0.0.1 password='Top Secret9 x")
    assert "unterminated quoted string" in out
    assert "Secret9" not in out and "Top" not in out and " x" not in out, out
    assert out.startswith("DSN host=127.0.0.1 password='******** is not valid"), out


def test_quoted_value_with_escaped_quote_and_spaces():
    dsn = "host=h password = 'Qa\\'b c\\\\d' dbname=x"
    assert conninfo_to_dict(dsn)["password"] == "Qa'b c\\d"  # libpq: \' and \\ inside single quotes
    out, pw = split_password(dsn)
    assert pw == "Qa'b c\\d" and "Qa" not in str(out)
    text = scrub(f"cannot connect to {dsn}: timeout")
    assert "Qa'b" not in text and "Qa\\'b" not in text and "c\\\\d" not in text, text


def test_unquoted_value_with_escaped_space():
    dsn = "host=h password=Zz\\ top\\ 9 dbname=x"
    assert conninfo_to_dict(dsn)["password"] == "Zz top 9"
    split_password(dsn)
    assert "top" not in scrub(f"bad DSN {dsn}") and "Zz top 9" not in scrub("Zz top 9")


def test_upper_case_key_refused_by_libpq_still_masked():
    with pytest.raises(psycopg.ProgrammingError, match='invalid connection option "PASSWORD"'):
        conninfo_to_dict("host=h PASSWORD=Upp3rCase")  # libpq's keywords are lower case
    out = _problem("host=h PASSWORD=Upp3rCase")
    assert "Upp3rCase" not in out and "PASSWORD=********" in out, out
    assert "M1xed" not in _problem("host=h Password='M1xed case'")


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://u:Sp ace9@h/db", "Sp ace9"),  # libpq echoes it: unexpected spaces found in "…"
        ("postgresql://u:Pct%zzBad@h/db", "Pct%zzBad"),  # invalid percent-encoded token: "…"
        ("postgresql://h/db?password=Qp ace9", "Qp ace9"),
        ("postgresql://h/db?sslmode=disable&password=Qpct%zz", "Qpct%zz"),
    ],
)
def test_uri_errors_that_echo_the_password(dsn, secret):
    with pytest.raises(psycopg.ProgrammingError) as e:
        conninfo_to_dict(dsn)
    out = _problem(dsn)
    assert secret not in out and secret not in scrub(str(e.value)), out


@pytest.mark.parametrize(
    ("dsn", "secret", "libpq_reads"),
    [
        ("postgresql://u:Pw%2Fenc%40x@h/db", "Pw/enc@x", "Pw/enc@x"),
        ("postgresql://u:At@sign9@h/db", "At@sign9", "At"),  # libpq: password "At", host "sign9@h"
        ("postgresql://u:Sl/ash9x@h/db", "Sl/ash9x", None),  # libpq: host "u", port "Sl", dbname "ash9x@h/db"
        ("postgresql://h/db?password=Qu%C3%A9ry9", "Quéry9", "Quéry9"),
        ("postgresql://u:Q%3Fm%23k@h:5432,h2:5433/db", "Q?m#k", "Q?m#k"),
    ],
)
def test_uri_passwords(dsn, secret, libpq_reads):
    assert conninfo_to_dict(dsn).get("password") == libpq_reads
    shown = redact(dsn)
    written = dsn.split("password=")[1] if "password=" in dsn else dsn.split(":", 2)[2].rsplit("@", 1)[0]
    for text in (str(shown), scrub(dsn), scrub(f"connection to {dsn} failed"), scrub(f'database "{dsn}"')):
        assert secret not in text and written not in text, text


def test_uri_password_with_unencoded_slash_pieces_masked():
    split_password("postgresql://u:Sl0/ash9x@h/db")  # libpq: host "u", port "Sl0", dbname "ash9x@h/db"
    assert "ash9x" not in scrub('database "ash9x@h/db" does not exist')  # the piece libpq reads as a name


def test_a_port_is_not_taken_for_a_password():
    dsn = "postgresql://h:5432/db?user=me@corp.example"
    assert redact(dsn) == dsn and scrub(dsn) == dsn


# ------------------------------------------------------------------------------------ property
_SPECIAL = list(" \t'\"\\=@:/?&#%$é€😀")
_PASSWORDS = st.text(
    st.one_of(
        st.sampled_from(_SPECIAL),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00*"),  # '*': the mask's own
    ),
    min_size=4,
    max_size=16,
)


def _kv_quoted(pw: str) -> tuple[str, str]:
    w = pw.replace("\\", "\\\\").replace("'", "\\'")
    return f"host=h port=5432 password='{w}' dbname=d", w


def _kv_unquoted(pw: str) -> tuple[str, str]:
    w = "".join("\\" + c if c in " \t\n\r\f\v'\\" else c for c in pw)
    return f"host=h password={w} user=u", w


def _kv_unterminated(pw: str) -> tuple[str, str]:  # a user's typo: the closing quote is missing
    w = pw.replace("\\", "\\\\").replace("'", "\\'")
    return f"host=h user=u password='{w}", w


def _uri_userinfo(pw: str) -> tuple[str, str]:
    w = urllib.parse.quote(pw, safe="")
    return f"postgresql://u:{w}@h:5432/db", w


def _uri_query(pw: str) -> tuple[str, str]:
    w = urllib.parse.quote(pw, safe="")
    return f"postgresql://h:5432/db?sslmode=disable&password={w}", w


def _uri_userinfo_raw(pw: str) -> tuple[str, str]:  # a user's mistake: not percent-encoded
    return f"postgresql://u:{pw}@h:5432/db", pw


def _uri_query_raw(pw: str) -> tuple[str, str]:
    return f"postgresql://h:5432/db?password={pw}", pw


FORMS = {
    "kv_quoted": _kv_quoted,
    "kv_unquoted": _kv_unquoted,
    "kv_unterminated": _kv_unterminated,
    "uri_userinfo": _uri_userinfo,
    "uri_query": _uri_query,
    # an unencoded '/' ends libpq's user info, an '&' its query parameter: those are other DSNs
    "uri_userinfo_raw": _uri_userinfo_raw,
    "uri_query_raw": _uri_query_raw,
}
_RAW_EXCLUDED = {"uri_userinfo_raw": "/", "uri_query_raw": "&"}


def _messages(dsn: str) -> list[str]:
    """Texts that carry the DSN as mooncake's messages and libpq's errors do."""
    out = [
        f"error: cannot connect to {dsn}: connection to server failed: FATAL:  password authentication failed",
        f"the mooncake service did not start: DSN {dsn} refused",
        connect_error(psycopg.OperationalError(f"connection failed: {dsn}\nFATAL: password authentication failed")),
        with_password_hint(scrub(f"source {dsn} is not reachable")),
    ]
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as e:
        out.append(str(e))
        out.append(_problem(dsn))
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pw=_PASSWORDS)
def test_password_never_in_scrubbed_text(form, pw):
    assume(not any(c in pw for c in _RAW_EXCLUDED.get(form, "")))
    dsn, written = FORMS[form](pw)
    rest = dsn.replace(written, "", 1)
    assume(pw not in rest and written not in rest)
    saved = set(conninfo._SECRETS)
    conninfo._SECRETS.clear()  # each example on its own: what earlier ones remembered does not help
    try:
        shown, _ = split_password(dsn)
        texts = [scrub(dsn), str(redact(dsn)), scrub(str(shown)), *(scrub(m) for m in _messages(dsn))]
        for text in texts:
            assert pw not in text, (dsn, text)
            assert written not in text, (dsn, text)
        if form == "kv_unterminated":  # all of the rest of the string is the password, no piece of it shown
            assert scrub(dsn) == f"host=h user=u password='{conninfo.MASK}", scrub(dsn)
    finally:
        conninfo._SECRETS.clear()
        conninfo._SECRETS.update(saved)


# ------------------------------------------------------------------------------------ the catalog's login
def test_catalog_hint_replaces_the_source_hint():
    e = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: FATAL:  password '
        'authentication failed for user "cat"'
    )
    msg = catalog_error("postgresql://cat:CatSecret77@127.0.0.1:1/app", e)
    assert msg.startswith("cannot log in to the Iceberg catalog at postgresql://cat@127.0.0.1:1/app: "), msg
    assert CATALOG_HINT in msg and "CatSecret77" not in msg and "\n" not in msg
    assert with_password_hint(msg) == msg and with_password_hint(f"the service stopped: {msg}").count("(") == msg.count(
        "("
    )
    assert PASSWORD_HINT in with_password_hint("source: password authentication failed for user")
    down = catalog_error("postgresql://cat@127.0.0.1:1/app", psycopg.OperationalError("Connection refused\nIs it?"))
    assert down == "the Iceberg catalog at postgresql://cat@127.0.0.1:1/app could not be reached: Connection refused"


@pytest.fixture()
def catalog_role(pg_cluster):
    """``(role, password, database)``: a role of the session cluster that logs in with its password over
    TCP (the embedded cluster's pg_hba.conf asks every role but ``postgres`` for it, scram-sha-256), and a
    database it owns (where it can create the catalog's tables)."""
    role = "cat_" + uuid.uuid4().hex[:8]
    password = "CatSecret-" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute("SET password_encryption = 'scram-sha-256'")
        c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        c.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(role), sql.Identifier(role)))
    try:
        yield role, password, role
    finally:
        with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(role)))
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _assert_catalog_line(text: str, wrong: str, role: str) -> None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    assert "Iceberg catalog" in text and f'password authentication failed for user "{role}"' in text, text
    assert wrong not in text and urllib.parse.quote(wrong, safe="") not in text, text
    assert "sqlalche.me" not in text and "Background on this error" not in text, text
    assert "--catalog-uri" in text and "PGPASSWORD" not in text and "MOONCAKE_PG_DSN" not in text, text


def test_catalog_wrong_password_is_one_clear_line(pg_cluster, catalog_role, tmp_path):
    from mooncake_assets.engine.iceberg.catalog import make_catalog
    from mooncake_assets.engine.storage.errors import CatalogUnavailable

    role, password, db = catalog_role
    wrong = "Wr0ng-" + password[::-1]
    uri = f"postgresql://{role}:{wrong}@127.0.0.1:{pg_cluster.port}/{db}"
    with pytest.raises(CatalogUnavailable) as e:
        make_catalog(uri, str(tmp_path / "wh"))
    assert e.value.retryable is False  # a refused login needs a fix, not a retry
    _assert_catalog_line(str(e.value), wrong, role)
    assert f"at postgresql://{role}@127.0.0.1:{pg_cluster.port}/{db}:" in str(e.value)
    # the right password opens it
    make_catalog(f"postgresql://{role}:{password}@127.0.0.1:{pg_cluster.port}/{db}", str(tmp_path / "wh"))
    # ... a database where it may not create the catalog's tables: one line too, without the password
    with psycopg.connect(pg_cluster.dsn()) as c:
        if c.info.server_version < 150000:  # before PostgreSQL 15 every role may create in public
            return
    with pytest.raises(CatalogUnavailable) as e:
        make_catalog(f"postgresql://{role}:{password}@127.0.0.1:{pg_cluster.port}/postgres", str(tmp_path / "wh"))
    text = str(e.value)
    assert text.startswith(f"the Iceberg catalog at postgresql://{role}@127.0.0.1:{pg_cluster.port}/postgres "), text
    assert "permission denied for schema public" in text and "\n" not in text and password not in text, text
    assert "sqlalche.me" not in text and "CREATE TABLE" not in text and e.value.retryable is False, text


def test_catalog_wrong_password_through_the_command(pg_cluster, pg_dsn, catalog_role, tmp_path):
    """``mooncake --catalog-uri … create-table``: the service does not start; the command says why in one
    line, the catalog's, without the password."""
    role, password, db = catalog_role
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE extra (id int PRIMARY KEY)")
    wrong = "Wr0ng-" + password[::-1]
    uri = f"postgresql://{role}:{wrong}@127.0.0.1:{pg_cluster.port}/{db}"
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MOONCAKE_"))}
    env["PGPASSFILE"] = "/nonexistent/pgpass"
    base = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state)]
    try:
        r = subprocess.run(
            [*base, "--dsn", pg_dsn, "--catalog-uri", uri, "create-table", "x", "public.extra"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode != 0, r.stdout + r.stderr
        assert r.stderr.startswith("error: the mooncake service did not start: "), r.stderr
        _assert_catalog_line(r.stderr, wrong, role)
        assert wrong not in Path(state / "service.log").read_text()
    finally:
        subprocess.run([*base, "stop"], capture_output=True, env=env, timeout=60)
