"""One HTTP connection that posts a prepared request and stamps every block of a streamed answer as it arrives (or,
for an answer that does not stream, the block that completed it: `fetch`).

Built from geventhttpclient's parts (its connection pools for TCP/TLS, its llhttp response parser) rather than
its `HTTPClient.request` + `readline`, for three reasons measured with tests/benchmarks/bench_generator.py:
- the send stamp: `request()` connects after the caller's stamp, so under load a request waited for the event
  loop between its stamp and the wire (counted as server TTFT). Here the connection is made first, then the
  stamp, then one `sendall` of bytes prepared in advance;
- the per-line cost: `readline` copies and shifts a bytearray per line (2 lines per SSE event). Here one
  `recv` gets one stamp, and the lines it completed are split off in one go;
- honest stamps: every line completed by a read carries that read's time (a line split across two reads is
  stamped by the read that completed it). On Linux over plain TCP that time is the kernel's receive timestamp
  (SO_TIMESTAMPNS: when the packet reached this host), not when this process got around to reading it: with 64
  streams whose chunks arrive together, the last of them was read ~4 ms after it arrived, and a user-space stamp
  counted that as server latency. (For TCP the kernel reports the newest packet of a read: chunks that queued up
  because the process was late share the last one's time, still no later than the read. The event-loop lag
  probe flags such steps.) Elsewhere, and over TLS, the stamp is taken right after the read returns.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time
from collections.abc import Callable

import gevent
from geventhttpclient._parser import HTTPResponseParser
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import HTTPParseError, HTTPResponse
from geventhttpclient.url import URL

RECV_BYTES = 64 * 1024  # one read takes whatever has arrived, up to this much
MAX_ERROR_BODY = 64 * 1024  # bytes of a non-200 body kept to extract the server's message
# SO_TIMESTAMPNS, "old" 64-bit timespec variant (the socket module does not name it): 35 in Linux's generic
# socket constants, which x86_64 and arm64 use; other platforms stamp in user space.
SO_TIMESTAMPNS = 35
KERNEL_STAMPS = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
ANCILLARY_BYTES = socket.CMSG_SPACE(16) if KERNEL_STAMPS else 0
_timespec = struct.Struct("qq").unpack_from
_feed = HTTPResponseParser.feed


class _Response(HTTPResponse):
    """geventhttpclient's llhttp response parser; the decoded body goes to `body`, which the reader drains."""

    def __init__(self) -> None:
        super().__init__(method="POST")
        self.body = bytearray()

    def _on_body(self, buf: bytearray) -> None:
        self.body += buf


class ReadTimeout(TimeoutError):
    """Neither the headers nor a complete line (a whole body, for fetch) came within the read timeout of the send or
    of the last complete line (raised into the reading greenlet by the watchdog)."""


class _Watchdog:
    """Read timeouts of every StreamClient in the process, checked by one greenlet.

    A socket timeout would do the same, but gevent arms and cancels a timer around every read: measured at
    64 streams, 10 ms per token, that was 15 % of a core (~25 µs per chunk) of a 54 % total. Here a read only
    stores its time; a stream silent for longer than its timeout gets a ReadTimeout in its greenlet, at most
    CHECK_S (or a quarter of the timeout) late.
    """

    CHECK_S = 1.0

    def __init__(self) -> None:
        self.clients: set[StreamClient] = set()
        self._greenlet: gevent.Greenlet | None = None

    def watch(self, client: StreamClient) -> None:
        self.clients.add(client)
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._loop)

    def _loop(self) -> None:
        while self.clients:
            gevent.sleep(min(self.CHECK_S, min(c.read_timeout for c in self.clients) / 4))
            now = time.time()
            for client in list(self.clients):
                reader = client.reader
                if reader is not None and now - client.last_read > client.read_timeout:
                    error = ReadTimeout(
                        f"no complete line from the server for {now - client.last_read:.1f} s (--read-timeout "
                        f"{client.read_timeout:g})"
                    )
                    gevent.get_hub().loop.run_callback(self._interrupt, client, reader, client.requests, error)

    @staticmethod
    def _interrupt(client: StreamClient, reader, request: int, error: ReadTimeout) -> None:
        """Raise the timeout in the reading greenlet, if it is still reading the same request.

        greenlet.throw from a loop callback, as gevent's own kill does; not Greenlet.kill, which also clears the
        greenlet's args, where Locust finds its User to stop it: killed once, a user could never be stopped.
        """
        if client.reader is reader and client.requests == request and not reader.dead:
            client.reader = None
            reader.throw(error)


_watchdog = _Watchdog()


class _ResolveOncePool:
    """Resolves the server's name once per connection pool: every request opens a connection (without
    keep-alive), and gevent's resolver hands each lookup to a thread, a hop through the GIL per request."""

    _addresses = None

    def _resolve(self):
        if self._addresses is None:
            self._addresses = super()._resolve()
        return self._addresses


