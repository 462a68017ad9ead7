"""The replicator service (single writer) and its Arrow Flight client."""

from .client import ServiceClient, ServiceError, ServiceUnavailable

__all__ = ["ServiceClient", "ServiceError", "ServiceUnavailable"]
