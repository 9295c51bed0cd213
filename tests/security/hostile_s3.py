"""A small S3 endpoint that plays the attacker where no real server will (SeaweedFS refuses ``..``
keys and never changes an object between two ranged GETs of one download).

It speaks enough of the S3 REST API, path-style, for s5cmd and botocore: ListObjectsV2, HEAD/GET
(with ranges), PUT, multipart uploads (create, part, complete, abort, list), DeleteObjects,
GetBucketLocation. Signatures are not checked. What makes it hostile is set per test:

- ``put(key, body)`` takes any key: ``..`` segments, absolute paths, control characters;
- ``swap_after_first_get(key, body, restore=...)`` serves the first ranged GET of ``key`` from
  one version and every later one from another (a new ETag, the same size), optionally putting
  the first version back once the download is over (the ETag at the end equals the listing's);
- ``reject_checksums = True`` answers 400 to any request carrying ``x-amz-checksum-*`` (or a
  trailer or algorithm header announcing one), as R2 and older S3-compatible stores did, and
  enforces R2's rule that every part but the last has the same size;
- ``delete_errors[key] = (code, message)`` makes DeleteObjects report that key in ``Errors``;
- ``hold_gets()`` answers HEADs but holds every GET until ``release()``: a download stuck
  mid-flight, after s5cmd created its temporary file (a stalled real server stalls the HEAD too);
  ``hold_parts()`` does the same to UploadPart, after CreateMultipartUpload was answered.

Every request is logged in ``requests`` (method, path, query, lower-cased headers).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import secrets
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from xml.sax.saxutils import escape

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def md5_etag(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


def multipart_etag(parts: list[bytes]) -> str:
    """The ETag S3 gives a multipart upload: MD5 of the parts' MD5s, then ``-N``."""
    joined = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    return f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(parts)}"


def _xml_text(s: str) -> str:
    # XML 1.0 cannot carry most control characters raw; character references carry them
    # (Go's and Python's parsers both accept &#10; and friends in element text).
    return "".join(f"&#{ord(c)};" if ord(c) < 0x20 else c for c in escape(s))


@dataclass
class StoredObject:
    body: bytes
    etag: str
    mtime: float = field(default_factory=time.time)
    storage_class: str = "STANDARD"
    #: Served instead of ``body`` from the second GET on (a swap between ranged GETs).
    swap_to: tuple[bytes, str] | None = None
    restore_after: int | None = None
    gets: int = 0


