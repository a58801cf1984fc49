"""A fast loopback OpenAI-style streaming server that logs exactly when it sent every token, for benchmarks.

One asyncio (uvloop) process, no web framework: it reads a request, answers with vLLM 0.32's chunk format
(continuous usage stats, one token per chunk, chunked transfer encoding as uvicorn sends it) and records, per
X-Request-Id, the wall-clock time the request was complete in its buffer and the wall-clock time each token's
chunk was handed to the kernel. GET /truth returns those logs, so a client's TTFT/ITL/TPOT can be compared with
what the server really did: the server's own lateness is then not counted as client error. GET /counter returns
the token chunks sent so far (a benchmark's tokens per window, from the server's own count).

Modes:
- timed: token i is scheduled at receipt + ttft + (i - 1) * itl (absolute deadlines, no drift). The receipt is the
  kernel's receive stamp of the packet that completed the request (SO_TIMESTAMPNS, set on the listening socket and
  inherited by every accepted one; sockets read with recvmsg from the loop's add_reader), not when this process got
  to it: a wave of 64 new connections took this server ~3 ms to accept and read, and with a user-space stamp that
  showed as the client's send delay;
- flood: the whole stream is written at once, as fast as the socket takes it (client throughput), through uvloop's
  transports (receipt: the user-space time of data_received).

    python -m tests.benchmarks.streamserver --port 0 --ttft-ms 50 --itl-ms 10 [--flood] [--cpu 1]

Prints "listening on PORT" when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import struct
import time

import orjson

CHUNK = (
    b'{"id":"cmpl-bench","object":"text_completion","created":1795966847,"model":"bench","choices":[{"index":0,'
    b'"text":"tok","logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":null}],"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}}'
)
USAGE = (
    b'{"id":"cmpl-bench","object":"text_completion","created":1795966847,"model":"bench","choices":[],'
    b'"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}}'
)
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
    b"%sdate: Sun, 29 Nov 2026 00:00:00 GMT\r\nserver: bench\r\n\r\n"
)


def http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(data: bytes) -> bytes:
    return http_chunk(b"data: " + data + b"\n\n")


class Streams:
    """Pre-built wire bytes of a stream of n tokens (each chunk once, shared by all requests)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[list[bytes], bytes]] = {}

    def get(self, n: int) -> tuple[list[bytes], bytes]:
        if n not in self._cache:
            chunks = [event(CHUNK % (b'"length"' if i == n else b"null", 8 + i, i)) for i in range(1, n + 1)]
            tail = event(USAGE % (8 + n, n)) + event(b"[DONE]") + b"0\r\n\r\n"
            self._cache[n] = (chunks, tail)
        return self._cache[n]


