"""The listening socket and the uvicorn server over it. The socket is bound before the models
load, so a taken port fails in one line at once, not after minutes of loading."""

import ipaddress
import socket

import uvicorn
from starlette.applications import Starlette

from specchat.errors import SpecchatError

BACKLOG = 128
GRACE_S = 5  # at shutdown, replies still streaming get this long to end before they are cut


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise SpecchatError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    except UnicodeError as error:  # a name IDNA cannot encode (an empty or 64-character label)
        raise SpecchatError(f"cannot listen on {host!r}: not a host name ({error})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as error:
        sock.close()
        raise SpecchatError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        return False


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Server(uvicorn.Server):
    """uvicorn, stopping the app's requests first when it shuts down: the queued ones are answered
    at once and the decoding one ends at its next iteration, so no stream holds the exit. A second
    Ctrl+C (uvicorn's forced exit) still shuts the app down: uvicorn skips that, and the app's
    lifespan, left waiting, was cancelled by the interrupt with a traceback on the terminal."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.config.app.state.scheduler.stop_all()
        await super().shutdown(sockets)
        if self.force_exit:
            await self.lifespan.shutdown()


def server_for(app: Starlette) -> uvicorn.Server:
    """uvicorn with its own logs at warning: the app logs one line per request itself."""
    return Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                         timeout_graceful_shutdown=GRACE_S))