@dataclass
class Upload:
    bucket: str
    key: str
    initiated: float
    parts: dict[int, bytes] = field(default_factory=dict)


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client that hangs up mid-body (the torn-GET tests do, on purpose) is not an error here."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class HostileS3:
    """The responder's state and its HTTP server on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], StoredObject] = {}
        self.uploads: dict[str, Upload] = {}
        self.buckets: set[str] = set()
        self.reject_checksums = False
        self.delete_errors: dict[str, tuple[str, str]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], dict[str, str]]] = []
        self.rejected: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.gets_released = threading.Event()
        self.gets_released.set()
        self.parts_released = threading.Event()
        self.parts_released.set()
        self.held = 0
        self.held_parts = 0
        self.server: http.server.ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # -- test API -----------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def bucket(self, name: str) -> str:
        self.buckets.add(name)
        return name

    def put(self, bucket: str, key: str, body: bytes, *, etag: str | None = None) -> StoredObject:
        """Store ``body`` at ``key`` (any key at all), with its MD5 ETag unless given one."""
        self.buckets.add(bucket)
        obj = StoredObject(body, etag or md5_etag(body))
        with self.lock:
            self.objects[(bucket, key)] = obj
        return obj

    def swap_after_first_get(
        self, bucket: str, key: str, body: bytes, *, etag: str | None = None, restore_after: int | None = None
    ) -> None:
        """From the second GET of ``key`` on, serve ``body`` (and its ETag); with ``restore_after``
        = N, the first version (and ETag) is back once N GETs were served."""
        with self.lock:
            obj = self.objects[(bucket, key)]
            assert len(body) == len(obj.body), "the swap keeps the size: only the ETag tells"
            obj.swap_to = (body, etag or md5_etag(body))
            obj.restore_after = restore_after

    def hold_gets(self) -> None:
        """Hold every GET (HEADs and listings still answer) until :meth:`release`."""
        self.gets_released.clear()

    def hold_parts(self) -> None:
        """Hold every UploadPart (creating, completing and aborting still answer) until :meth:`release`."""
        self.parts_released.clear()

    def release(self) -> None:
        self.gets_released.set()
        self.parts_released.set()

    def start(self) -> HostileS3:
        state = self

        class Handler(_Handler):
            s3 = state

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="hostile-s3", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # -- views ----------------------------------------------------------------------------------

    def current(self, obj: StoredObject) -> tuple[bytes, str]:
        """What a HEAD, a listing or the next GET sees of ``obj`` now."""
        if obj.swap_to is not None and obj.gets >= 1 and (obj.restore_after is None or obj.gets < obj.restore_after):
            return obj.swap_to
        return obj.body, obj.etag


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    s3: HostileS3

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    # -- plumbing ----------------------------------------------------------------------------------

    def _parse(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        bucket, _, key = path.lstrip("/").partition("/")
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        return bucket, key, query

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, *, head: bool = False
    ) -> None:
        self.send_response(status)
        hdrs = {"Content-Length": str(len(body)), "x-amz-request-id": secrets.token_hex(8), **(headers or {})}
        if body and "Content-Type" not in hdrs:
            hdrs["Content-Type"] = "application/xml"
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if body and not head and self.command != "HEAD":
            self.wfile.write(body)

    def _xml(self, status: int, text: str) -> None:
        self._send(status, ('<?xml version="1.0" encoding="UTF-8"?>\n' + text).encode())

    def _error(self, status: int, code: str, message: str) -> None:
        self._xml(
            status,
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<RequestId>{secrets.token_hex(8)}</RequestId></Error>",
        )

    def _checksum_headers(self) -> list[str]:
        out = [
            k
            for k in self.headers
            if k.lower().startswith("x-amz-checksum-") or k.lower() == "x-amz-sdk-checksum-algorithm"
        ]
        if "checksum" in (self.headers.get("x-amz-trailer") or "").lower():
            out.append("x-amz-trailer")
        return out

    def _dispatch(self) -> None:
        bucket, key, query = self._parse()
        with self.s3.lock:
            self.s3.requests.append((self.command, self.path, query, {k.lower(): v for k, v in self.headers.items()}))
        if self.s3.reject_checksums and (bad := self._checksum_headers()):
            self._body()
            self.s3.rejected.append((self.command, self.path))
            self._error(400, "InvalidRequest", f"unsupported checksum header(s): {', '.join(bad)}")
            return
        handler = getattr(self, f"_{self.command.lower()}_{'object' if key else 'bucket'}", None)
        if handler is None:
            self._error(405, "MethodNotAllowed", f"{self.command} not supported here")
            return
        handler(bucket, key, query)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _dispatch  # noqa: N815 - the stdlib's names

    # -- buckets ---------------------------------------------------------------------------------

    def _head_bucket(self, bucket: str, _key: str, _q: dict[str, list[str]]) -> None:
        self._send(200 if bucket in self.s3.buckets else 404, headers={"x-amz-bucket-region": "us-east-1"})

    def _get_bucket(self, bucket: str, _key: str, q: dict[str, list[str]]) -> None:
        if bucket not in self.s3.buckets:
            self._error(404, "NoSuchBucket", "The specified bucket does not exist")
        elif "location" in q:
            self._xml(200, f'<LocationConstraint xmlns="{NS}"></LocationConstraint>')
        elif "uploads" in q:
            self._list_uploads(bucket, q)
        else:
            self._list_objects(bucket, q)

    def _list_objects(self, bucket: str, q: dict[str, list[str]]) -> None:
        prefix = q.get("prefix", [""])[0]
        delimiter = q.get("delimiter", [""])[0]
        max_keys = int(q.get("max-keys", ["1000"])[0])
        token = q.get("continuation-token", [""])[0]
        after = base64.urlsafe_b64decode(token).decode() if token else q.get("start-after", [""])[0]
        with self.s3.lock:
            keys = sorted((k, o) for (b, k), o in self.s3.objects.items() if b == bucket and k.startswith(prefix))
            views = {k: self.s3.current(o) for k, o in keys}
        contents: list[str] = []
        prefixes: list[str] = []
        last = ""
        truncated = False
        for k, o in keys:
            if after and k <= after:
                continue
            if delimiter and delimiter in k[len(prefix) :]:
                cp = k[: len(prefix) + k[len(prefix) :].index(delimiter) + len(delimiter)]
                if cp not in prefixes:
                    prefixes.append(cp)
                continue
            if len(contents) >= max_keys:
                truncated = True
                break
            body, etag = views[k]
            mtime = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(o.mtime))
            contents.append(
                f"<Contents><Key>{_xml_text(k)}</Key><LastModified>{mtime}</LastModified>"
                f"<ETag>&quot;{etag}&quot;</ETag><Size>{len(body)}</Size>"
                f"<StorageClass>{o.storage_class}</StorageClass></Contents>"
            )
            last = k
        nxt = (
            f"<NextContinuationToken>{base64.urlsafe_b64encode(last.encode()).decode()}</NextContinuationToken>"
            if truncated
            else ""
        )
        cps = "".join(f"<CommonPrefixes><Prefix>{_xml_text(p)}</Prefix></CommonPrefixes>" for p in prefixes)
        self._xml(
            200,
            f'<ListBucketResult xmlns="{NS}"><Name>{bucket}</Name><Prefix>{_xml_text(prefix)}</Prefix>'
            f"<KeyCount>{len(contents)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{nxt}"
            f"{''.join(contents)}{cps}</ListBucketResult>",
        )

    def _list_uploads(self, bucket: str, q: dict[str, list[str]]) -> None:
        prefix = q.get("prefix", [""])[0]
        with self.s3.lock:
            ups = sorted(
                (u.key, uid, u.initiated)
                for uid, u in self.s3.uploads.items()
                if u.bucket == bucket and u.key.startswith(prefix)
            )
        items = "".join(
            f"<Upload><Key>{_xml_text(k)}</Key><UploadId>{uid}</UploadId>"
            f"<Initiated>{time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(t))}</Initiated></Upload>"
            for k, uid, t in ups
        )
        self._xml(
            200,
            f'<ListMultipartUploadsResult xmlns="{NS}"><Bucket>{bucket}</Bucket>'
            f"<Prefix>{_xml_text(prefix)}</Prefix><IsTruncated>false</IsTruncated>{items}"
            "</ListMultipartUploadsResult>",
        )

    def _post_bucket(self, bucket: str, _key: str, q: dict[str, list[str]]) -> None:
        body = self._body()
        if "delete" not in q:
            self._error(405, "MethodNotAllowed", "only ?delete is supported on a bucket")
            return
        md5 = self.headers.get("Content-MD5")
        if not md5 and not self._checksum_headers():
            self._error(400, "InvalidRequest", "Missing required header for this request: Content-MD5")
            return
        if md5 and base64.b64decode(md5) != hashlib.md5(body, usedforsecurity=False).digest():
            self._error(400, "BadDigest", "The Content-MD5 you specified did not match what we received.")
            return
        root = ET.fromstring(body)
        keys = [el.text or "" for el in root.iter() if el.tag.endswith("Key")]
        out = []
        for k in keys:
            if k in self.s3.delete_errors:
                code, msg = self.s3.delete_errors[k]
                out.append(
                    f"<Error><Key>{_xml_text(k)}</Key><Code>{code}</Code><Message>{escape(msg)}</Message></Error>"
                )
            else:
                with self.s3.lock:
                    self.s3.objects.pop((bucket, k), None)
                out.append(f"<Deleted><Key>{_xml_text(k)}</Key></Deleted>")
        self._xml(200, f'<DeleteResult xmlns="{NS}">{"".join(out)}</DeleteResult>')

    # -- objects ----------------------------------------------------------------------------------

    def _obj_headers(self, body: bytes, etag: str, obj: StoredObject) -> dict[str, str]:
        return {
            "ETag": f'"{etag}"',
            "Last-Modified": formatdate(obj.mtime, usegmt=True),
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "x-amz-storage-class": obj.storage_class,
        }

    def _head_object(self, bucket: str, key: str, _q: dict[str, list[str]]) -> None:
        with self.s3.lock:
            obj = self.s3.objects.get((bucket, key))
            view = self.s3.current(obj) if obj else None
        if obj is None or view is None:
            self._send(404)
            return
        body, etag = view
        hdrs = self._obj_headers(body, etag, obj)
        self.send_response(200)
        for k, v in {**hdrs, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()

    def _get_object(self, bucket: str, key: str, q: dict[str, list[str]]) -> None:
        if not self.s3.gets_released.is_set():
            with self.s3.lock:
                self.s3.held += 1
            self.s3.gets_released.wait(300)
        with self.s3.lock:
            obj = self.s3.objects.get((bucket, key))
            if obj is not None:
                body, etag = self.s3.current(obj)
                obj.gets += 1
        if obj is None:
            self._error(404, "NoSuchKey", "The specified key does not exist.")
            return
        hdrs = self._obj_headers(body, etag, obj)
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a)
            end = min(int(b) if b else len(body) - 1, len(body) - 1)
            if start >= len(body):
                self._error(416, "InvalidRange", "The requested range is not satisfiable")
                return
            hdrs["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            self._send(206, body[start : end + 1], hdrs)
        else:
            self._send(200, body, hdrs)

    def _put_object(self, bucket: str, key: str, q: dict[str, list[str]]) -> None:
        body = self._body()
        md5 = self.headers.get("Content-MD5")
        digest = hashlib.md5(body, usedforsecurity=False)
        if md5 and base64.b64decode(md5) != digest.digest():
            self._error(400, "BadDigest", "The Content-MD5 you specified did not match what we received.")
            return
        if "uploadId" in q:
            if not self.s3.parts_released.is_set():
                with self.s3.lock:
                    self.s3.held_parts += 1
                self.s3.parts_released.wait(300)
            with self.s3.lock:
                up = self.s3.uploads.get(q["uploadId"][0])
                if up is None:
                    self._error(404, "NoSuchUpload", "The specified upload does not exist.")
                    return
                up.parts[int(q["partNumber"][0])] = body
            self._send(200, headers={"ETag": f'"{digest.hexdigest()}"'})
            return
        self.s3.put(bucket, key, body)
        self._send(200, headers={"ETag": f'"{digest.hexdigest()}"'})

    def _post_object(self, bucket: str, key: str, q: dict[str, list[str]]) -> None:
        body = self._body()
        if "uploads" in q:
            uid = secrets.token_hex(12)
            with self.s3.lock:
                self.s3.uploads[uid] = Upload(bucket, key, time.time())
            self._xml(
                200,
                f'<InitiateMultipartUploadResult xmlns="{NS}"><Bucket>{bucket}</Bucket>'
                f"<Key>{_xml_text(key)}</Key><UploadId>{uid}</UploadId></InitiateMultipartUploadResult>",
            )
            return
        if "uploadId" not in q:
            self._error(405, "MethodNotAllowed", "POST on an object needs ?uploads or ?uploadId")
            return
        uid = q["uploadId"][0]
        with self.s3.lock:
            up = self.s3.uploads.get(uid)
        if up is None:
            self._error(404, "NoSuchUpload", "The specified upload does not exist.")
            return
        root = ET.fromstring(body)
        wanted = []
        for part in root.iter():
            if part.tag.endswith("Part"):
                num = etag = None
                for child in part:
                    if child.tag.endswith("PartNumber"):
                        num = int(child.text or 0)
                    elif child.tag.endswith("ETag"):
                        etag = (child.text or "").strip('"')
                wanted.append((num, etag))
        chunks = []
        for num, etag in wanted:
            data = up.parts.get(num or 0)
            if data is None or md5_etag(data) != etag:
                self._error(400, "InvalidPart", f"part {num} was not uploaded or its ETag differs")
                return
            chunks.append(data)
        sizes = [len(c) for c in chunks]
        if self.s3.reject_checksums and sizes[:-1] and (len(set(sizes[:-1])) > 1 or sizes[-1] > sizes[0]):
            self._error(400, "InvalidPart", "All non-trailing parts must have the same length.")
            return
        obj = self.s3.put(bucket, key, b"".join(chunks), etag=multipart_etag(chunks))
        with self.s3.lock:
            self.s3.uploads.pop(uid, None)
        self._xml(
            200,
            f'<CompleteMultipartUploadResult xmlns="{NS}"><Bucket>{bucket}</Bucket>'
            f"<Key>{_xml_text(key)}</Key><ETag>&quot;{obj.etag}&quot;</ETag></CompleteMultipartUploadResult>",
        )

    def _delete_object(self, bucket: str, key: str, q: dict[str, list[str]]) -> None:
        self._body()
        with self.s3.lock:
            if "uploadId" in q:
                if self.s3.uploads.pop(q["uploadId"][0], None) is None:
                    self._error(404, "NoSuchUpload", "The specified upload does not exist.")
                    return
            else:
                self.s3.objects.pop((bucket, key), None)
        self._send(204)
