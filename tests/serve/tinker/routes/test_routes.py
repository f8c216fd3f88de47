"""serve/tinker/routes: one router per resource (#68, #69). Each path the tinker SDK calls for the training loop is
served by the router of its resource, no path and method by two routers, and no route function is over 60 lines
(the 278-line ``create_app`` of closures they replaced). Behaviour through the SDK: tests/serve/tinker/."""

import inspect
import re
from pathlib import Path

import pytest

from oprl.serve.tinker.routes import sampling, service, training

ROUTERS = {"service": service.router, "training": training.router, "sampling": sampling.router}
RESOURCE = {
    "training": ["create_model", "forward_backward", "optim_step", "save_weights", "save_weights_for_sampler",
                 "load_weights", "get_info"],
    "sampling": ["asample", "create_sampling_session"],
    "service": ["create_session", "session_heartbeat", "retrieve_future", "get_server_capabilities", "healthz",
                "client/config"],
}  # fmt: skip


def _served() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for name, router in ROUTERS.items():
        for route in router.routes:
            for method in route.methods:
                out.setdefault((route.path, method), []).append(name)
    return out


def test_each_path_is_served_once_by_the_router_of_its_resource():
    served = _served()
    assert {key: names for key, names in served.items() if len(names) > 1} == {}
    where = {path: names[0] for (path, _), names in served.items()}
    for resource, names in RESOURCE.items():
        for name in names:
            assert where.get(f"/api/v1/{name}") == resource, name


def test_the_training_loop_paths_are_the_sdks_own():
    """The paths above are the ones the installed SDK calls (so this list cannot drift from the SDK's)."""
    tinker = pytest.importorskip("tinker")
    root = Path(tinker.__file__).parent
    text = "".join(path.read_text() for path in root.rglob("*.py"))
    called = set(re.findall(r'"(/api/v1/[a-z_/]+)"', text))
    core = {f"/api/v1/{n}" for names in RESOURCE.values() for n in names}
    assert core - called == set()


def test_no_route_function_is_over_60_lines():
    for name, router in ROUTERS.items():
        for route in router.routes:
            lines = len(inspect.getsource(route.endpoint).splitlines())
            assert lines <= 60, f"{name}: {route.path} is {lines} lines"
