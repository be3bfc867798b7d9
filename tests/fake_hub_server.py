"""A local Hugging Face hub for tests: the endpoints ``huggingface_hub`` calls to create a model repository and
upload a folder, on 127.0.0.1 (ephemeral port), served by a ThreadingHTTPServer in a background thread. Point the
client at it with ``HfApi(endpoint=hub.url)`` or ``HF_ENDPOINT=hub.url`` (read when huggingface_hub is imported).

Endpoints (as the hub answers them, for the parts the client reads):
- ``POST /api/repos/create``: 200 ``{"url"}``, 409 when the repository exists; ``visibility`` kept.
- ``GET /api/whoami-v2``: the token's user, with its role (``read`` for ``read_only_tokens``, else ``write``).
- ``GET /api/models/ORG/NAME``: ``{"id", "private", "sha"}`` (``repo_info``); 404 when unknown.
- ``POST /api/models/ORG/NAME/branch/BRANCH``: a branch from main (409 when it exists).
- ``POST /api/validate-yaml``: parses a README's front matter with PyYAML (400 with ``errors`` when it is not a
  mapping, ``model-index`` is malformed, ``license`` is not one of the hub's identifiers (``other`` needs a
  ``license_name``), or ``base_model`` is not a repository id (a local path), as the hub checks it); a commit whose
  README.md fails these checks is refused the same way (400).
- ``POST /api/models/ORG/NAME/preupload/REV``: ``regular`` for text files, ``lfs`` for binary ones (a NUL byte in
  the sample) or files over 10 MB, as the hub decides.
- ``POST /ORG/NAME.git/info/lfs/objects/batch``: the git-LFS batch API, ``basic`` transfer: an upload URL and a
  verify URL on this server per object (no ``actions`` when the object is stored already).
- ``PUT /lfs-upload/OID``: stores the bytes (their sha256 must be the OID); ``POST /lfs-verify``: checks size.
- ``POST /api/models/ORG/NAME/commit/REV``: the ndjson commit (``header``, ``file`` base64, ``lfsFile`` by OID);
  the branch's files become the previous ones plus these.

The client's Xet upload path is not served (its CAS protocol is a service of its own): tests set
``huggingface_hub.constants.HF_HUB_DISABLE_XET`` (or ``HF_HUB_DISABLE_XET=1``), and the LFS files take the classic
git-LFS path, which the hub still accepts.

Every request but ``validate-yaml`` (answered without a token too) needs ``Authorization: Bearer <token>`` with the
server's token (401 otherwise), and a token in ``read_only_tokens`` gets 403 on writes. ``repos[repo_id]`` =
``{"private", "branches": {name: {path: bytes}}}``; ``log`` lists ``(method, path)``.

``StalledServer`` is an endpoint that never answers in full (silent, trickling, or never accepting), for the
timeouts and deadlines of every network call (the hub's, the LLM client's).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def front_matter_errors(content: str) -> list[str]:
    """What the hub says is wrong with a README's front matter ([] when it accepts it)."""
    import yaml

    m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.S)
    if not m:
        return []
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        return [f"invalid YAML: {e}"]
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return ["metadata must be a mapping"]
    errors = []
    for key in ("tags", "datasets"):
        if key in meta and not (isinstance(meta[key], list) and all(isinstance(x, str) for x in meta[key])):
            errors.append(f"'{key}' must be a list of strings")
    lic = meta.get("license")
    if lic is not None:
        from jaxembed.base_model import HUB_LICENSES  # the hub's list (docs/hub/repositories-licenses)

        if lic not in HUB_LICENSES:
            errors.append(f"'license' must be one of the hub's license identifiers, got {lic!r}")
        elif lic == "other" and not meta.get("license_name"):
            errors.append("'license: other' needs a 'license_name'")
    if "base_model" in meta:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        for b in meta["base_model"] if isinstance(meta["base_model"], list) else [meta["base_model"]]:
            try:
                if not isinstance(b, str) or "/" not in b:
                    raise HFValidationError("not ORG/NAME")
                validate_repo_id(b)
            except HFValidationError:
                errors.append(f"'base_model' {b!r} is not a model id of the hub")
    if "model-index" in meta:
        from huggingface_hub.repocard_data import model_index_to_eval_results

        try:
            model_index_to_eval_results(meta["model-index"])
        except Exception as e:  # noqa: BLE001 -- the hub answers 400 for any malformed model-index
            errors.append(f"model-index: {type(e).__name__}: {e}")
    return errors


