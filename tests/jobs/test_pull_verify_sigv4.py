"""The verifier's SigV4 signer (backend.pulls.verify.SigV4) signs exactly as botocore does.

The HEADs a pull sends to learn each object's checksum are signed by AWS's common runtime
(awscrt, C; botocore's signer costs ~0.4 ms a request, a fifth of a 1 MiB object's proof), with
the flags S3 needs (no double URI encoding, no path normalisation); this holds it to botocore's own
S3SigV4Auth on the same request at the same second, over the inputs the verifier sends: any key
(quoted as the verifier quotes it), with and without ``partNumber``, checksum mode, a session
token, a port in the host, any region.
"""

from __future__ import annotations

import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.pulls.verify import SigV4


def _botocore(url: str, region: str, headers: dict[str, str], token: str | None) -> dict[str, str]:
    req = AWSRequest(method="HEAD", url=url, headers=dict(headers))
    S3SigV4Auth(
        BotoCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token), "s3", region
    ).add_auth(req)
    return {k.lower(): v for k, v in req.headers.items()}


@settings(max_examples=60, deadline=None)
@given(
    key=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40),
    part=st.none() | st.integers(1, 10_000),
    checksums=st.booleans(),
    token=st.none() | st.text("abcdefXYZ019+/=", min_size=1, max_size=30),
    host=st.sampled_from(["127.0.0.1:8333", "bucket.s3.eu-west-1.amazonaws.com", "s3.us-east-1.amazonaws.com"]),
    region=st.sampled_from(["us-east-1", "eu-west-1", "ap-southeast-2"]),
    scheme=st.sampled_from(["http", "https"]),
)
def test_signs_as_botocore_does(
    key: str, part: int | None, checksums: bool, token: str | None, host: str, region: str, scheme: str
) -> None:
    path = "/bucket/" + urllib.parse.quote(key, safe="/-_.~")
    query = f"partNumber={part}" if part is not None else ""
    extra = {"x-amz-checksum-mode": "ENABLED"} if checksums else {}
    want = _botocore(f"{scheme}://{host}{path}{'?' + query if query else ''}", region, extra, token)
    got = SigV4("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token).sign(
        "HEAD", host, path, query, region, extra, amz_date=want["x-amz-date"]
    )
    assert got.pop("host") == host
    assert got == want


def test_a_wrong_secret_or_day_signs_differently() -> None:
    """The signature depends on the secret and the date (a constant signature would pass the above)."""

    def auth(secret: str, amz_date: str) -> str:
        return SigV4("AK", secret).sign("HEAD", "127.0.0.1:8333", "/b/k", "", "us-east-1", {}, amz_date)[
            "authorization"
        ]

    a, b, c = (
        auth("secret-one", "20261202T044500Z"),
        auth("secret-two", "20261202T044500Z"),
        auth("secret-one", "20261203T044500Z"),
    )
    assert len({a, b, c}) == 3


def test_without_awscrt_botocore_signs_the_same_request() -> None:
    """A node without awscrt falls back to botocore's signer: the same headers are signed, the
    same credential scope; the signature itself is botocore's (checked against the real store in
    the pull tests with awscrt, here against the runtime's for the same second)."""
    signer = SigV4("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "tok")
    fallback = SigV4("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "tok")
    fallback._crt = None
    for _ in range(3):  # the two read the clock apart: retry across a second's edge
        got = fallback.sign("HEAD", "127.0.0.1:8333", "/b/k%20x", "partNumber=2", "eu-west-1", {})
        want = signer.sign("HEAD", "127.0.0.1:8333", "/b/k%20x", "partNumber=2", "eu-west-1", {}, got["x-amz-date"])
        if got == want:
            return
    assert got == want
