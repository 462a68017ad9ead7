"""The log sequence number (LSN) of PostgreSQL's write-ahead log as a value type.

An LSN is a 64-bit byte position in the WAL. Postgres writes it as text ``X/Y``: the high and the
low 32 bits in upper-case hexadecimal without leading zeros (the ``pg_lsn`` type, PostgreSQL
documentation "pg_lsn Type"; e.g. ``16/B374D848``). :class:`Lsn` is an ``int`` (so it compares,
sorts, hashes and subtracts as the byte position it is, and ``int(lsn)`` is that position) whose
text is the ``X/Y`` form::

    >>> Lsn.parse("16/B374D848") == 0x16_B374D848
    True
    >>> str(Lsn(0x1_0000_00AB))
    '1/AB'
    >>> f"at LSN {Lsn(0)}"
    'at LSN 0/0'

Arithmetic on an ``Lsn`` gives a plain ``int`` (a distance in bytes or a new position); wrap it in
``Lsn`` again to print it as an LSN.
"""

from __future__ import annotations

__all__ = ["Lsn", "MAX_LSN"]

MAX_LSN = (1 << 64) - 1


class Lsn(int):
    """A WAL position in ``0 .. 2**64-1``; ``str()`` gives Postgres's ``X/Y`` text.

    ``Lsn(n)`` raises ``ValueError`` for an integer outside that range; :meth:`parse` reads the text.
    """

    __slots__ = ()

    def __new__(cls, value: int | str = 0) -> Lsn:
        if isinstance(value, str):  # Lsn("0/16B3748") reads the text, like int("12")
            return cls.parse(value)
        v = int.__new__(cls, value)
        if not 0 <= v <= MAX_LSN:
            raise ValueError(f"LSN {int(v)} is outside 0..2**64-1")
        return v

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """``'0/16B3748'`` → ``Lsn(0x16B3748)`` (surrounding blanks ignored).

        Raises ``ValueError`` naming the text when it is not two ``/``-separated hexadecimal numbers
        of at most 32 bits each.
        """
        try:
            hi, lo = text.strip().split("/")
            h, low = int(hi, 16), int(lo, 16)
        except (ValueError, AttributeError):
            raise ValueError(f"expected an LSN like '0/16B3748', got {text!r}") from None
        if not (0 <= h < 1 << 32 and 0 <= low < 1 << 32):
            raise ValueError(f"expected an LSN like '0/16B3748', got {text!r}")
        return int.__new__(cls, (h << 32) | low)

    def __str__(self) -> str:
        v = int(self)
        return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"

    def __format__(self, spec: str) -> str:
        # an empty spec (f"{lsn}") is the LSN text; a numeric spec formats the byte position
        return str(self) if not spec else int(self).__format__(spec)

    def __repr__(self) -> str:
        return f"Lsn('{self}')"
