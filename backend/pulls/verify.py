"""Verify a pull's objects while s5cmd copies the rest: one proof per object, on a few threads.

:class:`PullVerifier` takes each object as soon as s5cmd reports it in place, and on a bounded
pool of threads asks the store for the object's checksums (one HEAD with
``x-amz-checksum-mode: ENABLED``; a second for the first part's length where only a per-part
value or a multipart ETag is to be had), chooses the cheapest proof
(:func:`backend.pulls.integrity.choose_proof`) and re-reads the file, which is still in the page
cache. The hash functions release the GIL, so the threads hash in parallel with each other and
with the copy. A small object with a plain MD5 ETag in the listing is hashed without a HEAD:
below :data:`HEAD_MIN_BYTES` hashing it costs less than asking.

Node side only (the pull runner). HEADs are signed by :class:`SigV4` (AWS's common runtime, else
botocore); botocore also resolves a named profile's credentials on the node. Once the store has
shown that it keeps checksums, the next objects' HEADs are sent ahead, as s5cmd reports them in
place, through awscrt's HTTP client with several in flight (:mod:`backend.pulls.crt_http`: ~0.4x
the client CPU of one ``http.client`` HEAD at a time); the thread that proves an object takes its
answer, and any HEAD that went wrong there is asked again the plain way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import os
import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from backend.credentials import Credentials
from backend.pulls import crt_http
from backend.pulls.crt_http import HeadPool, Pending
from backend.pulls.integrity import (
    MD5,
    SIZE_ONLY,
    Proof,
    choose_proof,
    crt_available,
    parse_checksum_headers,
    plain_md5_etag,
    proof_holds,
)
from backend.pulls.objects import PulledObject, SourcePattern
from backend.pulls.params import PullParams

if TYPE_CHECKING:  # imported where a HEAD is sent the plain way, after s5cmd started (~20 ms)
    import http.client

#: Below this size an object whose listed ETag is a plain MD5 is proven by MD5 with no HEAD: a
#: HEAD costs ~0.2 ms of client CPU sent ahead through awscrt (~0.5 ms one at a time through
#: http.client, ~0.9 ms with botocore's signer; bench/verify_cost.py) and ~0.4-0.55 ms of the
#: store's (loopback SeaweedFS), MD5 ~2 ms a MiB, reading and CRC64NVME ~0.1 ms a MiB, so above
#: ~0.5 MiB the store's checksum is the cheaper proof even where the store's CPU is ours too (the
#: lab); on a remote store the crossing is lower (not moved: unmeasured there).
HEAD_MIN_BYTES = 512 << 10
#: After this many HEADs that carried no checksum, the store is taken to keep none: objects with a
#: plain MD5 ETag are then proven by it without asking (up to NO_CHECKSUM_MD5_MAX bytes, past
#: which one HEAD more is nothing next to the hashing, and it stands in for the fresh listing).
LEARN_AFTER = 8
NO_CHECKSUM_MD5_MAX = 64 << 20
#: Per-part lengths are asked for (one HEAD per part) only for uploads of at most this many parts,
#: when equal parts did not give the store's value.
EXACT_PARTS_MAX = 64
#: Seconds a HEAD may take; after this many failed HEADs in a row the pull stops asking.
HEAD_TIMEOUT = 20
HEADS_GIVE_UP = 3
#: HEADs sent ahead (:meth:`StoreHeads.send_ahead`) and not yet taken, at the most: enough to keep
#: awscrt's connections busy (bench/verify_cost.py: 16 in flight cost ~0.4x the CPU of one at a
#: time), few enough that a store that starts failing is not asked much past HEADS_GIVE_UP.
AHEAD_MAX = 32


@dataclass(frozen=True)
class ObjectCheck:
    """The outcome for one object: the method used, whether its bytes matched, and why not."""

    rel: str
    method: str
    ok: bool
    detail: str = ""
    #: A HEAD after s5cmd had the object in place gave the listed size and ETag: it stands in for
    #: a fresh listing of this object.
    headed: bool = False


class _CrtRequest(Protocol):
    """What is used of a signed ``awscrt.http.HttpRequest`` (awscrt has no type stubs)."""

    @property
    def headers(self) -> Iterable[tuple[str, str]]: ...


class SigV4:
    """AWS Signature Version 4 for a request with no body (a HEAD), by AWS's common runtime
    (``awscrt.auth``, C: ~25 us a request) where it is installed, else botocore's S3SigV4Auth
    (~0.4 ms). Never by hand. Held to botocore's signer in tests/jobs/test_pull_verify_sigv4.py."""

    def __init__(self, access_key: str, secret_key: str, token: str | None = None) -> None:
        self.access_key, self._secret, self.token = access_key, secret_key, token
        # awscrt has no type stubs: its module is held as a module, its provider as an object.
        self._crt: types.ModuleType | None = None
        self._provider: object = None
        try:
            from awscrt import auth as crt_auth
        except ImportError:  # a node without awscrt: botocore signs (slower, same headers)
            return
        self._crt = crt_auth
        self._provider = crt_auth.AwsCredentialsProvider.new_static(access_key, secret_key, token)

    def sign(
        self,
        method: str,
        host: str,
        path: str,
        query: str,
        region: str,
        extra: dict[str, str],
        amz_date: str | None = None,
    ) -> dict[str, str]:
        """The headers to send (Host included) for ``method`` on ``path`` (already URI-encoded,
        as S3 signs it) with ``query`` (``name=value`` pairs of plain characters, or "")."""
        when = (
            datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
            if amz_date
            else datetime.datetime.now(datetime.UTC)
        )
        target = f"{path}?{query}" if query else path
        headers = {"host": host, **{k.lower(): v for k, v in extra.items()}}
        if self._crt is None:
            return self._sign_botocore(method, target, region, headers, when)
        request = self._crt_signed(method, target, region, headers, when)
        return {k.lower(): v for k, v in request.headers}

    def crt_request(self, method: str, host: str, path: str, query: str, region: str, extra: dict[str, str]) -> object:
        """The signed request as an ``awscrt.http.HttpRequest``, to send through awscrt's HTTP
        client (:mod:`backend.pulls.crt_http`); None where awscrt does not sign here."""
        if self._crt is None:
            return None
        target = f"{path}?{query}" if query else path
        headers = {"host": host, **{k.lower(): v for k, v in extra.items()}}
        return self._crt_signed(method, target, region, headers, datetime.datetime.now(datetime.UTC))

    def _crt_signed(
        self, method: str, target: str, region: str, headers: dict[str, str], when: datetime.datetime
    ) -> _CrtRequest:
        from awscrt import http as crt_http

        assert self._crt is not None
        request = crt_http.HttpRequest(method, target, crt_http.HttpHeaders(list(headers.items())))
        config = self._crt.AwsSigningConfig(
            algorithm=self._crt.AwsSigningAlgorithm.V4,
            signature_type=self._crt.AwsSignatureType.HTTP_REQUEST_HEADERS,
            credentials_provider=self._provider,
            region=region,
            service="s3",
            date=when,
            use_double_uri_encode=False,  # S3 signs the path as sent
            should_normalize_uri_path=False,
            signed_body_value=self._crt.AwsSignedBodyValue.EMPTY_SHA256,
            signed_body_header_type=self._crt.AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256,
        )
        self._crt.aws_sign_request(request, config).result()
        return request

    def _sign_botocore(
        self, method: str, target: str, region: str, headers: dict[str, str], when: datetime.datetime
    ) -> dict[str, str]:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials as BotoCredentials

        request = AWSRequest(method=method, url=f"http://{headers['host']}{target}", headers=dict(headers))
        request.context["timestamp"] = when.strftime("%Y%m%dT%H%M%SZ")
        S3SigV4Auth(BotoCredentials(self.access_key, self._secret, self.token), "s3", region).add_auth(request)
        return {k.lower(): v for k, v in request.headers.items()}


