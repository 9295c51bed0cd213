"""The state tests use the jobs tests' seeded source prefix (a real SeaweedFS bucket)."""

from tests.jobs.conftest import source  # noqa: F401 - a fixture, used by name
