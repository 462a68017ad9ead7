"""The three object stores a warehouse can live on, reached through fsspec (docs/storage.md).

=========  ======================================  ======================  ==========================
store      warehouse URI                           fsspec filesystem       config class
=========  ======================================  ======================  ==========================
S3         ``s3://bucket/prefix``                  ``s3fs``                ``config.S3Config``
GCS        ``gs://bucket/prefix``                  ``gcsfs``               ``GCSConfig``
Azure      ``abfs://container/prefix``,            ``adlfs``               ``AzureConfig``
           ``abfss://container@account.dfs.core.windows.net/prefix``, ``az://container/prefix``
=========  ======================================  ======================  ==========================

Every config has the same face: ``kind``, ``describe()`` (where requests go, for messages; never a
secret), ``validate()``, ``fileio_properties()`` (PyIceberg catalog/FileIO properties: the standard
``s3.*``/``gcs.*``/``adls.*`` keys plus ``py-io-impl`` = ``fileio.MooncakeFileIO``), ``filesystem()``
(the fsspec filesystem) and ``hints()`` (the non-secret part a union reader in another process needs).

Settings come from the environment of each process, as each ecosystem expects; secrets are held in
memory only (never in settings.json nor in the ReadState hints, never in a message):

- **GCS**: endpoint ``MOONCAKE_GCS_ENDPOINT`` or ``STORAGE_EMULATOR_HOST`` (the Google client
  libraries' emulator variable; None = Google); project ``MOONCAKE_GCS_PROJECT``,
  ``GOOGLE_CLOUD_PROJECT``; credentials ``MOONCAKE_GCS_TOKEN`` = ``anon`` | ``google_default`` | the path of
  a service-account (or authorized-user) JSON file, else ``GOOGLE_APPLICATION_CREDENTIALS`` (a file),
  else application-default credentials (``gcloud auth application-default login``, workload identity on
  GKE/GCE); ``anon`` is the default only for a loopback endpoint (an emulator).
- **Azure**: ``AZURE_STORAGE_CONNECTION_STRING``; or account ``AZURE_STORAGE_ACCOUNT_NAME`` (or
  ``AZURE_STORAGE_ACCOUNT``, or the ``container@account.dfs.core.windows.net`` URI form) with
  ``AZURE_STORAGE_ACCOUNT_KEY`` (``AZURE_STORAGE_KEY``) or ``AZURE_STORAGE_SAS_TOKEN``; with neither,
  ``azure-identity``'s ``DefaultAzureCredential`` (environment service principal, workload/managed
  identity, ``az login``). ``MOONCAKE_AZURE_ENDPOINT``: the blob endpoint (Azurite, sovereign clouds),
  else the connection string's ``BlobEndpoint``, else ``https://<account>.blob.core.windows.net``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .config import (
    ALLOW_HTTP_PROP,
    FILEIO_IMPL,
    S3Config,
    _first_env,
    allow_http_property,
    check_endpoint,
    is_loopback,
    is_s3,
    parse_s3_uri,
    resolve_s3,
)
from .errors import WarehouseConfigError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

GCS_SCHEMES = ("gs", "gcs")
AZURE_SCHEMES = ("abfs", "abfss", "az", "wasb", "wasbs")

ENV_GCS_ENDPOINT = ("MOONCAKE_GCS_ENDPOINT", "STORAGE_EMULATOR_HOST")
ENV_GCS_PROJECT = ("MOONCAKE_GCS_PROJECT", "GOOGLE_CLOUD_PROJECT")
ENV_AZ_ACCOUNT = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT")
ENV_AZ_KEY = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY")

_GCS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_AZ_CONTAINER_RE = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")


def scheme(uri: str | None) -> str:
    """Lower-case scheme of ``uri`` (``""`` for a plain path)."""
    return uri.split("://", 1)[0].lower() if uri and "://" in uri else ""


def kind_of_scheme(scheme: str) -> str | None:
    """``"s3"`` (``s3``, ``s3a``, ``s3n``), ``"gcs"`` (:data:`GCS_SCHEMES`) or ``"azure"``
    (:data:`AZURE_SCHEMES`) for a URI scheme, any case; None otherwise (local files, unknown schemes)."""
    s = scheme.lower()
    if is_s3(f"{s}://"):
        return "s3"
    if s in GCS_SCHEMES:
        return "gcs"
    if s in AZURE_SCHEMES:
        return "azure"
    return None


def store_kind(uri: str | None) -> str:
    """``"s3"``, ``"gcs"``, ``"azure"`` or ``"file"`` (``file://`` and plain paths) for a warehouse URI;
    raises ``WarehouseConfigError`` for any other scheme."""
    s = scheme(uri)
    if s in ("", "file"):
        return "file"
    kind = kind_of_scheme(s)
    if kind is not None:
        return kind
    raise WarehouseConfigError(
        f"warehouse {uri!r}: expected file://, s3://, gs://, abfs:// or az:// (or a directory path)"
    )


def is_object_store(uri: str | None) -> bool:
    """True for s3://, gs:// and abfs://-family URIs."""
    return store_kind(uri) != "file"


def parse_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix`` -> ``("bucket", "some/prefix")``; ``WarehouseConfigError`` for a bucket
    name that breaks GCS's naming rules (3-222 characters: lower-case letters, digits, ``.``, ``-``, ``_``)."""
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    if not _GCS_BUCKET_RE.match(bucket):
        raise WarehouseConfigError(
            f"warehouse {uri!r}: {bucket!r} is not a valid GCS bucket name "
            "(lower-case letters, digits, '.', '-' and '_')"
        )
    return bucket, prefix.strip("/")


def parse_azure_uri(uri: str) -> tuple[str, str | None, str]:
    """``abfs://container/prefix`` -> ``("container", None, "prefix")``;
    ``abfss://container@account.dfs.core.windows.net/prefix`` -> ``("container", "account", "prefix")``.
    ``WarehouseConfigError`` for a container name that breaks Azure's rules (3-63 characters: lower-case
    letters, digits and single hyphens)."""
    netloc, _, prefix = uri.split("://", 1)[1].partition("/")
    container, account = netloc, None
    if "@" in netloc:
        container, host = netloc.split("@", 1)
        account = host.split(".", 1)[0] or None
    if not _AZ_CONTAINER_RE.match(container):
        raise WarehouseConfigError(
            f"warehouse {uri!r}: {container!r} is not a valid Azure container name "
            "(3-63 characters: lower-case letters, digits and single '-')"
        )
    return container, account, prefix.strip("/")


def bucket_and_prefix(uri: str) -> tuple[str, str]:
    """(bucket or container, key prefix) of an object-store URI."""
    kind = store_kind(uri)
    if kind == "s3":
        return parse_s3_uri(uri)
    if kind == "gcs":
        return parse_gcs_uri(uri)
    if kind == "azure":
        c, _, p = parse_azure_uri(uri)
        return c, p
    raise WarehouseConfigError(f"warehouse {uri!r} is not on an object store")


def _check_endpoint(endpoint: str | None, what: str, allow_http: bool | None) -> None:
    check_endpoint(endpoint, what, allow_http, "only loopback endpoints may use http (or set MOONCAKE_ALLOW_HTTP=1)")


# --------------------------------------------------------------------------------------------- GCS
@dataclass(frozen=True)
class GCSConfig:
    """How to reach Google Cloud Storage (or an emulator).

    ``endpoint``: URL with scheme (``http://127.0.0.1:4443``); None = Google. ``project``: the project
    (needed to create buckets only). ``token``: what gcsfs takes: ``"anon"``, ``"google_default"``
    (application-default credentials) or the path of a credentials JSON file (never its content).
    ``allow_http``: permit a plain-HTTP endpoint (None: loopback only).
    """

    endpoint: str | None = None
    project: str | None = None
    token: str = "google_default"
    allow_http: bool | None = None

    kind = "gcs"

    def validate(self) -> GCSConfig:
        """``WarehouseConfigError`` for a bad endpoint or a credentials file that does not exist."""
        _check_endpoint(self.endpoint, "GCS", self.allow_http)
        if self.token not in ("anon", "google_default", "cloud", "cache") and not os.path.isfile(self.token):
            raise WarehouseConfigError(
                f"GCS credentials file {self.token} does not exist (MOONCAKE_GCS_TOKEN / "
                "GOOGLE_APPLICATION_CREDENTIALS)"
            )
        return self

    def describe(self) -> str:
        """Where requests go, for error messages: the endpoint, or ``Google Cloud Storage``."""
        return self.endpoint or "Google Cloud Storage"

    def fileio_properties(self) -> dict[str, str]:
        """PyIceberg FileIO properties: ``py-io-impl`` (``fileio.MooncakeFileIO``), ``gcs.oauth2.token``,
        ``gcs.service.host`` (a custom endpoint), ``gcs.project-id`` and ``mooncake.allow-http``;
        :meth:`from_properties` reads them back. The token is a mode or a file path, never a key."""
        props = {"py-io-impl": FILEIO_IMPL, "gcs.oauth2.token": self.token}
        if self.endpoint:
            props["gcs.service.host"] = self.endpoint
        if self.project:
            props["gcs.project-id"] = self.project
        if self.allow_http is not None:
            props[ALLOW_HTTP_PROP] = str(self.allow_http).lower()
        return props

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> GCSConfig:
        """The config :meth:`fileio_properties` wrote (token ``google_default`` when absent); not validated."""
        return cls(
            endpoint=props.get("gcs.service.host"),
            project=props.get("gcs.project-id"),
            token=props.get("gcs.oauth2.token") or "google_default",
            allow_http=allow_http_property(props),
        )

    def filesystem(self) -> AbstractFileSystem:
        """A ``gcsfs`` filesystem. For a custom endpoint (an emulator) the core ``GCSFileSystem``: the
        extended one probes a bucket's layout through Google's gRPC storage-control API, which no
        emulator serves (each probe would wait out its timeout)."""
        from gcsfs.core import GCSFileSystem as Core

        cls = Core
        if not self.endpoint:
            import gcsfs

            cls = gcsfs.GCSFileSystem
        # no listing cache: the service adds and removes files under a reader (DuckDB globs through it)
        return cls(
            project=self.project,
            token=self.token,
            endpoint_url=self.endpoint,
            consistency="none",
            access="full_control",
            use_listings_cache=False,
        )

    def hints(self) -> dict[str, Any]:
        """What a union reader needs to reach the store, no credentials: ``{"endpoint", "project",
        "allow_http", "anon"}`` (``resolve_gcs(hints=...)`` takes it)."""
        return {
            "endpoint": self.endpoint,
            "project": self.project,
            "allow_http": self.allow_http,
            "anon": self.token == "anon",
        }


def resolve_gcs(*, hints: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> GCSConfig:
    """The GCSConfig of this process (module docstring): ``hints`` (from the service) > environment."""
    env = os.environ if env is None else env
    endpoint = _first_env(ENV_GCS_ENDPOINT, env)
    if endpoint and "://" not in endpoint:  # STORAGE_EMULATOR_HOST may be host:port
        endpoint = "http://" + endpoint
    project = _first_env(ENV_GCS_PROJECT, env)
    if hints:
        endpoint = hints.get("endpoint") or endpoint
        project = hints.get("project") or project
    token = env.get("MOONCAKE_GCS_TOKEN") or env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not token:
        loop = endpoint is not None and is_loopback(urlsplit(endpoint).hostname)
        token = "anon" if (loop or (hints or {}).get("anon")) else "google_default"
    from .config import ENV_ALLOW_HTTP, parse_bool

    allow_http = parse_bool(_first_env(("MOONCAKE_ALLOW_HTTP",) + ENV_ALLOW_HTTP, env), "MOONCAKE_ALLOW_HTTP")
    return GCSConfig(
        endpoint=endpoint.rstrip("/") if endpoint else None, project=project, token=token, allow_http=allow_http
    ).validate()


# ------------------------------------------------------------------------------------------- Azure
def _conn_fields(conn: str) -> dict[str, str]:
    out = {}
    for part in conn.split(";"):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip().lower()] = v.strip()
    return out


@dataclass(frozen=True)
class AzureConfig:
    """How to reach Azure Blob Storage / ADLS Gen2 (or Azurite).

    ``account``: storage account name. ``endpoint``: blob endpoint URL (None = the account's public one).
    ``connection_string``, ``account_key``, ``sas_token``: credentials (secrets: in memory only; ``repr``
    hides them); none of them = ``DefaultAzureCredential``. ``allow_http``: permit plain HTTP (None:
    loopback only).
    """

    account: str | None = None
    endpoint: str | None = None
    connection_string: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    allow_http: bool | None = None

    kind = "azure"

    def __repr__(self) -> str:  # never the secrets
        return f"AzureConfig(account={self.account!r}, endpoint={self.endpoint!r})"

    def validate(self) -> AzureConfig:
        _check_endpoint(self.endpoint, "Azure", self.allow_http)
        if not (self.account or self.connection_string):
            raise WarehouseConfigError(
                "Azure warehouse: no storage account; set AZURE_STORAGE_CONNECTION_STRING or "
                "AZURE_STORAGE_ACCOUNT_NAME (or use abfss://container@ACCOUNT.dfs.core.windows.net/…)"
            )
        return self

    def describe(self) -> str:
        """Where requests go, for error messages: the endpoint, or the account's blob URL (never a secret)."""
        return self.endpoint or f"https://{self.account}.blob.core.windows.net"

    def fileio_properties(self) -> dict[str, str]:
        """PyIceberg FileIO properties: ``py-io-impl`` (``fileio.MooncakeFileIO``), ``adls.account-name``,
        ``adls.connection-string`` / ``adls.account-key`` / ``adls.sas-token`` (this process's secrets:
        never saved), ``mooncake.azure-endpoint`` and ``mooncake.allow-http``, each only when set;
        :meth:`from_properties` reads them back."""
        props = {"py-io-impl": FILEIO_IMPL}
        for k, v in (
            ("adls.account-name", self.account),
            ("adls.connection-string", self.connection_string),
            ("adls.account-key", self.account_key),
            ("adls.sas-token", self.sas_token),
            ("mooncake.azure-endpoint", self.endpoint),
        ):
            if v:
                props[k] = v
        if self.allow_http is not None:
            props[ALLOW_HTTP_PROP] = str(self.allow_http).lower()
        return props

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> AzureConfig:
        """The config :meth:`fileio_properties` wrote; not validated."""
        return cls(
            account=props.get("adls.account-name"),
            endpoint=props.get("mooncake.azure-endpoint"),
            connection_string=props.get("adls.connection-string"),
            account_key=props.get("adls.account-key"),
            sas_token=props.get("adls.sas-token"),
            allow_http=allow_http_property(props),
        )

    def filesystem(self) -> AbstractFileSystem:
        """An ``adlfs.AzureBlobFileSystem`` (the connection string wins over account + key/SAS), without a
        listing cache."""
        from adlfs import AzureBlobFileSystem

        if self.connection_string:
            return AzureBlobFileSystem(
                connection_string=self.connection_string,
                connection_timeout=10,
                read_timeout=30,
                use_listings_cache=False,
            )
        host = urlsplit(self.endpoint).netloc if self.endpoint else None
        return AzureBlobFileSystem(
            account_name=self.account,
            account_key=self.account_key,
            sas_token=self.sas_token,
            account_host=host,
            anon=False,
            connection_timeout=10,
            read_timeout=30,
            use_listings_cache=False,
        )

    def hints(self) -> dict[str, Any]:
        """What a union reader needs to reach the store, no secrets: ``{"account", "endpoint",
        "allow_http"}`` (``resolve_azure(hints=...)`` takes it)."""
        return {"account": self.account, "endpoint": self.endpoint, "allow_http": self.allow_http}


def resolve_azure(
    uri: str | None = None, *, hints: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> AzureConfig:
    """The AzureConfig of this process (module docstring): ``hints`` > URI account > environment."""
    env = os.environ if env is None else env
    conn = env.get("AZURE_STORAGE_CONNECTION_STRING") or None
    fields = _conn_fields(conn) if conn else {}
    account = _first_env(ENV_AZ_ACCOUNT, env) or fields.get("accountname")
    endpoint = env.get("MOONCAKE_AZURE_ENDPOINT") or fields.get("blobendpoint")
    if uri:
        _, uri_account, _ = parse_azure_uri(uri)
        account = uri_account or account
    if hints:
        account = hints.get("account") or account
        endpoint = hints.get("endpoint") or endpoint
    from .config import ENV_ALLOW_HTTP, parse_bool

    allow_http = parse_bool(_first_env(("MOONCAKE_ALLOW_HTTP",) + ENV_ALLOW_HTTP, env), "MOONCAKE_ALLOW_HTTP")
    return AzureConfig(
        account=account,
        endpoint=endpoint.rstrip("/") if endpoint else None,
        connection_string=conn,
        account_key=_first_env(ENV_AZ_KEY, env),
        sas_token=env.get("AZURE_STORAGE_SAS_TOKEN") or None,
        allow_http=allow_http,
    ).validate()


# ------------------------------------------------------------------------------------- dispatch
StoreConfig = S3Config | GCSConfig | AzureConfig


class WarehouseSettings(Protocol):
    """What the functions below read of a settings object (the service's config or the application's):
    ``warehouse_uri``, and the ``s3_*`` settings when present (read with ``getattr``)."""

    @property
    def warehouse_uri(self) -> str: ...


def resolve_store(
    uri: str, settings: object = None, *, hints: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> StoreConfig | None:
    """The config of the store ``uri`` lives on (None for a local warehouse), validated. ``settings``:
    the saved S3 settings (``s3_endpoint`` …); ``hints``: a ReadState's ``storage`` hints."""
    kind = store_kind(uri)
    if kind == "s3":
        parse_s3_uri(uri)
        return resolve_s3(settings, hints=hints, env=env)
    if kind == "gcs":
        parse_gcs_uri(uri)
        return resolve_gcs(hints=hints, env=env)
    if kind == "azure":
        return resolve_azure(uri, hints=hints, env=env)
    return None


def config_from_properties(kind: str, props: Mapping[str, str]) -> StoreConfig:
    """Rebuild a store config from ``fileio_properties()`` (what ``MooncakeFileIO`` is given)."""
    if kind == "s3":
        return S3Config.from_properties(props)
    if kind == "gcs":
        return GCSConfig.from_properties(props)
    if kind == "azure":
        return AzureConfig.from_properties(props)
    raise ValueError(f"no object store {kind!r}")


def warehouse_store(settings: WarehouseSettings) -> StoreConfig | None:
    """The store config (``S3Config``, ``stores.GCSConfig``, ``stores.AzureConfig``) of ``settings``'
    warehouse, or None for a local one. Raises ``WarehouseConfigError`` for a bad URI or settings."""
    return resolve_store(settings.warehouse_uri, settings)


def catalog_properties(settings: WarehouseSettings) -> dict[str, str]:
    """Extra ``make_catalog`` properties for ``settings``' warehouse (``py-io-impl`` and ``s3.*`` /
    ``gcs.*`` / ``adls.*``; empty for local ones). They hold this process's credentials: never save them."""
    cfg = warehouse_store(settings)
    return cfg.fileio_properties() if cfg else {}


def storage_hints(settings: WarehouseSettings) -> dict[str, Any] | None:
    """What a union reader needs to know to reach ``settings``' warehouse: None for local warehouses, else
    ``{"warehouse", "kind", ...the config's hints()}`` (endpoint, region/project/account; no credentials)."""
    cfg = warehouse_store(settings)
    return {"warehouse": settings.warehouse_uri, "kind": cfg.kind, **cfg.hints()} if cfg else None
