"""Errors of the warehouse (object store / directory) and of the catalog behind it, classified.

Each error says whether retrying can help (``retryable``), as moonlink's errors do: a temporary error
(an endpoint that does not answer, a timeout, a 5xx, throttling, a catalog database that dropped the
connection) may succeed when the same call is made again later; a permanent one (no such bucket,
credentials rejected, access denied, a bad URI) fails again until someone changes the setup.

``classify(exc)`` turns what PyArrow's S3 filesystem, DuckDB's httpfs, botocore/s3fs, gcsfs (aiohttp,
google-auth), adlfs (azure-core) and SQLAlchemy raise into these classes (or None when the exception is not a storage failure), reading the AWS error code
or HTTP status out of the message where the library gives no structured field.
"""

from __future__ import annotations

import enum
import errno
import re
from collections.abc import Iterator
from typing import Final


class StorageError(Exception):
    """Base class. ``retryable``: True when calling again unchanged may succeed (temporary).
    ``location``: the URI involved, if known; ``endpoint``: where requests went, if known."""

    retryable: bool = False
    kind: str = "storage"

    def __init__(
        self, message: str, *, location: str | None = None, endpoint: str | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.location = location
        self.endpoint = endpoint
        if retryable is not None:
            self.retryable = retryable


class StorageUnavailable(StorageError):
    """The endpoint did not answer (refused, reset, DNS, timeout) or answered 5xx / "slow down". Temporary."""

    retryable = True
    kind = "unavailable"


class CatalogUnavailable(StorageError):
    """The catalog (SQL database or REST server) could not be reached or dropped the connection. Temporary."""

    retryable = True
    kind = "catalog-unavailable"


class BucketNotFound(StorageError):
    """The warehouse bucket does not exist. Permanent: create it or fix the warehouse URI."""

    kind = "bucket-not-found"


class CredentialsRejected(StorageError):
    """The store does not know the access key, the signature does not match, or the token expired.
    Permanent: fix the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN)."""

    kind = "credentials-rejected"


class AccessDenied(StorageError):
    """The credentials are valid but not allowed to do this (bucket policy, IAM). Permanent."""

    kind = "access-denied"


class WarehouseUnwritable(StorageError):
    """A local (``file://``) warehouse directory cannot be written: permission denied or not permitted
    (e.g. an immutable directory), a read-only or full file system, a quota, a path component that is no
    longer a directory (an unmounted volume), an I/O error. Temporary: a persist succeeds again once
    someone makes the directory writable, without a restart."""

    retryable = True
    kind = "unwritable"


class WarehouseConfigError(StorageError, ValueError):
    """The warehouse URI or the S3 settings are malformed or refused (e.g. plain HTTP not allowed). Permanent."""

    kind = "config"


# AWS error codes as PyArrow prints them ("AWS Error NO_SUCH_BUCKET during …") and as S3 sends them
# ("NoSuchBucket"), normalised to upper snake case.
_CODES: dict[str, type[StorageError]] = {
    "NO_SUCH_BUCKET": BucketNotFound,
    "INVALID_ACCESS_KEY_ID": CredentialsRejected,
    "SIGNATURE_DOES_NOT_MATCH": CredentialsRejected,
    "EXPIRED_TOKEN": CredentialsRejected,
    "INVALID_TOKEN": CredentialsRejected,
    "INVALID_CLIENT_TOKEN_ID": CredentialsRejected,
    "UNRECOGNIZED_CLIENT": CredentialsRejected,
    "MISSING_AUTHENTICATION_TOKEN": CredentialsRejected,
    "REQUEST_EXPIRED": CredentialsRejected,
    "ACCESS_DENIED": AccessDenied,
    "ALL_ACCESS_DISABLED": AccessDenied,
    "NETWORK_CONNECTION": StorageUnavailable,
    "REQUEST_TIMEOUT": StorageUnavailable,
    "REQUEST_TIME_TOO_SKEWED": StorageUnavailable,
    "SLOW_DOWN": StorageUnavailable,
    "THROTTLING": StorageUnavailable,
    "SERVICE_UNAVAILABLE": StorageUnavailable,
    "INTERNAL_FAILURE": StorageUnavailable,
    "INTERNAL_ERROR": StorageUnavailable,
    # Azure Blob error codes (x-ms-error-code)
    "CONTAINER_NOT_FOUND": BucketNotFound,
    "CONTAINER_BEING_DELETED": BucketNotFound,
    "AUTHENTICATION_FAILED": CredentialsRejected,
    "INVALID_AUTHENTICATION_INFO": CredentialsRejected,
    "NO_AUTHENTICATION_INFORMATION": CredentialsRejected,
    "AUTHORIZATION_FAILURE": AccessDenied,
    "AUTHORIZATION_PERMISSION_MISMATCH": AccessDenied,
    "SERVER_BUSY": StorageUnavailable,
    "OPERATION_TIMED_OUT": StorageUnavailable,
}
_AWS_CODE_RE = re.compile(r"AWS Error ([A-Z_]+)")
_S3_CODE_RE = re.compile(
    r"\b(NoSuchBucket|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|AccessDenied|"
    r"SlowDown|ServiceUnavailable|InternalError|RequestTimeout)\b"
)
_HTTP_STATUS_RE = re.compile(r"(?:HTTP status |HTTP |status code:? ?)(\d{3})\b")
_UNREACHABLE_RE = re.compile(
    r"curlCode: ?(6|7|28|35|52|56)\b|Could not connect|Couldn't connect|Connection refused|Failed to connect|"
    r"Connection reset|Could not resolve host|timed out|Timeout was reached|Empty reply from server|"
    r"Could not establish connection|EndpointConnectionError|Cannot connect to host|Connect call failed|"
    r"Server disconnected|ServerDisconnectedError",
    re.IGNORECASE,
)
_CAMEL_RE = re.compile(r"(?<!^)(?=[A-Z])")
# errno values of a local file system that refuses writes (as Python's OSError and PyArrow's local
# filesystem report them); ENOENT / EEXIST are not among them: those are a caller's logic, not an outage
_UNWRITABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EIO}


