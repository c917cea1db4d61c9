"""The TCP request plane: frames, the sans-IO protocol, and the trio connections that carry it."""

from ._client import (
    ClientConnection as ClientConnection,
    ClientStream as ClientStream,
    ConnectionPool as ConnectionPool,
    parse_address as parse_address,
)
from ._frames import PROTOCOL_VERSION as PROTOCOL_VERSION, Item as Item
from ._protocol import ProtocolConnection as ProtocolConnection, Role as Role
from ._server import RequestPlaneServer as RequestPlaneServer, ServerStream as ServerStream

__all__ = [
    "PROTOCOL_VERSION",
    "ClientConnection",
    "ClientStream",
    "ConnectionPool",
    "Item",
    "ProtocolConnection",
    "RequestPlaneServer",
    "Role",
    "ServerStream",
    "parse_address",
]