class StoreHeads:
    """HEAD requests for one bucket, signed with SigV4 (:class:`SigV4`) and sent on one
    keep-alive connection per thread: a HEAD costs a fraction of a millisecond of CPU here, where a
    botocore client costs ~0.5 s to create and ~1.5 ms a request.

    An object's first HEAD can be sent ahead (:meth:`send_ahead`, as soon as s5cmd has the object
    in place) through awscrt's HTTP client, many in flight (:mod:`backend.pulls.crt_http`: about a
    third of the client CPU, measured by bench/verify_cost.py); :meth:`head` takes its answer, and
    asks again the plain way when it has none."""

    def __init__(self, params: PullParams, secret_env: dict[str, str], bucket: str) -> None:
        self.params = params
        self.creds = Credentials.from_env(secret_env)
        self.bucket = bucket
        region = params.get("region")
        self.region = str(region) if region and region != "auto" else "us-east-1"
        self._signing: SigV4 | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self.failed: str | None = None  # the first failure, for the log
        self.requests = 0
        self._failures_in_a_row = 0
        self._pool: HeadPool | None = None
        self._pool_for: tuple[str, str] | None = None
        self._ahead: dict[str, Pending] = {}
        self.ahead_off: str | None = None  # why HEADs are no longer sent ahead
        self.sent_ahead = 0
        self.pool_cpu_s = 0.0  # CPU of closed pools' event-loop threads

    def _signer(self) -> SigV4:
        with self._lock:
            if self._signing is None:
                if self.creds is not None:
                    self._signing = SigV4(self.creds.access_key, self.creds.secret_key, self.creds.token)
                else:  # a profile on the node: botocore's own chain resolves it, once
                    import botocore.session

                    session = botocore.session.get_session()
                    if profile := self.params.get("profile"):
                        session.set_config_variable("profile", profile)
                    found = session.get_credentials()
                    if found is None:
                        raise OSError("no credentials for the store on this node")
                    frozen = found.get_frozen_credentials()
                    self._signing = SigV4(frozen.access_key, frozen.secret_key, frozen.token)
            return self._signing

    def _url(self, key: str) -> tuple[str, str, str]:
        """(scheme, host[:port], path) of ``key``: path-style on a configured endpoint, virtual-host
        style on AWS."""
        import urllib.parse

        quoted = urllib.parse.quote(key, safe="/-_.~")
        endpoint = self.params.get("endpoint_url")
        if endpoint:
            u = urllib.parse.urlsplit(endpoint)
            base = u.path.rstrip("/")
            return u.scheme or "https", u.netloc, f"{base}/{self.bucket}/{quoted}"
        if "." in self.bucket:  # a dotted name does not match the wildcard certificate: path style
            return "https", f"s3.{self.region}.amazonaws.com", f"/{self.bucket}/{quoted}"
        return "https", f"{self.bucket}.s3.{self.region}.amazonaws.com", f"/{quoted}"

    def _connection(self, scheme: str, host: str) -> http.client.HTTPConnection:
        import http.client

        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "host", None) != (scheme, host):
            if conn is not None:
                conn.close()
            conn = (http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection)(
                host, timeout=HEAD_TIMEOUT
            )
            self._local.conn, self._local.host = conn, (scheme, host)
        return conn

    def _send(
        self, key: str, part: int | None, checksums: bool, ahead: Pending | None = None
    ) -> tuple[int, dict[str, str]]:
        """One HEAD's status and headers: the answer to the one sent ahead (``ahead``), else
        sent on this thread's connection; a failure (a dropped connection) is asked once more."""
        if ahead is not None:
            try:
                return ahead.wait(HEAD_TIMEOUT)
            except crt_http.HeadError as exc:  # the first attempt: once more, the plain way
                self._ahead_failed(str(exc))
        scheme, host, path = self._url(key)
        query = f"partNumber={part}" if part is not None else ""
        extra = {"x-amz-checksum-mode": "ENABLED"} if checksums else {}
        sent = self._signer().sign("HEAD", host, path, query, self.region, extra)
        query = "?" + query if query else ""
        import http.client

        for attempt in (1, 2) if ahead is None else (2,):
            conn = self._connection(scheme, host)
            try:
                conn.request("HEAD", path + query, headers=sent)
                resp = conn.getresponse()
                resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}
            except (OSError, ValueError, http.client.HTTPException) as exc:  # a dropped connection: once more
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise OSError(str(exc)) from None
        raise AssertionError("unreachable")

    def send_ahead(self, key: str) -> bool:
        """Send ``key``'s HEAD (with checksums) now, through awscrt's client, for :meth:`head`
        to take; False when it was not (awscrt cannot send it, :data:`AHEAD_MAX` are waiting to be
        taken, or the store's HEADs are failing): it is asked the plain way then."""
        with self._lock:
            if (
                self._failures_in_a_row
                or self.ahead_off
                or len(self._ahead) >= AHEAD_MAX
                or key in self._ahead
                or not crt_http.available()
            ):
                return False
        try:
            scheme, host, path = self._url(key)
            request = self._signer().crt_request(
                "HEAD", host, path, "", self.region, {"x-amz-checksum-mode": "ENABLED"}
            )
            if request is None:
                return False
            pool = self._head_pool(scheme, host)
        except Exception:  # noqa: BLE001 - nothing sent ahead: head() asks, and says why it could not
            return False
        pending = pool.send(request)
        with self._lock:
            self._ahead[key] = pending
            self.requests += 1
            self.sent_ahead += 1
        return True

    def _ahead_failed(self, why: str) -> None:
        """A HEAD sent ahead went wrong: none is sent ahead any more in this pull (a TLS setup or
        a proxy that only http.client gets through must not cost a failed attempt per object)."""
        with self._lock:
            self.ahead_off = self.ahead_off or why

    @property
    def waiting(self) -> int:
        """HEADs sent ahead and not taken yet."""
        with self._lock:
            return len(self._ahead)

    def forget(self, key: str) -> None:
        """``key`` was proven without taking what was sent ahead for it (if anything)."""
        with self._lock:
            self._ahead.pop(key, None)

    def _head_pool(self, scheme: str, host: str) -> HeadPool:
        with self._lock:
            if self._pool is not None and self._pool_for == (scheme, host):
                return self._pool
            old, self._pool = self._pool, HeadPool(scheme, host, HEAD_TIMEOUT)
            self._pool_for = (scheme, host)
            pool = self._pool
        if old is not None:  # the bucket's region (and so its host) learnt meanwhile
            self._close_pool(old)
        return pool

    def _close_pool(self, pool: HeadPool) -> None:
        with self._lock:
            self.pool_cpu_s += pool.cpu_s
        pool.close()

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the awscrt event-loop threads that sent HEADs ahead."""
        with self._lock:
            pool = self._pool
        return self.pool_cpu_s + (pool.cpu_s if pool is not None else 0.0)

    def close(self) -> None:
        """Close the connections HEADs were sent ahead on (what was not taken is dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._ahead.clear()
        if pool is not None:
            self._close_pool(pool)

    def head(self, key: str, *, part: int | None = None, checksums: bool = True) -> dict[str, str] | None:
        """The object's response headers (lower-cased names), or None when the HEAD failed (and
        at once, without asking, once HEADS_GIVE_UP in a row failed: a store that does not answer
        costs the pull a few timeouts, not one per object)."""
        with self._lock:
            if self._failures_in_a_row >= HEADS_GIVE_UP:
                return None
            ahead = self._ahead.pop(key, None) if part is None and checksums else None
            if ahead is None:
                self.requests += 1
        try:
            status, headers = self._send(key, part, checksums, ahead)
            if status in (301, 400) and (region := headers.get("x-amz-bucket-region")) and region != self.region:
                self.region = region  # the bucket lives elsewhere: S3 says where
                status, headers = self._send(key, part, checksums)
            if status in (400, 403) and checksums:
                # A store that refuses x-amz-checksum-mode (as R2 did), or a key policy that lets
                # nobody here decrypt an SSE-KMS object's checksum, still answers a plain HEAD.
                status, headers = self._send(key, part, False)
        except Exception as exc:  # noqa: BLE001 - any failure: the weaker proof, said so
            self._failed(f"HEAD {key}: {type(exc).__name__}: {str(exc)[:200]}", part)
            return None
        if status != 200 and not (part is not None and status == 206):  # a part is partial content
            self._failed(f"HEAD {key}: HTTP {status}", part)
            return None
        if part is None:
            with self._lock:
                self._failures_in_a_row = 0
        return headers

    def _failed(self, why: str, part: int | None) -> None:
        with self._lock:
            self.failed = self.failed or why
            # A store that cannot say a part's length may still serve checksums: only whole-object
            # HEADs count towards giving up.
            self._failures_in_a_row += part is None
            give_up = self._failures_in_a_row >= HEADS_GIVE_UP
        if give_up:  # what was sent ahead and not answered yet is not asked
            self.close()


def _length(headers: dict[str, str] | None) -> int | None:
    v = (headers or {}).get("content-length", "")
    return int(v) if v.isascii() and v.isdigit() and len(v) < 20 else None


class PullVerifier:
    """Proves each object of a pull on a pool of ``workers`` threads as s5cmd finishes it."""

    def __init__(
        self,
        src: SourcePattern,
        dest: Path,
        expected: list[PulledObject],
        heads: StoreHeads,
        *,
        workers: int | None = None,
        head_min_bytes: int = HEAD_MIN_BYTES,
        then: Callable[[int, ObjectCheck], ObjectCheck] | None = None,
    ) -> None:
        self.src, self.dest, self.expected, self.heads = src, dest, expected, heads
        self.head_min_bytes = head_min_bytes
        #: Run on the pool after each proof (a staged copy renames a proven object into DEST
        #: there); what it returns is the object's outcome.
        self.then = then
        self.crt = crt_available()
        # A quarter of the node's cores (s5cmd needs the rest), at least 2 and at most 16: ~4 GB/s of
        # CRC64NVME per core from the page cache, ~0.6 GB/s of MD5.
        n = workers or max(2, min(16, (os.cpu_count() or 1) // 4))
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix="lm-verify")
        self.futures: dict[int, concurrent.futures.Future[ObjectCheck]] = {}
        self._lock = threading.Lock()
        self.cpu_s = 0.0
        self.bytes_hashed = 0
        self._stopped = False
        self._heads = 0  # HEADs of whole objects answered, and how many carried a checksum
        self._with_checksums = 0
        #: Objects in place whose HEAD may go ahead (in the order they are proven), and those a
        #: thread has begun proving (too late to send theirs ahead).
        self._unsent: collections.deque[int] = collections.deque()
        self._begun: set[int] = set()
        self._send_lock = threading.Lock()

    def submit(self, index: int) -> None:
        """Object ``index`` is in place: send its HEAD now (:meth:`StoreHeads.send_ahead`) and
        prove it (once) on the pool."""
        t0 = time.thread_time()
        with self._lock:
            if index in self.futures or self._stopped:
                return
            self.futures[index] = self.pool.submit(self._check, index)
        if not self._no_head(self.expected[index]):
            with self._lock:
                self._unsent.append(index)
        self._send_ahead()
        dt = time.thread_time() - t0
        with self._lock:
            self.cpu_s += dt

    def _send_ahead(self) -> None:
        """Send ahead the HEADs of the next objects to be proven, up to AHEAD_MAX waiting, once
        the store has shown it keeps checksums (a store that keeps none, or refuses HEADs, is
        asked one object at a time as before, and learnt about or given up on just as soon)."""
        with self._lock:
            if self._with_checksums == 0 or not self._unsent:
                return
        if self.heads.waiting > AHEAD_MAX // 2:
            return  # topped up in bursts: awscrt's thread then answers several at each wake-up
        with self._send_lock:
            while True:
                with self._lock:
                    if not self._unsent:
                        return
                    index = self._unsent[0]
                    if index in self._begun:
                        self._unsent.popleft()
                        continue
                if not self.heads.send_ahead(self.src.key_of(self.expected[index].rel)):
                    return
                with self._lock:
                    self._unsent.popleft()

    def _no_head(self, o: PulledObject) -> bool:
        """Whether ``o`` is proven by the MD5 of its listed ETag with no HEAD (:meth:`_prove`)."""
        with self._lock:
            none_kept = self._heads >= LEARN_AFTER and self._with_checksums == 0
        return plain_md5_etag(o.etag) and (
            o.size < self.head_min_bytes or (none_kept and o.size <= NO_CHECKSUM_MD5_MAX)
        )

    def finish(self) -> dict[int, ObjectCheck]:
        """Prove every object not proven yet; each object's outcome once all are done."""
        for i in range(len(self.expected)):
            self.submit(i)
        out = {i: f.result() for i, f in self.futures.items()}
        self.pool.shutdown(wait=True)
        self._close_heads()
        return out

    def stop(self) -> None:
        """Drop what has not started (a failed or cancelled copy)."""
        with self._lock:
            self._stopped = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._close_heads()

    def _close_heads(self) -> None:
        """Close the connections HEADs went ahead on; their C side's CPU counts as the verifier's."""
        self.heads.close()
        with self._lock:
            self.cpu_s += self.heads.cpu_s

    # -- one object ------------------------------------------------------------------------------

    def _check(self, index: int) -> ObjectCheck:
        t0 = time.thread_time()
        with self._lock:
            self._begun.add(index)
        self._send_ahead()  # the next objects' HEADs, while this one is proven
        try:
            check = self._prove(self.expected[index])
        except FileNotFoundError:
            check = ObjectCheck(self.expected[index].rel, "size", False, "is missing")
        except OSError as exc:
            check = ObjectCheck(self.expected[index].rel, "size", False, f"cannot be read: {exc.strerror}")
        self.heads.forget(self.src.key_of(self.expected[index].rel))
        try:
            return self.then(index, check) if self.then is not None else check
        finally:
            dt = time.thread_time() - t0
            with self._lock:
                self.cpu_s += dt

    def _prove(self, o: PulledObject) -> ObjectCheck:
        path = self.dest / o.rel
        got = path.stat().st_size
        if got != o.size:
            return ObjectCheck(o.rel, "size", False, f"is {got} bytes, the listing says {o.size}")
        key = self.src.key_of(o.rel)
        if self._no_head(o):
            proof = Proof(MD5, "md5", o.etag)
            ok, detail = self._holds(path, proof, o.size)
            if ok:
                return ObjectCheck(o.rel, MD5, True)
            head = self.heads.head(key)  # an SSE-KMS object's ETag is no MD5 of its bytes
            if head is not None and head.get("x-amz-server-side-encryption", "").startswith("aws:kms"):
                return self._weaker(o, path, head)
            return ObjectCheck(o.rel, MD5, False, f"has {detail}: torn or corrupted in transit")
        head = self.heads.head(key)
        if head is not None:
            with self._lock:
                self._heads += 1
                self._with_checksums += bool(parse_checksum_headers(head))
            etag = head.get("etag", "").strip('"') or None
            if (o.etag and etag and etag != o.etag) or _length(head) not in (None, o.size):
                return ObjectCheck(
                    o.rel,
                    "etag",
                    False,
                    f"changed in the bucket during the pull (ETag {o.etag}, now {etag}; {o.size} bytes, now "
                    f"{_length(head)}): the file may mix two versions",
                )
        check = self._weaker(o, path, head)
        if head is not None and o.etag and head.get("etag", "").strip('"') == o.etag and _length(head) == o.size:
            check = dataclasses.replace(check, headed=True)
        return check

    def _weaker(self, o: PulledObject, path: Path, head: dict[str, str] | None) -> ObjectCheck:
        """Prove ``o`` with what its HEAD (or, with none, its listed ETag) offers."""
        key = self.src.key_of(o.rel)
        checksums = parse_checksum_headers(head or {})
        kms = (head or {}).get("x-amz-server-side-encryption", "").startswith("aws:kms")
        etag = o.etag or ((head or {}).get("etag", "").strip('"') or None)
        proof = choose_proof(o.size, etag, checksums, kms=kms, crt=self.crt)
        if proof.method == SIZE_ONLY and head is not None and "multipart" in proof.why:
            # The first part's length gives every boundary of an upload of equal parts.
            part_size = _length(self.heads.head(key, part=1, checksums=False))
            proof = choose_proof(o.size, etag, checksums, part_size=part_size, kms=kms, crt=self.crt)
        if not proof.verifies_bytes:
            if head is None and self.heads.failed:
                proof = Proof(SIZE_ONLY, why=f"the store's HEAD failed ({self.heads.failed})")
            return ObjectCheck(o.rel, SIZE_ONLY, True, proof.why)
        ok, detail = self._holds(path, proof, o.size)
        if not ok and proof.parts and 1 < proof.parts <= EXACT_PARTS_MAX:
            # Parts of unequal sizes: ask for each one's length and recompute over those.
            sizes = [_length(self.heads.head(key, part=n, checksums=False)) for n in range(1, proof.parts + 1)]
            if all(s is not None for s in sizes) and sum(s or 0 for s in sizes) == o.size:
                ok, detail = self._holds(path, proof, o.size, [s or 0 for s in sizes])
        if ok:
            return ObjectCheck(o.rel, proof.method, True)
        return ObjectCheck(o.rel, proof.method, False, f"has {detail}: torn or corrupted in transit")

    def _holds(self, path: Path, proof: Proof, size: int, sizes: list[int] | None = None) -> tuple[bool, str]:
        ok, detail = proof_holds(path, proof, sizes)
        with self._lock:
            self.bytes_hashed += size
        return ok, detail


class Summary(TypedDict):
    """The result's verification fields (:func:`summarize`)."""

    verified: str
    verification: dict[str, int]
    verified_text: str


def summarize(checks: dict[int, ObjectCheck], total: int) -> Summary:
    """The result's verification fields: counts per method, ``verified`` ("bytes" when every
    object's bytes were proven, "size-only" when none were, "partly" otherwise) and a line."""
    counts: dict[str, int] = {}
    for c in checks.values():
        counts[c.method] = counts.get(c.method, 0) + 1
    weak = counts.get(SIZE_ONLY, 0)
    byte_counts = ", ".join(f"{m} x{n}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]) if m != SIZE_ONLY)
    if weak == 0:
        verified, text = "bytes", f"every object's bytes proven ({byte_counts})"
    else:
        why = next(c.detail for c in checks.values() if c.method == SIZE_ONLY)
        verified = "size-only" if weak == total else "partly"
        text = f"verified: size-only for {weak} of {total} objects ({why})" + (
            f"; bytes proven for the rest ({byte_counts})" if byte_counts else ""
        )
    return Summary(verified=verified, verification=counts, verified_text=text)


def per_object(checks: dict[int, ObjectCheck]) -> dict[str, str]:
    """rel -> method for each object (the result's per-object report)."""
    return {c.rel: c.method for _i, c in sorted(checks.items())}


def stop_quietly(verifier: PullVerifier | None) -> None:
    if verifier is not None:
        with contextlib.suppress(Exception):
            verifier.stop()
