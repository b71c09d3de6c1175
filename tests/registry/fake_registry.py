#!/usr/bin/env python3
"""A small hostile-capable OCI distribution registry for tests/integration/registry_test.cc.

Serves the pull side of the distribution API (GET /v2/, /v2/<name>/manifests/<ref>,
/v2/<name>/blobs/<digest>) from an OCI image layout directory on 127.0.0.1 only, and misbehaves
on request to exercise the client's defences. It binds port 0 and writes the port to --port-file
(atomically) once it listens. Every request is appended to --log as one JSON line (path, Range,
Authorization present/scheme) so a test can see what the client asked.

Modes (any combination):
  --tamper DIGEST       serve blob DIGEST with its last byte flipped
  --long DIGEST         serve blob DIGEST with 10 bytes more than it has
  --drop-once DIGEST    the first GET of blob DIGEST sends half of it and drops the connection
  --stall DIGEST        every GET of blob DIGEST sends half of it, then nothing more until the
                        client goes away (at most 120 s): a pull that stays mid-way
  --big-manifest        every manifest is a 5 MiB JSON document
  --redirect            blobs answer 307 to /storage/<digest> on this server
  --redirect-to URL     blobs answer 307 to URL
  --basic USER:PASS     every /v2 request needs this basic auth
  --bearer USER:PASS    every /v2 request needs a bearer token from /token (basic USER:PASS)
  --bearer-anonymous    like --bearer, but /token gives tokens without credentials
"""
import argparse
import base64
import hashlib
import http.server
import json
import os
import secrets
import socketserver
import sys
import threading
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("--layout", required=True)
ap.add_argument("--port-file", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--tamper", default="")
ap.add_argument("--long", default="")
ap.add_argument("--drop-once", default="")
ap.add_argument("--stall", default="")
ap.add_argument("--big-manifest", action="store_true")
ap.add_argument("--redirect", action="store_true")
ap.add_argument("--redirect-to", default="")
ap.add_argument("--basic", default="")
ap.add_argument("--bearer", default="")
ap.add_argument("--bearer-anonymous", action="store_true")
args = ap.parse_args()

lock = threading.Lock()
dropped = set()
tokens = set()


def blob(digest):
    if not digest.startswith("sha256:") or len(digest) != 71:
        return None
    p = os.path.join(args.layout, "blobs", "sha256", digest[7:])
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError:
        return None


def index():
    with open(os.path.join(args.layout, "index.json")) as f:
        return json.load(f)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        pass

    def record(self):
        auth = self.headers.get("Authorization", "")
        with lock, open(args.log, "a") as f:
            f.write(json.dumps({"path": self.path, "range": self.headers.get("Range", ""),
                                "auth": auth.split(" ")[0] if auth else ""}) + "\n")

    def send(self, code, body=b"", headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        auth = self.headers.get("Authorization", "")
        if args.basic:
            if auth == "Basic " + base64.b64encode(args.basic.encode()).decode():
                return True
            self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                      {"WWW-Authenticate": 'Basic realm="fake"'})
            return False
        if args.bearer or args.bearer_anonymous:
            if auth.startswith("Bearer ") and auth[7:] in tokens:
                return True
            host = self.headers.get("Host")
            self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {
                "WWW-Authenticate": 'Bearer realm="http://%s/token",service="fake-registry"' % host})
            return False
        return True

    def do_GET(self):
        self.record()
        url = urllib.parse.urlparse(self.path)
        if url.path == "/token":
            q = urllib.parse.parse_qs(url.query)
            ok = args.bearer_anonymous or self.headers.get("Authorization", "") == \
                "Basic " + base64.b64encode(args.bearer.encode()).decode()
            if not ok or q.get("service") != ["fake-registry"] or not q.get("scope"):
                return self.send(401, b"{}")
            t = secrets.token_hex(16)
            tokens.add(t)
            return self.send(200, json.dumps({"token": t}).encode(),
                             {"Content-Type": "application/json"})
        if url.path.startswith("/storage/"):
            return self.serve_blob(url.path[len("/storage/"):])
        if not url.path.startswith("/v2/"):
            return self.send(404)
        if not self.authorized():
            return
        if url.path == "/v2/":
            return self.send(200, b"{}")
        parts = url.path[4:].rsplit("/", 2)
        if len(parts) != 3:
            return self.send(404)
        _, kind, ref = parts
        if kind == "manifests":
            if args.big_manifest:
                body = json.dumps({"schemaVersion": 2, "pad": "x" * (5 << 20)}).encode()
                return self.send(200, body,
                                 {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
            digest = ref
            if not ref.startswith("sha256:"):
                found = [m for m in index()["manifests"]
                         if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref]
                if not found:
                    return self.send(404)
                digest = found[0]["digest"]
                mt = found[0]["mediaType"]
            data = blob(digest)
            if data is None:
                return self.send(404)
            mt = json.loads(data).get("mediaType", "application/vnd.oci.image.manifest.v1+json")
            return self.send(200, data, {"Content-Type": mt, "Docker-Content-Digest": digest})
        if kind == "blobs":
            if args.redirect_to:
                return self.send(307, b"", {"Location": args.redirect_to})
            if args.redirect:
                return self.send(307, b"", {"Location": "/storage/" + ref})
            return self.serve_blob(ref)
        return self.send(404)

    def serve_blob(self, digest):
        data = blob(digest)
        if data is None:
            return self.send(404)
        if digest == args.tamper:
            data = data[:-1] + bytes([data[-1] ^ 1])
        if digest == args.long:
            data = data + b"0123456789"
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.send(416)
        with lock:
            drop = digest == args.drop_once and digest not in dropped
            dropped.add(digest)
        part = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if digest == args.stall:
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            self.connection.settimeout(120)
            try:
                while self.connection.recv(4096):
                    pass
            except OSError:
                pass
            self.close_connection = True
            return
        if drop:
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(part)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(("127.0.0.1", 0), Handler)
tmp = args.port_file + ".tmp"
with open(tmp, "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(tmp, args.port_file)
srv.serve_forever()
