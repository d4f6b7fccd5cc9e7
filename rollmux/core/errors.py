"""Error types of the core: each names what went wrong in words a user can act on."""


class RollMuxError(Exception):
    """Base of every error RollMux raises on purpose."""


class UnknownJob(RollMuxError, KeyError):
    """A job name that the cluster does not hold."""

    def __str__(self) -> str:
        return str(self.args[0])


class ResidencyExceeded(RollMuxError):
    """A job's resident state does not fit the host memory of any node of its pool."""


class PhaseOrderError(RollMuxError):
    """A job asked for (or released) a phase out of turn or out of the rollout → training order."""


class StaleEpoch(RollMuxError):
    """A call carried an epoch or grant token older than the job's current one: it came
    from an incarnation whose lease expired (a zombie), and is refused (fencing)."""


class JobExists(RollMuxError):
    """A job of that name was already accepted with another spec (names are never reused)."""


class JobEnded(RollMuxError):
    """The job is no longer live: it cannot take phases or be cancelled."""


class NoCapacity(RollMuxError):
    """The job needs more nodes of a pool than the whole cluster offers: it can never run."""


class StaleWeights(RollMuxError):
    """Weights older than the ones a role holds, or than its next rollout needs, were offered
    to it: running on them would break the on-policy guarantee."""


class WeightsDiscarded(RollMuxError):
    """A role whose weights were discarded at sleep was asked to work before they were re-sent."""


class ProblemTooLarge(RollMuxError, ValueError):
    """An exact search was asked for more jobs than it can solve in bounded time and memory."""
