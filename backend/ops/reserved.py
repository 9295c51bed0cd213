"""The egress steps every command that reads a store from a node goes through (pull, shard, strip).

One order, whoever launches: the guard's check and every job's reservation in one transaction
(``EgressGuard.reserve``: a block budget refuses, a confirm needs a reason), the override audited,
then the launch; a launch that fails or is interrupted (SIGTERM, SIGHUP: see
``signals_cancel_launch``) releases the reservation of every job that never started. When the job
ends, its kind's ``on_ended`` settles the reservation (``backend.ledger.settle_job``), capped by it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from backend.errors import LoadmasterError, PolicyError
from backend.ops.base import Operation, signals_cancel_launch

if TYPE_CHECKING:
    from backend.config import StoreProfile
    from backend.ledger import Reservation, Reserved
    from backend.services import Services

T = TypeVar("T")


def release_unstarted(services: Services, job_ids: Iterable[str], exc: BaseException) -> None:
    """After a launch that failed or was interrupted: the reservation of every job that never got
    as far as its record (or whose start failed) stops counting. A job whose start was under way
    stays reserved: the next refresh finds it on its node, or finds it never started and
    releases it."""
    from backend.jobs.store import JobStore

    store = JobStore(services.db)
    why = f"not started: {type(exc).__name__}: {exc}"[:300]
    for job_id in job_ids:
        with contextlib.suppress(LoadmasterError):
            if store.state_of(job_id) in (None, "failed"):
                services.egress.release(job_id, why)


async def launch_reserved(
    services: Services,
    profile: StoreProfile,
    items: Sequence[Reservation],
    launch: Callable[[], Awaitable[T]],
    *,
    reason: str | None = None,
    what: str = "pull",
) -> tuple[T, Reserved]:
    """Reserve ``items`` against ``profile``'s budget (PolicyError, nothing reserved, when the
    guard refuses), audit an override, then ``launch()``; whatever of it never started is
    released if the launch raises or a SIGTERM/SIGHUP arrives meanwhile."""
    with signals_cancel_launch():
        reserved = services.egress.reserve(profile, items, allow_over_budget_reason=reason, what=what)
        try:
            dec = reserved.decision
            if dec is not None and dec.override_reason:
                Operation(services).audit_override(dec)
            return await launch(), reserved
        except BaseException as exc:
            release_unstarted(services, [it.job_id for it in items], exc)
            raise


async def read_here_reserved(
    services: Services,
    profile: StoreProfile,
    item: Reservation,
    work: Callable[[], Awaitable[T]],
    read: Callable[[T], int],
    *,
    reason: str | None = None,
    what: str,
) -> T:
    """What this process itself reads from a store (a strip run here, a retention apply's strips):
    ``item`` (priced at ``[egress] console_site``) reserved against the budget first (PolicyError,
    nothing read, when the guard refuses; an override audited), then ``work()``; the reservation
    settles to ``read(result)`` bytes (released at 0). Work refused by a rule (PolicyError: another
    apply's lock, a refused layout) releases it; work that fails otherwise counts at its
    reservation: what it read before failing is not known, and never counted as nothing."""
    reserved = services.egress.reserve(profile, [item], allow_over_budget_reason=reason, what=what)
    dec = reserved.decision
    if dec is not None and dec.override_reason:
        Operation(services).audit_override(dec)
    try:
        result = await work()
    except PolicyError as exc:  # a rule refused the work before it acted (another apply's lock, ...)
        with contextlib.suppress(LoadmasterError):
            services.egress.release(item.job_id, f"{what} refused: {exc}"[:300])
        raise
    except BaseException as exc:
        with contextlib.suppress(LoadmasterError):
            services.egress.record_transfer(
                profile, item.dest_site, item.nbytes, job_id=item.job_id, note=f"{what} failed: {exc}"[:200]
            )
        raise
    nbytes = read(result)
    if nbytes:
        services.egress.record_transfer(profile, item.dest_site, nbytes, job_id=item.job_id, note=what)
    else:
        services.egress.release(item.job_id, f"{what}: nothing read")
    return result
