"""The HTTP side of `vgpulimit metrics`: serves one registry's collection to
every scraper, and stays bounded however many come.

- One collection at a time.  A scrape that arrives while a collection runs
  waits for it and is served its result, each format (Prometheus text,
  OpenMetrics, gzipped or not) encoded once per collection: two hundred
  scrapers at once cost one collection, not two hundred in a row.
- A scrape whose client has gone by the time its turn comes (it timed out
  and closed, as Prometheus does at its scrape_timeout) is dropped before
  anything is collected for it: a burst of abandoned scrapes leaves no
  backlog, and the next scrape is answered at once.
- At most MAX_CONNECTIONS connections are served at once (a thread each);
  the rest wait in the listen queue.  A client has REQUEST_TIMEOUT_S to send
  its request and SEND_TIMEOUT_S for each write of the answer, so that a
  client that sends or reads nothing holds nothing for long.
- One connection, one answer (HTTP/1.0): no idle keep-alive holds a thread.

Nothing here knows what is collected (metrics.py does)."""

from __future__ import annotations

import gzip
import select
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from urllib.parse import urlsplit

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted

from vgpulimit.processes import shown

MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0
# Connections the kernel holds for us while every thread is busy.
LISTEN_QUEUE = 256


class _Round:
    """One collection, and its output in each format asked for so far."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.families: list[Metric] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._bodies: dict[tuple[str, bool], bytes] = {}

    def collect(self) -> Iterable[Metric]:   # what an encoder asks of a registry
        return iter(self.families)

    def body(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, list[tuple[str, str]]]:
        encoder, content_type = choose_encoder(accept or "")
        zipped = gzip_accepted(accept_encoding or "")
        with self._lock:
            key = (content_type, zipped)
            if key not in self._bodies:
                output = encoder(self)
                self._bodies[key] = gzip.compress(output) if zipped else output
            output = self._bodies[key]
        headers = [("Content-Type", content_type)]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        return output, headers


class SharedCollection:
    """Runs ``collect`` for one scrape at a time and hands its result to
    every scrape that came while it ran."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect
        self._lock = threading.Lock()
        self._running: _Round | None = None

    def latest(self, gone: Callable[[], bool] = lambda: False) -> _Round | None:
        """The running collection once it is done, else a new one; None,
        and nothing collected, when ``gone()`` says the scraper left first."""
        with self._lock:
            current = self._running
            lead = current is None
            if lead:
                if gone():
                    return None
                current = self._running = _Round()
        if not lead:
            current.done.wait()
            return current
        try:
            current.families = list(self._collect())
        except Exception as exc:   # noqa: BLE001 -- one bad collection must not end the server
            current.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._running = None
            current.done.set()
        return current


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = REQUEST_TIMEOUT_S   # StreamRequestHandler: the socket's timeout while reading

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/favicon.ico":   # browsers ask; nothing to collect
            self._answer(200, b"", [])
            return
        done = self.server.shared.latest(self._gone)
        if done is None:
            self.close_connection = True
            return
        if done.error is not None:
            self.server.say(f"a scrape failed: {done.error}")
            self._answer(500, f"# collection failed: {shown(done.error)}\n".encode(),
                         [("Content-Type", "text/plain; charset=utf-8")])
            return
        body, headers = done.body(self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
        self._answer(200, body, headers)

    def _answer(self, code: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.connection.settimeout(SEND_TIMEOUT_S)
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _gone(self) -> bool:
        """Whether the client closed its side: its request is read, so
        anything further to read now is its end of the stream."""
        poll = select.poll()
        poll.register(self.connection, select.POLLIN)
        if not poll.poll(0):
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def log_message(self, format: str, *args) -> None:
        """Quiet: a scrape loop must not flood the log."""


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_QUEUE

    def __init__(self, host: str, port: int, collect: Callable[[], Iterable[Metric]]) -> None:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self.shared = SharedCollection(collect)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._said: set[str] = set()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's would look the host's name up in DNS, which may hang.
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request, client_address) -> None:
        self._slots.acquire()   # the accept loop waits here: the rest stay queued in the kernel
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A client that left or stalled is no error of ours; anything else
        is said once, never as a traceback per scrape."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        self.say(f"serving {client_address[0]} failed: {type(exc).__name__}: {exc}")

    def say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            print(f"vgpulimit metrics: {shown(line)}", file=sys.stderr, flush=True)
