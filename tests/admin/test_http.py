"""The admin HTTP server over a real socket: routing, keep-alive, bounds, bad requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from trimaran.admin.http import HttpError, HttpServer, Request, Response

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def echo(request: Request) -> Response:
    return Response.json(
        {"name": request.params.get("name"), "body": request.body.decode(), "q": request.arg("q")}
    )


async def teapot(_request: Request) -> Response:
    raise HttpError(418, "teapot", "short and stout")


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = HttpServer(max_body_bytes=100, request_timeout_s=0.5)
    server.route("POST", "/things/{name}", echo)
    server.route("GET", "/teapot", teapot)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def serve_one(stream: anyio.abc.SocketStream) -> None:
        await server.handle(stream)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve_one)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


async def exchange(port: int, raw: bytes, until_closed: bool = False) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(raw)
        data = b""
        with anyio.move_on_after(2):
            while True:
                try:
                    chunk = await stream.receive()
                except anyio.EndOfStream:
                    break
                data += chunk
                if (
                    not until_closed
                    and b"\r\n\r\n" in data
                    and data.count(b"HTTP/1.1") >= raw.count(b"HTTP/1.1")
                ):
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
        return data


async def test_route_params_query_and_body(port: int) -> None:
    data = await exchange(port, b"POST /things/a%20b?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    assert data.startswith(b"HTTP/1.1 200 ")
    assert data.endswith(b'{"name":"a b","body":"hi","q":"1"}')


async def test_keep_alive_serves_two_requests(port: int) -> None:
    one = b"POST /things/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    data = await exchange(
        port, one + one.replace(b"Host: x", b"Host: x\r\nConnection: close"), until_closed=True
    )
    assert data.count(b"HTTP/1.1 200 ") == 2


async def test_errors_are_json(port: int) -> None:
    assert b'"code":"teapot"' in await exchange(port, b"GET /teapot HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await exchange(port, b"GET /things/x HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
    assert (await exchange(port, b"GET /zzz HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 404 ")


async def test_body_too_large_is_413(port: int) -> None:
    data = await exchange(
        port, b"POST /things/x HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n", until_closed=True
    )
    assert data.startswith(b"HTTP/1.1 413 ")


async def test_garbage_is_400(port: int) -> None:
    data = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n", until_closed=True)
    assert data.startswith(b"HTTP/1.1 400 ")


async def test_slow_request_times_out_with_408(port: int) -> None:
    data = await exchange(
        port, b"POST /things/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab", until_closed=True
    )
    assert data.startswith(b"HTTP/1.1 408 ")
