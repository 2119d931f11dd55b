"""A local server that speaks the Hugging Face Hub's HTTP protocol, for HF_ENDPOINT.

What huggingface_hub's snapshot_download asks (read from its source): `GET /api/models/{repo}/
revision/{rev}` (the commit a branch or tag names), `GET /api/models/{repo}/tree/{commit}` (the
files), then `HEAD` and `GET /{repo}/resolve/{commit}/{path}`: small files answer with their git
blob id as ETag; large (LFS) files redirect to a storage host on another origin with
`X-Linked-Etag` (their sha256) and `X-Linked-Size`, as the Hub does, and the storage host honours
`Range` so an interrupted download can resume. Every answer carries `X-Repo-Commit`, and errors
carry the Hub's `X-Error-Code`. Every request is recorded with its headers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".msgpack", ".h5", ".ot")


@dataclass(frozen=True)
class Seen:
    server: str  # "hub" or "storage"
    method: str
    path: str
    headers: dict[str, str]


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files


class FakeHub:
    """`with FakeHub().serving() as hub:` answers at `hub.endpoint` (HF_ENDPOINT)."""

    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        #: When set, every request to the Hub must carry `Authorization: Bearer <token>`.
        self.token = token
        self.seen: list[Seen] = []
        #: sha256 of a blob -> bytes the storage host sends before it drops the connection.
        self.cut_at: dict[str, int] = {}
        self._lock = threading.Lock()
        self.endpoint = ""
        self.storage = ""

    def add_commit(self, repo_id: str, folder: Path, refs: tuple[str, ...] = ("main",)) -> str:
        """Publish every file under `folder` as one commit of `repo_id`; return its hash."""
        files = {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        repo = self.repos.setdefault(repo_id, Repo())
        commit = hashlib.sha1(
            repr(sorted((k, sha256(v)) for k, v in files.items())).encode() + repo_id.encode()
        ).hexdigest()
        repo.commits[commit] = files
        for ref in refs:
            repo.refs[ref] = commit
        return commit

    def blob(self, digest: str) -> bytes:
        for repo in self.repos.values():
            for files in repo.commits.values():
                for data in files.values():
                    if sha256(data) == digest:
                        return data
        raise KeyError(digest)

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def downloads(self) -> list[str]:
        """Paths of the repository files whose contents were asked for: GET on resolve for
        small files, GET on the storage host for large ones."""
        names = {
            sha256(data): name
            for repo in self.repos.values()
            for files in repo.commits.values()
            for name, data in files.items()
        }
        out = []
        for s in self.seen:
            path = urlsplit(s.path).path
            m = re.match(r"^/[^/]+/[^/]+/resolve/[^/]+/(.+)$", path)
            if s.server == "hub" and s.method == "GET" and m:
                out.append(unquote(m.group(1)))
            elif s.server == "storage" and s.method == "GET":
                out.append(names.get(path.rsplit("/", 1)[-1], path))
        return out

    def storage_gets(self) -> list[Seen]:
        return [s for s in self.seen if s.server == "storage" and s.method == "GET"]

    @contextmanager
    def serving(self) -> Iterator[FakeHub]:
        hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        storage = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "storage"))
        self.endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
        self.storage = f"http://127.0.0.1:{storage.server_address[1]}"
        threads = [
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            for s in (hub, storage)
        ]
        for t in threads:
            t.start()
        try:
            yield self
        finally:
            for s in (hub, storage):
                s.shutdown()
                s.server_close()


def _handler(hub: FakeHub, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            hub.record(Seen(role, self.command, self.path, dict(self.headers.items())))
            if role == "storage":
                self._storage(body)
                return
            if hub.token is not None and self.headers.get("authorization") != f"Bearer {hub.token}":
                # The Hub answers 401 for a private repository asked without the right token.
                self._send(401, {"X-Error-Code": "RepoNotFound"}, b'{"error":"unauthorized"}', body)
                return
            path = urlsplit(self.path).path
            api = re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?$", path)
            resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            match = api or resolve
            if match is None:
                self._send(404, {}, b'{"error":"no such route"}', body)
                return
            repo_id = match.group(1)
            repo = hub.repos.get(repo_id)
            if repo is None:
                message = b'{"error":"Repository not found"}'
                self._send(404, {"X-Error-Code": "RepoNotFound"}, message, body)
                return
            rev = unquote(match.group(3) if api else match.group(2))
            commit = repo.refs.get(rev, rev if rev in repo.commits else None)
            if commit is None:
                message = b'{"error":"Invalid rev id"}'
                self._send(404, {"X-Error-Code": "RevisionNotFound"}, message, body)
                return
            files = repo.commits[commit]
            if api and api.group(2) == "revision":
                info = {
                    "id": repo_id,
                    "sha": commit,
                    "siblings": [{"rfilename": name} for name in files],
                }
                self._json(info, commit, body)
            elif api:
                self._json([_tree_entry(name, data) for name, data in files.items()], commit, body)
            else:
                self._resolve(files, commit, unquote(match.group(3)), body)

        def _resolve(self, files: dict[str, bytes], commit: str, name: str, body: bool) -> None:
            data = files.get(name)
            headers = {"X-Repo-Commit": commit}
            if data is None:
                headers["X-Error-Code"] = "EntryNotFound"
                self._send(404, headers, b'{"error":"Entry not found"}', body)
            elif name.endswith(LFS_SUFFIXES):
                digest = sha256(data)
                headers |= {
                    "ETag": f'"{git_blob_id(data)}"',
                    "X-Linked-Etag": f'"{digest}"',
                    "X-Linked-Size": str(len(data)),
                    "Location": f"{hub.storage}/blobs/{digest}?repo={commit}",
                }
                self._send(302, headers, b"", body)
            else:
                headers["ETag"] = f'"{git_blob_id(data)}"'
                self._send(200, headers, data, body)

        def _storage(self, body: bool) -> None:
            digest = urlsplit(self.path).path.rsplit("/", 1)[-1]
            try:
                data = hub.blob(digest)
            except KeyError:
                self._send(404, {}, b"NoSuchKey", body)
                return
            start, status = 0, 200
            ranged = re.match(r"^bytes=(\d+)-$", self.headers.get("range", ""))
            if ranged:
                start, status = int(ranged.group(1)), 206
            part = data[start:]
            headers = {"ETag": f'"{digest}"', "Accept-Ranges": "bytes"}
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            cut = hub.cut_at.get(digest)
            if cut is None or not body:
                self._send(status, headers, part, body)
                return
            # Promise the whole part, send what lies before the cut, then drop the connection.
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            self.wfile.write(data[start:cut] if start < cut else b"")
            self.wfile.flush()
            self.close_connection = True

        def _json(self, value: object, commit: str, body: bool) -> None:
            headers = {"Content-Type": "application/json", "X-Repo-Commit": commit}
            self._send(200, headers, json.dumps(value).encode(), body)

        def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


def _tree_entry(name: str, data: bytes) -> dict[str, object]:
    entry: dict[str, object] = {
        "type": "file",
        "path": name,
        "size": len(data),
        "oid": git_blob_id(data),
    }
    if name.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": sha256(data), "size": len(data), "pointerSize": 134}
    return entry
