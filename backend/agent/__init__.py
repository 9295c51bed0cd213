"""What runs ON a node: the detached job runner and the context job kinds report through."""

from backend.agent.context import JobContext

__all__ = ["JobContext"]
