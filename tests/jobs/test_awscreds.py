"""Static keys read without botocore must be exactly what botocore's chain returns, and the
reader must step aside (None) wherever botocore would resolve any other way."""

from __future__ import annotations

from pathlib import Path

import botocore.session
import pytest

from backend.credentials import Credentials
from backend.pulls.awscreds import static_credentials

CREDS = """
[default]
aws_access_key_id = AKIDEFAULT
aws_secret_access_key = secret-default

[lab]
aws_access_key_id = AKILAB
aws_secret_access_key = secret-lab
aws_session_token = token-lab

[half]
aws_access_key_id = AKIHALF

[assumer]
aws_access_key_id = AKIASSUME
aws_secret_access_key = secret-assume
role_arn = arn:aws:iam::123456789012:role/x
"""

CONFIG = """
[profile sso]
sso_session = corp
sso_account_id = 1
sso_role_name = r

[profile roled]
role_arn = arn:aws:iam::123456789012:role/y
source_profile = default
"""

ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@pytest.fixture
def aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    (tmp_path / "credentials").write_text(CREDS)
    (tmp_path / "config").write_text(CONFIG)
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def _botocore(profile: str | None) -> Credentials:
    session = botocore.session.Session()
    if profile:
        session.set_config_variable("profile", profile)
    frozen = session.get_credentials().get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


@pytest.mark.parametrize(
    ("profile", "env"),
    [
        ("lab", {}),
        ("default", {}),
        (None, {}),
        (None, {"AWS_PROFILE": "lab"}),
        (None, {"AWS_ACCESS_KEY_ID": "AKIENV", "AWS_SECRET_ACCESS_KEY": "secret-env"}),
        (None, {"AWS_ACCESS_KEY_ID": "AKIENV", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}),
        # An explicit profile wins over AWS_* keys in the environment, as in botocore.
        ("lab", {"AWS_ACCESS_KEY_ID": "AKIENV", "AWS_SECRET_ACCESS_KEY": "secret-env"}),
    ],
)
def test_static_keys_equal_botocores(aws: pytest.MonkeyPatch, profile: str | None, env: dict[str, str]) -> None:
    for k, v in env.items():
        aws.setenv(k, v)
    got = static_credentials(profile)
    assert got is not None
    want = _botocore(profile)
    assert (got.access_key, got.secret_key, got.token) == (want.access_key, want.secret_key, want.token)


@pytest.mark.parametrize(
    ("profile", "env"),
    [
        ("half", {}),  # partial keys: botocore says what is wrong
        ("assumer", {}),  # a role in the credentials file
        ("roled", {}),  # a role in the config file
        ("sso", {}),
        ("missing", {}),  # no such profile
        (None, {"AWS_ACCESS_KEY_ID": "AKIONLY"}),
        (None, {"AWS_PROFILE": "lab", "AWS_DEFAULT_PROFILE": "default"}),
        ("lab", {"AWS_WEB_IDENTITY_TOKEN_FILE": "/tmp/token", "AWS_ROLE_ARN": "arn:aws:iam::1:role/z"}),
    ],
)
def test_anything_but_plain_keys_is_left_to_botocore(
    aws: pytest.MonkeyPatch, profile: str | None, env: dict[str, str]
) -> None:
    for k, v in env.items():
        aws.setenv(k, v)
    assert static_credentials(profile) is None


def test_default_section_and_unreadable_files_are_left_to_botocore(aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text("[DEFAULT]\nregion = x\n" + CREDS)
    assert static_credentials("lab") is None
    (tmp_path / "credentials").write_text("not an ini file\n")
    assert static_credentials("lab") is None
    aws.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent"))
    assert static_credentials("lab") is None
