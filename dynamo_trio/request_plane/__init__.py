"""The TCP request plane: frames, the sans-IO protocol, and the trio connections that carry it."""

from .._hostport import parse_address
from ._client import ClientConnection, ClientStream, ConnectionPool
from ._frames import PROTOCOL_VERSION, Item
from ._protocol import ProtocolConnection, Role
from ._server import RequestPlaneServer, ServerStream

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
