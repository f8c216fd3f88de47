"""StopSignals keeps one thread's noise off stderr: a worker process that dies while fetching a shared file
descriptor leaves ``multiprocessing.resource_sharer``'s thread with a ConnectionResetError (seen once in the
clean-clone suite under load: a SIGINT to the process group printed its 18-line traceback before the run's
one line). Every other thread exception still prints. The sharer's thread catches the error and calls
``sys.excepthook`` itself (CPython's ``_ResourceSharer._serve``), the path the first filter missed: the clean-clone
suite printed the 18 lines again (session 32) while only ``threading.excepthook`` was filtered."""

import sys
import threading

from oprl.backends.failure import StopSignals, is_peer_gone_in_sharer


def _raising_in(filename: str, exc: BaseException):
    namespace: dict = {}
    exec(compile("def serve(exc):\n    raise exc\n", filename, "exec"), namespace)
    return threading.Thread(target=namespace["serve"], args=(exc,))


def _run(thread: threading.Thread) -> None:
    thread.start()
    thread.join()


def test_a_reset_in_the_resource_sharer_is_quiet_and_other_thread_errors_reach_the_hook(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type.__name__))
    sharer = "/usr/lib/python3.11/multiprocessing/resource_sharer.py"
    with StopSignals():
        _run(_raising_in(sharer, ConnectionResetError(104, "Connection reset by peer")))
        assert seen == []
        _run(_raising_in(sharer, ValueError("a real bug")))  # not a connection error: passed on
        _run(_raising_in("/work/oprl/explorer.py", ConnectionResetError(104, "reset")))  # elsewhere: passed on
        assert seen == ["ValueError", "ConnectionResetError"]
    _run(_raising_in(sharer, ConnectionResetError(104, "reset")))  # after the run: the previous hook again
    assert seen == ["ValueError", "ConnectionResetError", "ConnectionResetError"]


def _catching_in(filename: str, exc: BaseException):
    """A thread shaped like ``_ResourceSharer._serve``: it catches everything and reports it to sys.excepthook."""
    namespace: dict = {"sys": sys}
    source = (
        "def serve(exc):\n    try:\n        raise exc\n    except BaseException:\n"
        "        sys.excepthook(*sys.exc_info())\n"
    )
    exec(compile(source, filename, "exec"), namespace)
    return threading.Thread(target=namespace["serve"], args=(exc,))


def test_a_reset_the_sharer_reports_to_sys_excepthook_is_quiet_too(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda exc_type, value, tb: seen.append(exc_type.__name__))
    sharer = "/usr/lib/python3.11/multiprocessing/resource_sharer.py"
    with StopSignals():
        _run(_catching_in(sharer, ConnectionResetError(104, "Connection reset by peer")))
        _run(_catching_in(sharer, EOFError()))
        assert seen == []
        _run(_catching_in(sharer, ValueError("a real bug")))
        _run(_catching_in("/work/oprl/explorer.py", ConnectionResetError(104, "reset")))
        assert seen == ["ValueError", "ConnectionResetError"]
    _run(_catching_in(sharer, ConnectionResetError(104, "reset")))  # after the run: the previous hook again
    assert seen == ["ValueError", "ConnectionResetError", "ConnectionResetError"]


def test_is_peer_gone_in_sharer_needs_both_the_type_and_the_place():
    assert not is_peer_gone_in_sharer(ConnectionResetError, None)
    assert not is_peer_gone_in_sharer(KeyError, None)