class FakeHub:
    """Start with ``start()`` (returns the base URL), stop with ``stop()``; also a context manager."""

    def __init__(self, token: str = "hf_test_token", read_only_tokens: tuple[str, ...] = ()):
        self.token = token
        self.read_only_tokens = set(read_only_tokens)
        self.repos: dict[str, dict] = {}
        self.lfs: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []
        self.commits: list[dict] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # ---- the state tests read
    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        with self._lock:
            return dict(self.repos[repo_id]["branches"][branch])

    def calls(self, fragment: str) -> int:
        with self._lock:
            return sum(1 for _, p in self.log if fragment in p)

    # ---- life
    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                hub._handle(self, "GET")

            def do_POST(self):
                hub._handle(self, "POST")

            def do_PUT(self):
                hub._handle(self, "PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ---- requests
    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = urlparse(h.path).path
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        with self._lock:
            self.log.append((method, path))
        auth = h.headers.get("Authorization", "")
        given = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if path.startswith("/lfs-upload/") or path == "/lfs-verify":
            given = self.token  # presigned storage URLs: no hub token (the real ones are signed S3 URLs)
        if path == "/api/validate-yaml" and given is None:
            given = self.token  # the hub validates a card without a token (huggingface_hub's ModelCard.validate)
        if given != self.token and given not in self.read_only_tokens:
            return self._send(h, 401, {"error": "Invalid credentials in Authorization header"})
        if path == "/api/whoami-v2" and given in self.read_only_tokens:
            return self._send(h, 200, {"type": "user", "name": "tester", "orgs": [],
                                       "auth": {"accessToken": {"role": "read"}}})
        write = method != "GET" and path != "/api/validate-yaml"
        if write and given in self.read_only_tokens:
            return self._send(h, 403, {"error": "You don't have the rights to create a model under this namespace"})
        try:
            status, payload = self._route(method, path, body)
        except Exception as e:  # noqa: BLE001 -- a bug of this fake shows as a 500 the test sees
            status, payload = 500, {"error": f"fake hub: {type(e).__name__}: {e}"}
        self._send(h, status, payload)

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        js = lambda: json.loads(body or b"{}")  # noqa: E731
        if method == "POST" and path == "/api/repos/create":
            d = js()
            repo_id = f"{d['organization']}/{d['name']}" if d.get("organization") else d["name"]
            with self._lock:
                if repo_id in self.repos:
                    return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
                self.repos[repo_id] = {"private": d.get("visibility") == "private", "type": d.get("type", "model"),
                                       "branches": {"main": {}}, "sha": "0" * 40}
            return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}
        if method == "GET" and path == "/api/whoami-v2":
            return 200, {"type": "user", "name": "tester", "orgs": [], "auth": {"accessToken": {"role": "write"}}}
        if method == "POST" and path == "/api/validate-yaml":
            errors = front_matter_errors(js().get("content", ""))
            return (400, {"errors": [{"message": e} for e in errors]}) if errors else (200, {"warnings": []})
        m = re.match(r"^/api/models/([^/]+/[^/]+)(/.*)?$", path)
        if m:
            repo_id, rest = m.group(1), m.group(2) or ""
            with self._lock:
                repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}
            if method == "GET" and rest == "":
                return 200, {"id": repo_id, "private": repo["private"], "sha": repo["sha"]}
            b = re.match(r"^/branch/(.+)$", rest)
            if method == "POST" and b:
                name = unquote(b.group(1))
                with self._lock:
                    if name in repo["branches"]:
                        return 409, {"error": "Reference already exists"}
                    repo["branches"][name] = dict(repo["branches"]["main"])
                return 200, {}
            p = re.match(r"^/preupload/(.+)$", rest)
            if method == "POST" and p:
                files = []
                for f in js()["files"]:
                    sample = base64.b64decode(f["sample"])
                    lfs = b"\0" in sample or f["size"] > 10_000_000
                    files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                                  "shouldIgnore": False, "oid": None})
                return 200, {"files": files}
            c = re.match(r"^/commit/(.+)$", rest)
            if method == "POST" and c:
                return self._commit(repo_id, repo, unquote(c.group(1)), body)
            return 404, {"error": f"fake hub: no route {method} {path}"}
        m = re.match(r"^/([^/]+/[^/]+)\.git/info/lfs/objects/batch$", path)
        if method == "POST" and m:
            objects = []
            for o in js()["objects"]:
                entry = {"oid": o["oid"], "size": o["size"]}
                with self._lock:
                    stored = o["oid"] in self.lfs
                if not stored:
                    entry["actions"] = {"upload": {"href": f"{self.url}/lfs-upload/{o['oid']}"},
                                        "verify": {"href": f"{self.url}/lfs-verify"}}
                objects.append(entry)
            return 200, {"transfer": "basic", "objects": objects}
        m = re.match(r"^/lfs-upload/([0-9a-f]{64})$", path)
        if method == "PUT" and m:
            if hashlib.sha256(body).hexdigest() != m.group(1):
                return 400, {"error": "sha256 mismatch"}
            with self._lock:
                self.lfs[m.group(1)] = body
            return 200, {}
        if method == "POST" and path == "/lfs-verify":
            d = js()
            with self._lock:
                ok = len(self.lfs.get(d["oid"], b"")) == d["size"] and d["oid"] in self.lfs
            return (200, {}) if ok else (404, {"error": "object not found"})
        return 404, {"error": f"fake hub: no route {method} {path}"}

    def _commit(self, repo_id: str, repo: dict, branch: str, body: bytes) -> tuple[int, dict]:
        if branch not in repo["branches"]:
            return 404, {"error": f"Invalid rev id: {branch}"}
        header, files = None, {}
        for line in body.decode().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, v = item["key"], item["value"]
            if key == "header":
                header = v
            elif key == "file":
                files[v["path"]] = base64.b64decode(v["content"])
            elif key == "lfsFile":
                with self._lock:
                    data = self.lfs.get(v["oid"])
                if data is None or len(data) != v["size"]:
                    return 400, {"error": f"LFS object {v['oid']} of {v['path']} was not uploaded"}
                files[v["path"]] = data
            else:
                return 400, {"error": f"fake hub: unsupported commit operation {key}"}
        if header is None or not header.get("summary"):
            return 400, {"error": "commit header with a summary is required"}
        errors = front_matter_errors(files["README.md"].decode("utf-8")) if "README.md" in files else []
        if errors:
            return 400, {"error": "Invalid metadata in README.md.\n" + "\n".join(f"- {e}" for e in errors)}
        sha = hashlib.sha1(body).hexdigest()
        with self._lock:
            repo["branches"][branch].update(files)
            repo["sha"] = sha
            self.commits.append({"repo": repo_id, "branch": branch, "summary": header["summary"],
                                 "paths": sorted(files)})
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None}

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        if status >= 400 and "error" in payload:
            h.send_header("X-Error-Message", payload["error"])
        h.end_headers()
        h.wfile.write(data)


