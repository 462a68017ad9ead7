"""Lexical helpers over client SQL text: splitting a Query message into statements, finding ``$n``
parameters, and the first keywords of a statement — all outside string literals, quoted identifiers,
dollar-quoted strings and comments (PostgreSQL manual, "Lexical Structure").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")
_PARAM = re.compile(r"\$(\d+)")


def _scan(sql: str) -> Iterator[tuple[int, int, bool]]:
    """Yield (start, end, is_code) runs of ``sql``: code, or a literal/identifier/comment."""
    i, n, start = 0, len(sql), 0
    while i < n:
        c = sql[i]
        end = -1
        if c in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                if c == "'" and sql[j] == "\\" and i > 0 and sql[i - 1] in "eE":
                    j += 1
                j += 1
            end = min(j + 1, n)
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            end = n if j < 0 else j + 1
        elif c == "/" and sql.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            end = j
        elif c == "$" and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            m = _DOLLAR.match(sql, i)
            if m:
                close = sql.find(m.group(0), m.end())
                end = n if close < 0 else close + len(m.group(0))
        if end >= 0:
            if start < i:
                yield start, i, True
            yield i, end, False
            i = start = end
        else:
            i += 1
    if start < n:
        yield start, n, True


def top_level(sql: str) -> Iterator[tuple[int, str, int]]:
    """Yield ``(offset, char, depth)`` for every character of code in ``sql`` (outside literals, quoted
    identifiers, dollar-quoted strings and comments), ``depth`` being the parenthesis depth *before*
    the character: the one scanner behind the top-level splits of the psql and COPY helpers."""
    depth = 0
    for a, b, code in _scan(sql):
        if not code:
            continue
        for i in range(a, b):
            ch = sql[i]
            yield i, ch, depth
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1


def split_top(sql: str, sep: str = ",") -> list[str]:
    """``sql`` split at ``sep`` outside parentheses, literals and comments (pieces not stripped)."""
    cuts = [i for i, ch, depth in top_level(sql) if ch == sep and depth == 0]
    bounds = [-1, *cuts, len(sql)]
    return [sql[bounds[k] + 1 : bounds[k + 1]] for k in range(len(bounds) - 1)]


def split_statements(sql: str) -> list[str]:
    """The statements of one Query message, split at ``;`` outside literals and comments, each
    stripped; statements holding only whitespace/comments are dropped (an all-empty Query yields [])."""
    out, cur = [], []
    has_code = False
    for a, b, code in _scan(sql):
        piece = sql[a:b]
        if not code:
            cur.append(piece)
            if not piece.startswith(("--", "/*")):
                has_code = True
            continue
        parts = piece.split(";")
        for k, p in enumerate(parts):
            if k:
                if has_code:
                    out.append("".join(cur).strip())
                cur, has_code = [], False
            cur.append(p)
            if p.strip():
                has_code = True
    if has_code:
        out.append("".join(cur).strip())
    return out


def code_only(sql: str) -> str:
    """``sql`` with comments removed and literals kept (for keyword checks)."""
    return "".join(sql[a:b] for a, b, code in _scan(sql) if code or not sql.startswith(("--", "/*"), a))


def max_param(sql: str) -> int:
    """The highest ``$n`` placeholder number in ``sql`` (0 when none)."""
    best = 0
    for a, b, code in _scan(sql):
        if code:
            for m in _PARAM.finditer(sql, a, b):
                best = max(best, int(m.group(1)))
    return best


def replace_params(sql: str, repl: dict[int, str]) -> str:
    """``sql`` with each ``$n`` in ``repl`` replaced by ``repl[n]`` (outside literals and comments)."""
    out = []
    for a, b, code in _scan(sql):
        seg = sql[a:b]
        if code:
            seg = _PARAM.sub(lambda m: repl.get(int(m.group(1)), m.group(0)), seg)
        out.append(seg)
    return "".join(out)


def rewrite_code(sql: str, f: Callable[[str], str]) -> str:
    """``sql`` with ``f`` applied to each run of code (literals, identifiers and comments kept)."""
    return "".join(f(sql[a:b]) if code else sql[a:b] for a, b, code in _scan(sql))


def words(sql: str, n: int = 3) -> list[str]:
    """The first ``n`` words of a statement, upper-cased, comments skipped."""
    return [w.upper() for w in re.findall(r"[A-Za-z_][A-Za-z_0-9.]*", code_only(sql))[:n]]