def _snake(code: str) -> str:
    return _CAMEL_RE.sub("_", code).upper()


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status_class(status: int) -> type[StorageError] | None:
    """HTTP status of an object store's answer -> class (None: not a storage condition we know)."""
    if status >= 500 or status in (408, 429):
        return StorageUnavailable
    if status == 401:
        return CredentialsRejected
    if status == 403:
        return AccessDenied
    return None


class _Undecided(enum.Enum):
    """Sentinel of the per-library classifiers: this one has no answer, ask the next.

    Distinct from None, which is a final answer ("not a storage failure") that stops the search."""

    NEXT = enum.auto()


_NEXT: Final = _Undecided.NEXT
_Verdict = type[StorageError] | None | _Undecided

_SQLALCHEMY_UNAVAILABLE = ("OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError")
_BOTOCORE_UNAVAILABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError")
_AZURE_UNAVAILABLE = (
    "ServiceRequestError",
    "ServiceRequestTimeoutError",
    "ServiceResponseError",
    "ServiceResponseTimeoutError",
    "IncompleteReadError",
)
_AIOHTTP_UNAVAILABLE = (
    "ClientConnectorError",
    "ClientConnectionError",
    "ClientOSError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ConnectionTimeoutError",
    "SocketTimeoutError",
)
_REQUESTS_UNAVAILABLE = ("ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout")


def _from_botocore(exc: BaseException, name: str) -> _Verdict:
    """botocore/s3fs: connection failures by class name, then the AWS error code of ``exc.response``."""
    if name in _BOTOCORE_UNAVAILABLE:
        return StorageUnavailable
    if name == "NoCredentialsError":
        return CredentialsRejected
    response = getattr(exc, "response", None) or {}
    code = (response.get("Error") or {}).get("Code")
    if code:
        cls = _CODES.get(_snake(str(code)))
        if cls is None and str(code) in ("404", "NoSuchBucket"):
            cls = BucketNotFound
        if cls is not None:
            return cls
    return _NEXT


def _from_azure(exc: BaseException, name: str) -> _Verdict:
    """adlfs: azure-core / azure-storage-blob exceptions (class name, ``error_code``, ``status_code``)."""
    if name in _AZURE_UNAVAILABLE:
        return StorageUnavailable
    if "failed to authenticate" in str(exc):  # a bad key/SAS signature (Azurite answers AuthorizationFailure)
        return CredentialsRejected
    code = getattr(exc, "error_code", None)
    if code:
        cls = _CODES.get(_snake(str(code)))
        if cls is not None:
            return cls
    if name == "ClientAuthenticationError" or name.startswith("CredentialUnavailable"):
        return CredentialsRejected
    status = getattr(exc, "status_code", None)
    if status:
        return _status_class(int(status))  # None here is final
    return _NEXT


def _from_library(exc: BaseException, mod: str, name: str) -> _Verdict:
    """Structured fields of the client libraries, tried in order; ``_NEXT`` when none of them decides."""
    if mod.startswith("sqlalchemy") and name in _SQLALCHEMY_UNAVAILABLE:
        return CatalogUnavailable
    if mod.startswith("botocore"):
        verdict = _from_botocore(exc, name)
        if verdict is not _NEXT:
            return verdict
    if mod.startswith("azure"):
        verdict = _from_azure(exc, name)
        if verdict is not _NEXT:
            return verdict
    if mod.startswith("google.auth"):  # gcsfs' credentials
        return StorageUnavailable if name == "TransportError" else CredentialsRejected
    if mod.startswith("gcsfs") and name == "HttpError":
        code = getattr(exc, "code", None)
        if code:  # 401 -> CredentialsRejected there too; None here is final
            return _status_class(int(code))
    if mod.startswith("aiohttp") and name in _AIOHTTP_UNAVAILABLE:
        return StorageUnavailable
    if mod.startswith("pyiceberg") and name in ("ServerError", "ServiceUnavailableError"):
        return CatalogUnavailable
    if mod.startswith("requests") and name in _REQUESTS_UNAVAILABLE:
        return CatalogUnavailable
    return _NEXT


