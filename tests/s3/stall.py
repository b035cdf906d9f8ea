"""A loopback TCP proxy in front of an S3 endpoint that holds one upload half-way.

The test that kills the store mid-upload needs the upload to *be* in flight when the store dies:
a PUT of a few MiB over loopback finishes in milliseconds, so a kill timed from outside would
land before or after it. Through this proxy, the first PUT whose request line holds `marker` is
forwarded up to half its body, then held: `stalled` is set, and once the test has killed the
store it sets `release` and the held connection is closed. Everything else passes through.

HTTP/1.1 requests are followed one after another on each kept-alive connection (headers, then
`Content-Length` body bytes); a chunked body makes the proxy pass the rest of that connection
through untouched (obstore sends Content-Length for the uploads tested here).
"""

from __future__ import annotations

import contextlib
import socket
import threading

HEADER_MAX = 64 << 10


class StallingProxy:
    """Listens on 127.0.0.1:`port`, forwards to 127.0.0.1:`upstream` (see the module docstring)."""

    def __init__(self, upstream: int, marker: bytes) -> None:
        self.upstream = upstream
        self.marker = marker
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.held: bytes = b""  # the request line of the PUT that was held
        self._armed = True
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self.release.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # the store is down: the client sees a refused connection
                continue
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._upstream, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        _shut(src, dst)

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        """Client → store, request by request, holding the marked PUT half-way."""
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(1 << 16)
                    if not data or len(buf) > HEADER_MAX:
                        server.sendall(buf)
                        return _shut(client, server)
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                line, *fields = head.split(b"\r\n")
                length, chunked = 0, False
                for f in fields:
                    name, _, value = f.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                    elif name.strip().lower() == b"transfer-encoding":
                        chunked = True
                server.sendall(head + b"\r\n\r\n")
                if chunked:
                    server.sendall(buf)
                    return self._pipe(client, server)
                hold = self._take(line, length)
                body_left = length
                if hold:
                    half = length // 2
                    while len(buf) < half:
                        data = client.recv(1 << 16)
                        if not data:
                            return _shut(client, server)
                        buf += data
                    server.sendall(buf[:half])
                    self.stalled.set()
                    self.release.wait()
                    return _shut(client, server)
                while body_left:
                    if not buf:
                        buf = client.recv(1 << 16)
                        if not buf:
                            return _shut(client, server)
                    part, buf = buf[:body_left], buf[body_left:]
                    server.sendall(part)
                    body_left -= len(part)
        except OSError:
            _shut(client, server)

    def _take(self, line: bytes, length: int) -> bool:
        with self._lock:
            if self._armed and line.startswith(b"PUT ") and self.marker in line and length > 1:
                self._armed = False
                self.held = line
                return True
        return False


class PassingProxy(StallingProxy):
    """Holds nothing: requests pass on as they come. Subclasses change the answers (`_pipe`)."""

    def __init__(self, upstream: int) -> None:
        super().__init__(upstream, b"\0")

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(1 << 16):
                server.sendall(data)
        _shut(client, server)


def _shut(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