class _Pool(_ResolveOncePool, ConnectionPool):
    pass


class _SSLPool(_ResolveOncePool, SSLConnectionPool):
    pass


class StreamClient:
    """Posts prepared requests on one connection (kept between requests only with keep_alive)."""

    def __init__(
        self,
        base: URL,
        path: str,
        headers: dict[str, str],
        connection_timeout: float,
        network_timeout: float,
        keep_alive: bool,
    ) -> None:
        tls = base.scheme == "https"
        pool = _SSLPool if tls else _Pool
        self.pool = pool(
            base.host, base.port, base.host, base.port, size=1,
            connection_timeout=connection_timeout, network_timeout=None,  # reads: the watchdog's timeout
        )  # fmt: skip
        self.read_timeout = network_timeout
        self.reader: gevent.Greenlet | None = None  # the greenlet reading a response now, for the watchdog
        self.last_read = 0.0  # wall clock of the last byte (or of the send stamp)
        self.requests = 0  # requests sent so far: tells the watchdog's late interrupt from a current one
        host = base.netloc.rpartition("@")[2]  # as the URL gave it: the port only when it was given
        fields = {"Host": host, "User-Agent": "vllm-loadtest", **headers}
        if not keep_alive:
            fields["Connection"] = "close"
        for name, value in fields.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name} contains a line break")
        # The request line and fixed headers, the same for every request of this client: prepared bodies are
        # shared between clients whose heads are equal.
        self.head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        self.keep_alive = keep_alive
        self.kernel_stamps = KERNEL_STAMPS and not tls  # a TLS socket has no recvmsg
        _watchdog.watch(self)
        self.start_time = 0.0  # wall clock of the send stamp of the current request
        self.t0 = 0.0  # perf_counter of the send stamp; 0 until the request is sent
        self.connect_time = 0.0  # wall clock and perf_counter when the current attempt began (before connecting)
        self.connect_t = 0.0
        self.status = 0
        self.content_type = ""
        self.error_body = b""
        self.nbytes = 0
        self.complete = False  # fetch(): the body ended as its framing says
        self.last_offset_s: float | None = None  # fetch(): the last byte's arrival since the send stamp

    def prepare(self, body: bytes) -> tuple[bytes, bytes]:
        """The request bytes before and after the X-Request-Id value (the only part that changes)."""
        head = f"{self.head}Content-Length: {len(body)}\r\nX-Request-Id: "
        return head.encode("latin-1"), b"\r\n\r\n" + body

    def stream(self, prepared: tuple[bytes, bytes], request_id: str, on_line: Callable[[float, bytes], object]) -> None:
        """Send the request, then call on_line(offset_s since the send stamp, line) for every line of a 200 body.

        Sets status, content_type, nbytes, and error_body (the start of a non-200 body). Raises what the socket
        or the parser raises (OSError incl. TimeoutError, HTTPParseError, GreenletExit); `t0` is set by then.
        """
        request = prepared[0] + request_id.encode("latin-1") + prepared[1]
        self.status, self.content_type, self.error_body, self.nbytes, self.t0 = 0, "", b"", 0, 0.0
        self.connect_time, self.connect_t = time.time(), time.perf_counter()
        sock = self.pool.get_socket()  # connected (or reused) before the stamp: connecting is not server latency
        kernel = self.kernel_stamps
        if kernel:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:  # a kernel without it: user-space stamps from now on
                kernel = self.kernel_stamps = False
        reusable = False
        try:
            response = _Response()
            feed = _feed.__get__(response)  # llhttp itself: geventhttpclient's wrapper only mends HEAD responses
            body = response.body
            wall = time.time
            # The OS socket under gevent's wrapper, and gevent's own wait for it to become readable: a read that
            # came back short emptied the socket, so the next one waits first instead of failing with EAGAIN (a
            # syscall and an exception per chunk, measured in tests/benchmarks/bench_generator.py).
            raw = sock._sock
            readable = sock._read_event
            wait = sock._wait
            recv = sock.recv  # without kernel stamps (TLS, or not Linux): gevent's own, which waits and decrypts
            self.t0 = time.perf_counter()  # before the wall stamp: duration_s covers e2e_s even if preempted here
            self.start_time = self.last_read = start = wall()
            self.requests += 1
            self.reader = gevent.getcurrent()
            sock.sendall(request)
            status = 0
            drained = True  # nothing can have arrived yet: wait before the first read
            while True:
                if kernel:
                    if drained:
                        wait(readable)
                    try:
                        data, ancillary, _flags, _addr = raw.recvmsg(RECV_BYTES, ANCILLARY_BYTES)
                    except BlockingIOError:  # woken without data (a spurious wake-up)
                        drained = True
                        continue
                    # Offsets in wall-clock time, the clock of the kernel's stamps and of the send stamp.
                    if ancillary and ancillary[0][1] == SO_TIMESTAMPNS:  # SCM_TIMESTAMPNS has the option's value
                        sec, nsec = _timespec(ancillary[0][2])
                        t = sec + nsec * 1e-9
                    else:  # the end of the stream (no data, no stamp)
                        t = wall()
                    drained = len(data) < RECV_BYTES
                else:
                    data = recv(RECV_BYTES)
                    t = wall()
                feed(data)  # b"" tells llhttp the connection closed: it ends a body delimited by the close
                if not status and response.headers_complete:
                    status = self.status = response.status_code
                    self.content_type = str(response.get("content-type") or "")
                    self.last_read = t
                if body:
                    if status == 200:
                        end = body.rfind(b"\n") + 1
                        if end:  # complete lines: the read timeout counts from the last (a trickle keeps none alive)
                            self.last_read = t
                            self.nbytes += end
                            offset = t - start
                            for line in bytes(body[:end]).split(b"\n"):
                                if line:
                                    on_line(offset, line)
                            del body[:end]
                    elif len(body) >= MAX_ERROR_BODY:
                        break
                if response.message_complete or not data:
                    break
            if status == 200 and body:  # a last line without its newline, at the end of the stream
                self.nbytes += len(body)
                on_line(t - start, bytes(body))
            elif status != 200:
                self.error_body = bytes(body[:MAX_ERROR_BODY])
            reusable = self.keep_alive and response.message_complete and not response.should_close()
        finally:
            self.reader = None
            if reusable:
                self.pool.return_socket(sock)
            else:
                self.pool.release_socket(sock)

    def fetch(self, prepared: tuple[bytes, bytes], request_id: str) -> bytearray:
        """Send the request and read its whole answer (a response that does not stream: embeddings); return the body.

        Sets status, content_type, nbytes, error_body (the start of a non-200 body), complete (the body ended as its
        framing says, not by a lost connection) and last_offset_s: the stamp of the last read that brought bytes of
        the response, since the send stamp (the arrival of the body's last byte; the kernel's stamp where streams
        get one). Raises as stream() does; `t0` is set by then. The streaming path is stream(): kept apart so that
        its per-line loop carries nothing of this one.
        """
        request = prepared[0] + request_id.encode("latin-1") + prepared[1]
        self.status, self.content_type, self.error_body, self.nbytes, self.t0 = 0, "", b"", 0, 0.0
        self.complete, self.last_offset_s = False, None
        self.connect_time, self.connect_t = time.time(), time.perf_counter()
        sock = self.pool.get_socket()  # connected (or reused) before the stamp: connecting is not server latency
        kernel = self.kernel_stamps
        if kernel:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                kernel = self.kernel_stamps = False
        reusable = False
        try:
            response = _Response()
            feed = response.feed
            body = response.body
            wall = time.time
            self.t0 = time.perf_counter()  # before the wall stamp: duration_s covers e2e_s even if preempted here
            self.start_time = self.last_read = start = wall()
            self.requests += 1
            self.reader = gevent.getcurrent()
            sock.sendall(request)
            last = None
            while True:
                if kernel:
                    data, ancillary, _flags, _addr = sock.recvmsg(RECV_BYTES, ANCILLARY_BYTES)
                    if ancillary and ancillary[0][1] == SO_TIMESTAMPNS:
                        sec, nsec = _timespec(ancillary[0][2])
                        t = sec + nsec * 1e-9
                    else:
                        t = wall()
                else:
                    data = sock.recv(RECV_BYTES)
                    t = wall()
                if data:
                    last = t  # the end of the stream (b"") is noticed later than the last byte arrived
                    feed(data)
                else:
                    try:
                        feed(data)  # tells llhttp the connection closed: it ends a body delimited by the close
                    except HTTPParseError:  # closed inside the body: not complete (the caller says so in its words)
                        break
                if not self.status and response.headers_complete:
                    self.status = response.status_code
                    self.content_type = str(response.get("content-type") or "")
                    self.last_read = t  # the whole body within the read timeout of its headers
                if self.status and self.status != 200 and len(body) >= MAX_ERROR_BODY:
                    break
                if response.message_complete or not data:
                    break
            self.complete = response.message_complete
            self.nbytes = len(body)
            self.last_offset_s = None if last is None else last - start
            if self.status != 200:
                self.error_body = bytes(body[:MAX_ERROR_BODY])
            reusable = self.keep_alive and response.message_complete and not response.should_close()
            return body
        finally:
            self.reader = None
            if reusable:
                self.pool.return_socket(sock)
            else:
                self.pool.release_socket(sock)

    def close(self) -> None:
        _watchdog.clients.discard(self)
        self.pool.close()