class StalledServer:
    """An endpoint that never answers in full (a stuck proxy or firewall), on 127.0.0.1 (ephemeral port); ``url`` is
    its base URL, ``accepted`` counts the connections it took. ``mode``:
    - ``silent``: accepts every connection and holds it open, unread, never answering;
    - ``trickle``: answers ``200`` with a body of a million bytes, sent one space every 50 ms (never ends);
    - ``no_accept``: never accepts: its listen queue is kept full, so a new connection is never established.
    Held until ``stop()``; also a context manager."""

    HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"

    def __init__(self, mode: str = "silent"):
        import socket

        assert mode in ("silent", "trickle", "no_accept"), mode
        self.mode = mode
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0 if mode == "no_accept" else 64)
        self._sock.settimeout(0.05)
        self._held: list = []
        self._stop = threading.Event()
        self.accepted = 0
        port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)] if mode != "no_accept" else []
        for _ in range(4 if mode == "no_accept" else 0):  # fill the queue: later connections are never established
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            self._held.append(c)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the 0.05 s poll, or the socket closed by stop()
                continue
            self._held.append(conn)
            self.accepted += 1
            if self.mode == "trickle":
                t = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
                self._threads.append(t)
                t.start()

    def _trickle(self, conn) -> None:
        try:
            conn.sendall(self.HEADERS)
            while not self._stop.wait(0.05):
                conn.sendall(b" ")
        except OSError:  # the client gave up
            pass

    def start(self) -> str:
        for t in self._threads[:1]:
            t.start()
        return self.url

    def stop(self) -> None:
        self._stop.set()
        for t in list(self._threads):
            if t.is_alive():
                t.join(timeout=2)
        for conn in self._held:
            conn.close()
        self._sock.close()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
