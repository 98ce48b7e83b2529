"""`raw_get`: an HTTP GET whose path goes out exactly as written, for path-traversal tests."""

from __future__ import annotations

import http.client


def raw_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` on 127.0.0.1:``port`` (httpx would normalise '..' away)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body
