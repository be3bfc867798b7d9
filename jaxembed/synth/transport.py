"""The LLM client's HTTP connections with separate limits: connecting (TCP and TLS) within a connect timeout, then
each read within the request's timeout (``urllib.request``'s one ``timeout`` covers both); ``read_by`` reads an
answer's body as it arrives and gives up at a deadline, so an endpoint that trickles bytes cannot hold a request
forever."""

from __future__ import annotations

import functools
import http.client
import time
import urllib.request


class _Timeouts:
    """An HTTP(S) connection that connects within ``connect_timeout``, then reads with the request's timeout."""

    def __init__(self, *args, connect_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self._read_timeout, self.timeout = self.timeout, connect_timeout

    def connect(self):
        super().connect()
        self.sock.settimeout(self._read_timeout)


class _HTTPConnection(_Timeouts, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Timeouts, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, connect_timeout: float):
        super().__init__()
        self.connect_timeout = connect_timeout

    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, connect_timeout=self.connect_timeout), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, connect_timeout: float):
        super().__init__()
        self.connect_timeout = connect_timeout

    def https_open(self, req):
        return self.do_open(functools.partial(_HTTPSConnection, connect_timeout=self.connect_timeout), req,
                            context=self._context)


def read_by(r, deadline: float) -> bytes | None:
    """The body of response ``r``, read as it arrives; None when ``deadline`` (``time.monotonic``) passes before
    its end."""
    chunks = []
    while True:
        chunk = r.read1(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        if time.monotonic() > deadline:
            return None


def build_opener(connect_timeout: float) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies from the environment, redirects) whose HTTP and HTTPS connections connect within
    ``connect_timeout`` and then read with the timeout given to ``open``."""
    return urllib.request.build_opener(_HTTPHandler(connect_timeout), _HTTPSHandler(connect_timeout))
