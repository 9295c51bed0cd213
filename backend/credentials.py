"""Resolved object-store credentials and the two ways they travel to a node job.

Kept apart from :mod:`backend.storage` so node-side job code can use it without importing asyncio
and the store clients (every job start pays its imports).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Credentials:
    """Resolved AWS-style credentials. Never log or display these."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # keep secrets out of tracebacks and logs
        return "Credentials(<redacted>)"

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Credentials | None:
        """The credentials in ``AWS_*`` env vars (a job's secrets), or None when there are none."""
        if not env.get("AWS_ACCESS_KEY_ID"):
            return None
        return cls(env["AWS_ACCESS_KEY_ID"], env.get("AWS_SECRET_ACCESS_KEY", ""), env.get("AWS_SESSION_TOKEN") or None)

    def as_env(self) -> dict[str, str]:
        """The ``AWS_*`` env vars for these credentials (for a job's 0600 secrets file, never argv)."""
        env = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        if self.token:
            env["AWS_SESSION_TOKEN"] = self.token
        return env

    def shared_credentials_file(self, profile: str = "default") -> str:
        """Text of an AWS shared-credentials file holding these credentials (write it 0600)."""
        lines = [f"[{profile}]", f"aws_access_key_id = {self.access_key}", f"aws_secret_access_key = {self.secret_key}"]
        if self.token:
            lines.append(f"aws_session_token = {self.token}")
        return "\n".join(lines) + "\n"