def _from_message_code(text: str) -> _Verdict:
    """An AWS error code written in the message (PyArrow's S3 filesystem, DuckDB's httpfs)."""
    m = _AWS_CODE_RE.search(text)
    if m and m.group(1) in _CODES:
        return _CODES[m.group(1)]
    m = _S3_CODE_RE.search(text)
    if m:
        return _CODES.get(_snake(m.group(1)))  # None here is final
    return _NEXT


def _from_io_error(exc: BaseException, text: str, generic: bool) -> type[StorageError] | None:
    """An OSError or DuckDB error without a code: read the HTTP status / errno / wording."""
    if generic and (text.startswith("Forbidden: ") or (isinstance(exc, PermissionError) and exc.errno is None)):
        return AccessDenied  # gcsfs' 403; s3fs/adlfs' translated 403 (a local EACCES has an errno)
    if _UNREACHABLE_RE.search(text):
        return StorageUnavailable
    m = _HTTP_STATUS_RE.search(text)
    if m:
        status = int(m.group(1))
        if status >= 500 or status in (408, 429):
            return StorageUnavailable
        if status == 403:
            return AccessDenied
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return StorageUnavailable
    if isinstance(exc, OSError) and exc.errno in _UNWRITABLE_ERRNOS:
        return WarehouseUnwritable
    return None


def _one(exc: BaseException, generic: bool = True) -> type[StorageError] | None:
    """Class of one exception of a chain (None: not a storage failure): library fields, then the message."""
    if isinstance(exc, StorageError):
        return type(exc)
    mod = type(exc).__module__ or ""
    verdict = _from_library(exc, mod, type(exc).__name__)
    if verdict is not _NEXT:
        return verdict
    text = str(exc)
    verdict = _from_message_code(text)
    if verdict is not _NEXT:
        return verdict
    if not (isinstance(exc, OSError) or mod.startswith("duckdb") or mod.startswith("_duckdb")):
        return None
    return _from_io_error(exc, text, generic)


_HINTS = {
    StorageUnavailable: "the endpoint did not answer or failed temporarily; retrying may help",
    CatalogUnavailable: "the catalog could not be reached; retrying may help",
    BucketNotFound: "the bucket (container) does not exist: create it or fix the warehouse URI",
    CredentialsRejected: "the credentials were rejected: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
    "(and AWS_SESSION_TOKEN) or AWS_PROFILE for S3, GOOGLE_APPLICATION_CREDENTIALS / "
    "MOONCAKE_GCS_TOKEN for GCS, AZURE_STORAGE_CONNECTION_STRING / AZURE_STORAGE_ACCOUNT_KEY / "
    "AZURE_STORAGE_SAS_TOKEN for Azure",
    AccessDenied: "access denied: the credentials lack permission on this bucket/prefix",
    WarehouseUnwritable: "the warehouse directory cannot be written (permissions, a read-only or full file "
    "system); retrying may help once it is writable again",
}


def classify(
    exc: BaseException, *, location: str | None = None, endpoint: str | None = None, what: str | None = None
) -> StorageError | None:
    """A ``StorageError`` describing ``exc`` (or something in its cause chain), or None when it is not a
    storage or catalog failure. A ``StorageError`` passed in is returned as is. ``what``: the operation,
    for the message (``"upload of s3://…"``)."""
    for e in _chain(exc):
        if isinstance(e, StorageError):
            return e
    # a bare 403 ("Forbidden", s3fs' PermissionError) only when nothing in the chain says more (e.g. the
    # botocore error behind it: InvalidAccessKeyId)
    found = next(((e, c) for e in _chain(exc) if (c := _one(e, generic=False)) is not None), None) or next(
        ((e, c) for e in _chain(exc) if (c := _one(e)) is not None), None
    )
    for e, cls in [found] if found else []:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = f" at {endpoint}" if endpoint else ""
        if cls is WarehouseUnwritable and location and not endpoint:  # which directory (ENOSPC names no path)
            where = f" in {location}"
        head = f"{what}{where}: " if what else (f"warehouse{where}: " if where else "")
        err = cls(f"{head}{_HINTS.get(cls, 'storage error')} ({first})", location=location, endpoint=endpoint)
        err.__cause__ = exc
        return err
    return None


def is_retryable(exc: BaseException) -> bool:
    """True when ``exc`` is (or wraps) a temporary failure: a retryable ``StorageError`` or an error with a
    true ``retryable`` attribute (e.g. ``CommitConflict``, ``CommitStateUnknown``)."""
    if getattr(exc, "retryable", False):
        return True
    err = classify(exc)
    return bool(err and err.retryable)
