"""``oprl serve tinker [key=value ...] [--host H] [--port P] [--model NAME=PATH] [--api-key K] ...``.

``key=value`` settings are oprl's (``oprl config --help``): they shape the embedded tiny model's warm start
(``tiny`` is built by oprl's recipe on first use and cached) and ``model.device``. The SDK finds the server
through ``TINKER_BASE_URL=http://HOST:PORT`` and needs some ``TINKER_API_KEY`` (``tml-...``): on a loopback
address any key is accepted unless ``--api-key`` names the accepted ones; on any other address a key is
required.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from oprl.errors import OprlError
from oprl.serve.tinker.app import TinkerServer, create_app, is_loopback
from oprl.serve.tinker.backend import DEFAULT_MODELS, SNAPSHOT_GB, ModelTable, TinkerModels
from oprl.serve.tinker.futures import BATCH_ROWS, SAMPLE_WINDOW_S
from oprl.serve.tinker.losses import LossError, stable_reinforce_check
from oprl.serve.tinker.training import MICRO_BATCH_TOKENS


def parser() -> argparse.ArgumentParser:
    table = ", ".join(f"{name}={path}" for name, path in DEFAULT_MODELS.items())
    p = argparse.ArgumentParser(
        prog="oprl serve tinker",
        description="Serve the Tinker API (Tinker SDK 0.38, tinker-cookbook 0.6) on oprl's models and losses "
        "(docs/tinker.md).",
    )
    p.add_argument("settings", nargs="*", help="oprl settings key=value (the tiny model's warm start, model.device)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--model", action="append", default=[], metavar="NAME=PATH",
        help=f"serve base_model NAME from PATH (anything model.path takes); repeatable. Built in: {table}",
    )  # fmt: skip
    p.add_argument("--api-key", action="append", default=[], metavar="KEY", help="accepted X-API-Key; repeatable")
    p.add_argument("--state-dir", default=None, help="where save_state writes (default: a temporary directory)")
    p.add_argument("--session-timeout", type=float, default=300.0, help="seconds without heartbeat before a "
                   "session's models are freed (default 300)")  # fmt: skip
    p.add_argument("--max-body-mb", type=float, default=256.0, help="largest request body (default 256 MB)")
    p.add_argument("--sample-window-ms", type=float, default=SAMPLE_WINDOW_S * 1000, help="how long a sampler's "
                   "first queued sample request waits for others to batch with (default %(default)g ms)")  # fmt: skip
    p.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help="most sampled rows (sum of num_samples) in "
                   "one batched engine call (default %(default)d)")  # fmt: skip
    p.add_argument("--workers", choices=("threads", "processes", "ray"), default="threads", help="where models "
                   "compute: the server's own compute thread (default), a process of this machine per model, or a "
                   "Ray actor per model (docs/tinker.md#placement)")  # fmt: skip
    p.add_argument("--ray-address", default=None, help="--workers ray: the cluster to join (default: a local one)")
    p.add_argument("--gpus-per-model", type=float, default=None, help="--workers ray: GPUs each model's actor asks "
                   "for (default 1 with model.device=cuda, else 0)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads of the compute thread, or of "
                   "each model worker with --workers (default: torch's, the machine's cores)")  # fmt: skip
    p.add_argument("--micro-batch-tokens", type=int, default=MICRO_BATCH_TOKENS, help="padded tokens per "
                   "forward_backward micro-batch: bounds the activations' memory; the loss and gradient are the "
                   "same (default %(default)d)")  # fmt: skip
    p.add_argument("--snapshot-gb", type=float, default=SNAPSHOT_GB, help="GB of weight snapshots (sampling "
                   "clients of saved weights) kept per model, the newest 2 always (default %(default)g; a full "
                   "fine-tuning snapshot is the whole model)")  # fmt: skip
    p.add_argument("--overlap", action="store_true", help="sample from saved weights on a second thread (with "
                   "--threads torch threads too) while the compute thread trains: an async recipe's step then costs "
                   "about max(sampling, training), not their sum (docs/tinker.md#overlap)")  # fmt: skip
    p.add_argument("--stable-reinforce", default=None, metavar="PRESET", help="serve tinker-cookbook's default "
                   "RL loss, stable_reinforce (Tinker publishes no objective for it), as this oprl preset, e.g. "
                   "rec-oneside-nois; announced at start and in each result's metrics (default: a 400)")  # fmt: skip
    return p


def build_server(
    settings: list[str] | None = None,
    *,
    models: list[str] | None = None,
    api_keys: list[str] | None = None,
    state_dir: str | Path | None = None,
    session_timeout: float = 300.0,
    max_body_mb: float = 256.0,
    sample_window_ms: float = SAMPLE_WINDOW_S * 1000,
    batch_rows: int = BATCH_ROWS,
    workers: str = "threads",
    ray_address: str | None = None,
    gpus_per_model: float | None = None,
    threads: int | None = None,
    stable_reinforce: str | None = None,
    overlap: bool = False,
    snapshot_gb: float = SNAPSHOT_GB,
    micro_batch_tokens: int = MICRO_BATCH_TOKENS,
) -> TinkerServer:
    """The server object (``create_app(server)`` is its ASGI app); arguments as on the command line."""
    _check_options(stable_reinforce, sample_window_ms, batch_rows, threads, snapshot_gb, micro_batch_tokens)
    entries = dict(DEFAULT_MODELS)
    for item in models or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise OprlError(f"--model: {item!r} is not NAME=PATH")
        entries[name] = path
    settings = list(settings or [])
    for item in settings:
        if "=" not in item:
            raise OprlError(f"argument {item!r}: expected key=value")
    device = next((s.split("=", 1)[1] for s in settings if s.startswith("model.device=")), "cpu")
    from oprl.models.loading import resolve_device

    resolved = str(resolve_device(device))
    directory = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="oprl-tinker-"))
    table = ModelTable(entries, settings, resolved)
    if overlap and workers != "threads":
        raise OprlError("--overlap: only with --workers threads (a placed model's worker runs its requests in order)")
    if workers == "threads":
        backend = TinkerModels(
            table, directory, resolved, overlap=overlap, snapshot_gb=snapshot_gb, micro_batch_tokens=micro_batch_tokens
        )
    else:
        from oprl.serve.tinker.placement import PlacedModels, make_placement

        if gpus_per_model is None:
            gpus_per_model = 1.0 if workers == "ray" and resolved.startswith("cuda") else 0.0
        if gpus_per_model < 0:
            raise OprlError(f"--gpus-per-model: must be >= 0, got {gpus_per_model}")
        placement = make_placement(workers, ray_address=ray_address)
        backend = PlacedModels(table, directory, resolved, placement, gpus=gpus_per_model, threads=threads)
    return TinkerServer(
        backend,
        api_keys=list(api_keys or []),
        session_timeout=session_timeout,
        max_body=int(max_body_mb * 2**20),
        sample_window=sample_window_ms / 1000,
        batch_rows=batch_rows,
        threads=threads if workers == "threads" else None,  # placed: the workers compute, with their own
        stable_reinforce=stable_reinforce,
    )


def _check_options(
    stable_reinforce: str | None,
    sample_window_ms: float,
    batch_rows: int,
    threads: int | None,
    snapshot_gb: float,
    micro_batch_tokens: int,
):
    """The numeric options' ranges and the ``--stable-reinforce`` preset, each refused in one line naming it."""
    if stable_reinforce is not None:
        try:
            stable_reinforce_check(stable_reinforce)
        except LossError as exc:
            raise OprlError(str(exc)) from None
    if sample_window_ms < 0:
        raise OprlError(f"--sample-window-ms: must be >= 0, got {sample_window_ms}")
    if batch_rows < 1:
        raise OprlError(f"--batch-rows: must be >= 1, got {batch_rows}")
    if threads is not None and threads < 1:
        raise OprlError(f"--threads: must be >= 1, got {threads}")
    if snapshot_gb < 0:
        raise OprlError(f"--snapshot-gb: must be >= 0, got {snapshot_gb}")
    if micro_batch_tokens < 1:
        raise OprlError(f"--micro-batch-tokens: must be >= 1, got {micro_batch_tokens}")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "tinker":
        raise OprlError("oprl serve: name the API to serve: `oprl serve tinker --help`")
    args = parser().parse_args(argv[1:])
    if not args.api_key and not is_loopback(args.host):
        raise OprlError(f"--api-key: required when listening on {args.host} (any key is accepted on loopback only)")
    server = build_server(
        args.settings,
        models=args.model,
        api_keys=args.api_key,
        state_dir=args.state_dir,
        session_timeout=args.session_timeout,
        max_body_mb=args.max_body_mb,
        sample_window_ms=args.sample_window_ms,
        batch_rows=args.batch_rows,
        workers=args.workers,
        ray_address=args.ray_address,
        gpus_per_model=args.gpus_per_model,
        threads=args.threads,
        stable_reinforce=args.stable_reinforce,
        overlap=args.overlap,
        snapshot_gb=args.snapshot_gb,
        micro_batch_tokens=args.micro_batch_tokens,
    )
    import uvicorn

    url = f"http://{args.host}:{args.port}"
    print(f"oprl Tinker server on {url} (TINKER_BASE_URL); state in {server.backend.state_dir}")
    if server.stable_reinforce is not None:
        print(
            f"stable_reinforce: served as oprl's preset {server.stable_reinforce!r} (--stable-reinforce; Tinker "
            "publishes no objective for it), on importance_sampling's inputs; each result's metrics carry "
            f"stable_reinforce={server.stable_reinforce}:max"
        )
    try:
        uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    finally:
        server.backend.shutdown()  # placed models: their worker processes or actors
    return 0
