"""Where a warehouse lives and how to reach it: ``file://`` directories and ``s3://bucket/prefix``.

S3 settings are resolved in one place (``resolve_s3``) so that the service, the readers and the
checks all reach the same endpoint the same way:

=====================  =======================================================  ==========================
field                  environment (first set wins)                             settings.json field
=====================  =======================================================  ==========================
endpoint               ``MOONCAKE_S3_ENDPOINT``, ``AWS_ENDPOINT_URL_S3``,          ``s3_endpoint``
                       ``AWS_ENDPOINT_URL``                                      (CLI ``--s3-endpoint``)
region                 ``MOONCAKE_S3_REGION``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``  ``s3_region``
allow_http             ``MOONCAKE_S3_ALLOW_HTTP`` (1/true/yes, 0/false/no)       ``s3_allow_http``
credentials            ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,          never saved
                       ``AWS_SESSION_TOKEN``
=====================  =======================================================  ==========================

``config.load_settings`` folds the environment into the settings (explicit CLI option > environment >
saved file, as for the warehouse URI), so the background service sees what the command that started it
saw. Credentials are read from the environment of each process and never written to settings.json.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

from .errors import WarehouseConfigError

if TYPE_CHECKING:
    import pyarrow.fs
    from fsspec import AbstractFileSystem

# PyIceberg FileIO of every object store (fsspec: s3fs, gcsfs, adlfs); see fileio.py
FILEIO_IMPL = "mooncake_assets.engine.storage.fileio.MooncakeFileIO"

ENV_ENDPOINT = ("MOONCAKE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
ENV_REGION = ("MOONCAKE_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
ENV_ALLOW_HTTP = ("MOONCAKE_S3_ALLOW_HTTP",)
DEFAULT_REGION = "us-east-1"

# bucket naming rules (S3 "General purpose bucket naming rules"), dots allowed
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def is_s3(uri: str | None) -> bool:
    """True for ``s3://``, ``s3a://`` and ``s3n://`` URIs."""
    return bool(uri) and cast(str, uri).split("://", 1)[0].lower() in ("s3", "s3a", "s3n")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``.

    Raises ``WarehouseConfigError`` for a URI that is not ``s3://`` or whose bucket name breaks the S3
    naming rules (3-63 characters: lower-case letters, digits, dots and hyphens).
    """
    if not is_s3(uri):
        raise WarehouseConfigError(f"expected an s3://bucket/prefix URI, found {uri!r}")
    rest = uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket):
        raise WarehouseConfigError(
            f"warehouse {uri!r}: {bucket!r} is not a valid S3 bucket name "
            "(3-63 characters: lower-case letters, digits, '.' and '-')"
        )
    return bucket, prefix.strip("/")


def _first_env(names: tuple[str, ...], env: Mapping[str, str]) -> str | None:
    for n in names:
        v = env.get(n)
        if v:
            return v
    return None


def parse_bool(value: object, what: str = "value") -> bool | None:
    """``True``/``False`` from a bool or the strings 1/true/yes/on and 0/false/no/off; None stays None."""
    if value is None or isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise WarehouseConfigError(f"{what}: expected true or false, found {value!r}")


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1``."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


ALLOW_HTTP_PROP = "mooncake.allow-http"  # FileIO property: allow_http of a store config ("true"/"false")


def allow_http_property(props: Mapping[str, str]) -> bool | None:
    """``allow_http`` as a store config's ``fileio_properties()`` wrote it (:data:`ALLOW_HTTP_PROP`);
    None when absent (loopback endpoints only)."""
    ah = props.get(ALLOW_HTTP_PROP)
    return None if ah is None else ah == "true"


def check_endpoint(endpoint: str | None, what: str, allow_http: bool | None, http_fix: str) -> None:
    """Refuse an object store's ``endpoint`` (None: the cloud's own, always fine) that is no
    ``http(s)://host[:port]`` URL, or plain HTTP when not allowed (``allow_http``; None: loopback
    hosts only). ``what``: the store in the message (``S3``, ``GCS``, ``Azure``); ``http_fix``: how to
    allow HTTP, after ``is plain HTTP;``. Raises ``WarehouseConfigError``."""
    if endpoint is None:
        return
    parts = urlsplit(endpoint)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise WarehouseConfigError(
            f"{what} endpoint {endpoint!r}: expected a URL like http://host:port or https://host"
        )
    if parts.scheme.lower() == "http" and not (allow_http if allow_http is not None else is_loopback(parts.hostname)):
        raise WarehouseConfigError(f"{what} endpoint {endpoint} is plain HTTP; {http_fix}")


@dataclass(frozen=True)
class S3Config:
    """How to reach an S3-compatible object store.

    ``endpoint``: URL with scheme (``http://127.0.0.1:9000``, ``https://minio.internal``); None = AWS S3.
    ``region``: signing region (default ``us-east-1``; MinIO and moto accept any). ``access_key_id``,
    ``secret_access_key``, ``session_token``: credentials (None = the SDK's default chain).
    ``allow_http``: permit a plain-HTTP endpoint; None = allowed only for loopback endpoints.
    ``profile``: a named profile of ``~/.aws/config`` (``AWS_PROFILE``; SSO and assumed roles included);
    without keys or a profile, botocore's standard chain (web identity, container and instance roles).
    ``path_style``: path-style addressing (``endpoint/bucket/key``); None = path-style for a custom
    endpoint, virtual-hosted for AWS. ``connect_timeout_s``: seconds to open a connection (0 = the SDK
    default). ``request_timeout_s``: seconds to wait on a request's socket (0 = the SDK default).
    """

    endpoint: str | None = None
    region: str = DEFAULT_REGION
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    allow_http: bool | None = None
    path_style: bool | None = None
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 0.0
    profile: str | None = None

    kind = "s3"

    # ------------------------------------------------------------------ derived
    @property
    def scheme(self) -> str:
        return urlsplit(self.endpoint).scheme.lower() if self.endpoint else "https"

    @property
    def host_port(self) -> str | None:
        """``host:port`` of the endpoint (what DuckDB's ``ENDPOINT`` takes), None for AWS."""
        return urlsplit(self.endpoint).netloc if self.endpoint else None

    @property
    def use_path_style(self) -> bool:
        return self.path_style if self.path_style is not None else self.endpoint is not None

    @property
    def http_allowed(self) -> bool:
        if self.allow_http is not None:
            return self.allow_http
        return is_loopback(urlsplit(self.endpoint).hostname if self.endpoint else None)

    def validate(self) -> S3Config:
        """Raise ``WarehouseConfigError`` for an endpoint that is no http(s) URL, or plain HTTP that is not
        allowed; returns self."""
        check_endpoint(
            self.endpoint,
            "S3",
            self.allow_http,
            "set MOONCAKE_S3_ALLOW_HTTP=1 (or settings s3_allow_http) to allow it, or use https",
        )
        return self

    def describe(self) -> str:
        """Where requests go, for error messages (never the credentials)."""
        return self.endpoint or f"AWS S3 ({self.region})"

    # ------------------------------------------------------------------ for the clients
    def fileio_properties(self) -> dict[str, str]:
        """PyIceberg FileIO / catalog properties: ``py-io-impl`` (``fileio.MooncakeFileIO``, fsspec's
        ``s3fs``) and the standard ``s3.*`` keys."""
        props = {"py-io-impl": FILEIO_IMPL, "s3.region": self.region}
        if self.profile:
            props["s3.profile-name"] = self.profile
        if self.allow_http is not None:
            props[ALLOW_HTTP_PROP] = str(self.allow_http).lower()
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.access_key_id:
            props["s3.access-key-id"] = self.access_key_id
        if self.secret_access_key:
            props["s3.secret-access-key"] = self.secret_access_key
        if self.session_token:
            props["s3.session-token"] = self.session_token
        if self.path_style is not None:
            props["s3.force-virtual-addressing"] = "false" if self.path_style else "true"
        if self.connect_timeout_s:
            props["s3.connect-timeout"] = str(self.connect_timeout_s)
        if self.request_timeout_s:
            props["s3.request-timeout"] = str(self.request_timeout_s)
        return props

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> S3Config:
        """The config ``fileio_properties()`` describes."""
        fva = props.get("s3.force-virtual-addressing")
        return cls(
            endpoint=props.get("s3.endpoint"),
            region=props.get("s3.region") or DEFAULT_REGION,
            access_key_id=props.get("s3.access-key-id"),
            secret_access_key=props.get("s3.secret-access-key"),
            session_token=props.get("s3.session-token"),
            profile=props.get("s3.profile-name"),
            allow_http=allow_http_property(props),
            path_style=None if fva is None else fva == "false",
            connect_timeout_s=float(props.get("s3.connect-timeout") or 0) or 5.0,
            request_timeout_s=float(props.get("s3.request-timeout") or 0),
        )

    def filesystem(self) -> AbstractFileSystem:
        """An ``s3fs.S3FileSystem`` for this config (keys, else the profile, else botocore's chain).
        Listings are not cached: another process (the service) changes the prefix under a reader."""
        from s3fs import S3FileSystem

        client_kwargs: dict[str, Any] = {"region_name": self.region}
        if self.endpoint:
            client_kwargs["endpoint_url"] = self.endpoint
        config_kwargs: dict[str, Any] = {
            "connect_timeout": self.connect_timeout_s or 60,
            "read_timeout": self.request_timeout_s or 60,
            "s3": {"addressing_style": "path" if self.use_path_style else "virtual"},
            "retries": {"max_attempts": 3, "mode": "standard"},
        }
        kw: dict[str, Any] = dict(client_kwargs=client_kwargs, config_kwargs=config_kwargs, use_listings_cache=False)
        if self.access_key_id:
            kw.update(key=self.access_key_id, secret=self.secret_access_key, token=self.session_token)
        elif self.profile:
            kw["profile"] = self.profile
        return S3FileSystem(**kw)

    def pyarrow_filesystem(self) -> pyarrow.fs.S3FileSystem:
        """A ``pyarrow.fs.S3FileSystem`` for this config (the same one PyIceberg's FileIO builds)."""
        from pyarrow.fs import S3FileSystem

        kw: dict[str, Any] = dict(
            region=self.region,
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            session_token=self.session_token,
            endpoint_override=self.endpoint,
            force_virtual_addressing=self.path_style is False,
        )
        if self.connect_timeout_s:
            kw["connect_timeout"] = self.connect_timeout_s
        if self.request_timeout_s:
            kw["request_timeout"] = self.request_timeout_s
        return S3FileSystem(**kw)

    def hints(self) -> dict[str, Any]:
        """The non-secret part, for another process (a union reader) to reach the same endpoint."""
        return {
            "endpoint": self.endpoint,
            "region": self.region,
            "allow_http": self.allow_http,
            "path_style": self.path_style,
        }


def resolve_s3(
    settings: object = None, *, hints: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> S3Config:
    """The S3Config of this process: ``hints`` (from the service) > ``settings`` > environment > defaults
    for endpoint/region/allow_http/path style; credentials from the environment. Validated."""
    env = os.environ if env is None else env
    endpoint = _first_env(ENV_ENDPOINT, env)
    region = _first_env(ENV_REGION, env)
    allow_http = parse_bool(_first_env(ENV_ALLOW_HTTP, env), "MOONCAKE_S3_ALLOW_HTTP")
    path_style = None
    if settings is not None:
        endpoint = getattr(settings, "s3_endpoint", None) or endpoint
        region = getattr(settings, "s3_region", None) or region
        saved = getattr(settings, "s3_allow_http", None)
        allow_http = parse_bool(saved, "s3_allow_http") if saved is not None else allow_http
    if hints:
        endpoint = hints.get("endpoint") or endpoint
        region = hints.get("region") or region
        allow_http = hints["allow_http"] if hints.get("allow_http") is not None else allow_http
        path_style = hints.get("path_style")
    return S3Config(
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=region or DEFAULT_REGION,
        access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
        allow_http=allow_http,
        path_style=path_style,
        profile=env.get("AWS_PROFILE") or None,
    ).validate()


class S3Settings(Protocol):
    """The ``s3_*`` settings :func:`apply_s3_settings` folds values into (the application's settings)."""

    s3_endpoint: str | None
    s3_region: str | None
    s3_allow_http: bool | None


def apply_s3_settings(
    settings: S3Settings,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    allow_http: bool | str | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Fold explicit values, then the environment, into ``settings.s3_*`` (explicit > environment > saved),
    the rule ``load_settings`` follows for every setting."""
    env = os.environ if env is None else env
    settings.s3_endpoint = endpoint or _first_env(ENV_ENDPOINT, env) or settings.s3_endpoint
    settings.s3_region = region or _first_env(ENV_REGION, env) or settings.s3_region
    flag = allow_http if allow_http is not None else _first_env(ENV_ALLOW_HTTP, env)
    if flag is not None:
        settings.s3_allow_http = parse_bool(flag, "MOONCAKE_S3_ALLOW_HTTP")