class Server:
    def __init__(self, ttft_s: float, itl_s: float, flood: bool) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.flood = flood
        self.streams = Streams()
        self.truth: dict[str, dict] = {}
        self.tokens = 0  # token chunks handed to the kernel so far: GET /counter

    def protocol(self) -> asyncio.Protocol:
        return Connection(self)


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True

    def data_received(self, data: bytes, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.handle(now, method, path, headers, body)

    def reply(self, status: str, body: bytes, close: bool) -> None:
        conn = b"connection: close\r\n" if close else b""
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status.encode(), len(body), conn, body)
        )
        if close:
            self.transport.close()

    def handle(self, now: float, method: str, path: str, headers: dict, body: bytes) -> None:
        close = headers.get("connection", "").lower() == "close"
        if path.endswith("/v1/models"):
            return self.reply("200 OK", orjson.dumps({"object": "list", "data": [{"id": "bench"}]}), close)
        if path == "/truth":
            return self.reply("200 OK", orjson.dumps(self.server.truth), close)
        if path == "/counter":
            return self.reply("200 OK", orjson.dumps({"tokens": self.server.tokens, "time": time.time()}), close)
        if path == "/reset":
            self.server.truth.clear()
            return self.reply("200 OK", b"{}", close)
        if path == "/metrics":
            return self.reply("200 OK", b"# no metrics: benchmark server\n", close)
        if not path.endswith("/completions") or method != "POST":
            return self.reply("404 Not Found", b'{"error":"not found"}', close)
        n = int(orjson.loads(body).get("max_tokens") or 16)
        rid = headers.get("x-request-id", "")
        sent: list[float] = []
        self.server.truth[rid] = {"received": now, "sent": sent}
        chunks, tail = self.server.streams.get(n)
        self.transport.write(HEAD % (b"connection: close\r\n" if close else b""))
        if self.server.flood:
            self.transport.write(b"".join(chunks) + tail)
            sent.append(time.time())
            self.server.tokens += len(chunks)
            if close:
                self.transport.close()
            return
        loop = asyncio.get_running_loop()
        start = loop.time() + self.server.ttft_s - (time.time() - now)  # deadlines from the receipt, not from now
        # One timer at a time per stream (each send arms the next): scheduling all of a request's tokens on
        # arrival cost ~100 µs per request, which delayed reading the other requests of a wave (their receipt).
        loop.call_at(start, self.send, loop, start, chunks, tail, sent, close)

    def send(self, loop, start: float, chunks: list[bytes], tail: bytes, sent: list[float], close: bool) -> None:
        if self.closed:
            return
        i = len(sent)
        sent.append(time.time())
        self.server.tokens += 1
        if i + 1 < len(chunks):
            self.transport.write(chunks[i])
            loop.call_at(start + (i + 1) * self.server.itl_s, self.send, loop, start, chunks, tail, sent, close)
            return
        self.transport.write(chunks[i] + tail)
        if close:
            self.transport.close()


SO_TIMESTAMPNS = 35  # Linux's generic value (x86_64, arm64), as locustfiles/stream_client.py
ANCILLARY = socket.CMSG_SPACE(16)


class RawTransport:
    """The part of an asyncio transport that Connection uses (write, close), on a non-blocking socket read with
    recvmsg: every read carries the kernel's receive stamp, handed to Connection.data_received."""

    def __init__(self, loop, sock: socket.socket, protocol: Connection) -> None:
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.pending = bytearray()
        self.closed = False
        protocol.connection_made(self)
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _flags, _addr = self.sock.recvmsg(65536, ANCILLARY)
        except BlockingIOError:
            return
        except OSError:
            return self.close()
        if not data:
            return self.close()
        stamp = None
        if ancillary and ancillary[0][1] == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack_from("qq", ancillary[0][2])
            stamp = sec + nsec * 1e-9
        self.protocol.data_received(data, stamp)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.pending:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return self.close()
            if sent == len(data):
                return
            data = data[sent:]
            self.loop.add_writer(self.sock.fileno(), self._flush)
        self.pending += data

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except BlockingIOError:
            return
        except OSError:
            return self.close()
        del self.pending[:sent]
        if not self.pending:
            self.loop.remove_writer(self.sock.fileno())
            if self.closed:
                self._shut()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.protocol.connection_lost(None)
        if not self.pending:
            self._shut()

    def _shut(self) -> None:
        self.loop.remove_writer(self.sock.fileno())
        self.sock.close()


def serve_raw(loop, server: Server, port: int) -> socket.socket:
    """Accept on a listening socket whose kernel stamps every accepted socket inherits (timed mode)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    listener.setblocking(False)

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            RawTransport(loop, sock, server.protocol())

    loop.add_reader(listener.fileno(), accept)
    return listener


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=50)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--flood", action="store_true")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # the stdlib loop is slower but as exact: its send stamps are what it really did
        pass
    # No garbage collection: the send logs only grow, and a full collection over them stalled the loop for tens of
    # ms, which delayed reading requests (their receipt stamps): counted as the client's send delay.
    gc.disable()
    server = Server(a.ttft_ms / 1000, a.itl_ms / 1000, a.flood)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        if not a.flood:
            listener = serve_raw(loop, server, a.port)
            print(f"listening on {listener.getsockname()[1]}", flush=True)
            await asyncio.Event().wait()
        srv = await loop.create_server(server.protocol, "127.0.0.1", a.port, backlog=4096)
        print(f"listening on {srv.sockets[0].getsockname()[1]}", flush=True)
        await srv.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
