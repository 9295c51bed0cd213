"""Static AWS keys read the way botocore's chain finds them first, without importing botocore.

Importing botocore costs ~0.1 s of CPU, which a ``loadmaster pull`` would pay before it can start
listing the source. Most stores use plain keys (``AWS_*`` env vars or a shared-credentials
profile), which this module reads directly. Whenever botocore could resolve differently (a role,
SSO, a credential process, web identity, partial or missing keys, an unreadable file) it returns
None and the caller asks botocore itself, so the answer is never different from botocore's.
"""

from __future__ import annotations

import configparser
import os

from backend.credentials import Credentials

#: Profile keys that make botocore fetch credentials some other way than static keys.
DYNAMIC_KEYS = frozenset(
    {
        "role_arn",
        "source_profile",
        "credential_source",
        "credential_process",
        "web_identity_token_file",
        "sso_session",
        "sso_start_url",
        "sso_account_id",
        "sso_role_name",
        "sso_region",
        "login_session",
    }
)

#: Environment that switches on a provider which botocore consults before shared files.
DYNAMIC_ENV = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")


def _sections(path: str) -> dict[str, dict[str, str]] | None:
    """The file's sections (``{}`` when it does not exist); None when it cannot be parsed."""
    parser = configparser.RawConfigParser()
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, configparser.Error):
        return None
    if parser.defaults():
        return None  # botocore's parser would merge a [DEFAULT] section into every profile
    return {s: {k.strip().lower(): v.strip() for k, v in parser.items(s)} for s in parser.sections()}


def _env_path(var: str, default: str) -> str:
    return os.path.expanduser(os.environ.get(var) or default)


def static_credentials(profile: str | None) -> Credentials | None:
    """The keys botocore would return for ``profile`` (None: its default choice), when they are
    static keys this function can read with certainty; otherwise None."""
    env = os.environ
    if any(env.get(k) for k in DYNAMIC_ENV):
        return None
    if profile is None:
        # No explicit profile: botocore looks at AWS_* keys first.
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if key or secret:
            if not (key and secret):
                return None  # botocore raises PartialCredentialsError: let it say so
            return Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN") or None)
        chosen = {p for p in (env.get("AWS_DEFAULT_PROFILE"), env.get("AWS_PROFILE")) if p}
        if len(chosen) > 1:
            return None
        profile = chosen.pop() if chosen else "default"
    creds = _sections(_env_path("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    config = _sections(_env_path("AWS_CONFIG_FILE", "~/.aws/config"))
    if creds is None or config is None:
        return None
    section = creds.get(profile) or {}
    conf = config.get(f"profile {profile}") or (config.get(profile) if profile == "default" else None) or {}
    if DYNAMIC_KEYS & (section.keys() | conf.keys()):
        return None
    key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
    if not (key and secret):
        return None  # keys elsewhere (config file, container, IMDS) or none: botocore decides
    return Credentials(key, secret, section.get("aws_session_token") or section.get("aws_security_token") or None)
