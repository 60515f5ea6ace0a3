"""A loopback HTTP server that answers as the Hugging Face hub does for huggingface_hub's file API
(no network): GET /api/models/USER/REPO[/revision/REV] (the file list), HEAD and GET
/USER/REPO/resolve/REV/FILE (X-Repo-Commit, ETag, Content-Length, Range requests). `drop_once`
cuts a file's first GET after that many bytes (a dropped connection), and `requests` records
every request, so tests can tell a cache hit from a download.

    with FakeHub({"u/r": {"m-Q4_K_M.gguf": b"..."}}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp)}
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], drop_once: dict[str, int] | None = None):
        self.repos = repos
        self.drop_once = dict(drop_once or {})
        self.requests: list[tuple[str, str, str | None]] = []      # (method, path, Range)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _missing(self, code_name, head=False):
                self._send(404, json.dumps({"error": code_name}).encode(),
                           {"X-Error-Code": code_name, "Content-Type": "application/json"}, head)

            def _handle(self, head: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                path = self.path.split("?", 1)[0]
                m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
                if m:
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self._missing("RepoNotFound", head)
                    body = json.dumps({"id": m.group(1), "modelId": m.group(1),
                                       "sha": hub.sha(m.group(1)), "private": False,
                                       "siblings": [{"rfilename": f} for f in files]}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
                if m:
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self._missing("RepoNotFound", head)
                    body = json.dumps([{"type": "file", "path": f, "size": len(b),
                                        "oid": hashlib.sha1(b).hexdigest()}
                                       for f, b in files.items()]).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self._missing("RepoNotFound", head)
                    data = files.get(m.group(3))
                    if data is None:
                        return self._missing("EntryNotFound", head)
                    hdr = {"X-Repo-Commit": hub.sha(m.group(1)),
                           "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                    start = 0
                    rng = self.headers.get("Range")
                    if rng and not head:
                        start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    part = data[start:]
                    if head:
                        return self._send(200, b"", {**hdr, "Content-Length": str(len(data))},
                                          True)
                    code = 206 if start else 200
                    if start:
                        hdr["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    cut = hub.drop_once.pop(m.group(3), None)
                    self.send_response(code)
                    for k, v in {**hdr, "Content-Length": str(len(part))}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if cut is not None:
                        self.wfile.write(part[:cut])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(part)
                    return
                self._missing("NotFound", head)

            def do_GET(self):
                self._handle(False)

            def do_HEAD(self):
                self._handle(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def sha(self, repo: str) -> str:
        h = hashlib.sha1(repo.encode())
        for f, b in sorted(self.repos[repo].items()):
            h.update(f.encode() + hashlib.sha1(b).digest())
        return h.hexdigest()

    def downloads(self, name: str) -> int:
        """GETs of a file's bytes."""
        return sum(1 for m, p, _ in self.requests if m == "GET" and p.endswith("/" + name))

    def __enter__(self) -> "FakeHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
