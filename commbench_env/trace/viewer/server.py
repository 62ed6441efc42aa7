"""`commbench view`: a small HTTP server on 127.0.0.1 (standard library only; the page ships with the package),
and `--export`, the same pages as static files that open from disk."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from .data import EpisodeIndex

PAGE = Path(__file__).with_name("page.html")


def make_server(index: EpisodeIndex, port: int = 0) -> ThreadingHTTPServer:
    page = PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            url = urlparse(self.path)
            if url.path in ("/", "/index.html"):
                return self._send(200, page, "text/html; charset=utf-8")
            if url.path == "/api/episodes":
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                data = index.page(offset=int(q.get("offset", 0)), limit=min(int(q.get("limit", 100)), 1000),
                                  query=q.get("q", ""), sort=q.get("sort", "task"), descending=q.get("desc") == "1")
                return self._send(200, json.dumps(data).encode(), "application/json")
            if url.path.startswith("/api/episode/"):
                ep = index.episode(url.path.rsplit("/", 1)[-1])
                if ep is None:
                    return self._send(404, b'{"error": "no such episode"}', "application/json")
                return self._send(200, json.dumps(ep, default=str).encode(), "application/json")
            return self._send(404, b"not found", "text/plain")

        def log_message(self, *args) -> None:  # quiet
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve(paths: list[Path], port: int = 0, background: bool = False) -> ThreadingHTTPServer:
    server = make_server(EpisodeIndex(paths), port)
    if background:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def export_static(paths: list[Path], out: Path) -> Path:
    """index.html plus data/*.js (script tags, so the pages open from disk without a server)."""
    index = EpisodeIndex(paths)
    (out / "data").mkdir(parents=True, exist_ok=True)
    episodes = index.page(limit=len(index.rows) or 1)["rows"]
    html = PAGE.read_text().replace("<script>\nconst STATIC",
                                    '<script src="data/episodes.js"></script>\n<script>\nconst STATIC', 1)
    (out / "index.html").write_text(html)
    (out / "data" / "episodes.js").write_text("window.COMMBENCH_STATIC = " + json.dumps({"episodes": episodes}) + ";\n")
    for row in episodes:
        ep = index.episode(row["id"])
        (out / "data" / f"ep-{row['id']}.js").write_text("window.COMMBENCH_EPISODE = " + json.dumps(ep, default=str) + ";\n")
    return out / "index.html"
