"""Which backend a run gets: ``make_backend`` reads ``config.backend`` and ``runtime.workers`` and builds the local
(threads or processes) or the Ray backend. Above ``base``, ``local`` and ``ray_backend`` (which subclass
``base.Backend``), so that no module of the package imports one that imports it back."""

from __future__ import annotations

from oprl.backends import faults
from oprl.backends.base import Backend
from oprl.config import RunConfig
from oprl.errors import OprlError


def make_backend(config: RunConfig, plan: faults.FaultPlan | None = None) -> Backend:
    """The backend ``config.backend`` names (Ray is imported only when chosen); ``plan``: the run's
    ``OPRL_FAULT`` faults, kept across the backends of a run that restarts its trainer (each fires once)."""
    plan = plan if plan is not None else faults.FaultPlan.from_environment()
    engines = [f.worker.replace(" ", ":") for f in plan.faults if f.kind == faults.ENGINE]
    if engines and not config.rollout.engine_process:
        raise OprlError(
            f"{faults.VARIABLE}: {engines[0]} kills a vLLM engine's own process: it needs rollout.engine=vllm "
            "rollout.engine_process=true"
        )
    if config.backend == "ray":
        from oprl.backends.ray_backend import RayBackend

        # The teacher and the judge are workers too.
        workers = config.runtime.explorers + 1 + (config.teacher.path is not None) + (config.judge.path is not None)
        return RayBackend(
            address=config.runtime.ray_address,
            num_cpus=config.runtime.ray_num_cpus,
            workers=workers,
            restarts=config.runtime.max_restarts > 0,
            plan=plan,
        )
    from oprl.backends.local import LocalBackend

    if config.runtime.workers == "threads" and plan:
        raise OprlError(f"{faults.VARIABLE} kills worker processes: it needs runtime.workers=processes or backend=ray")
    return LocalBackend(config.runtime.workers, plan)
