"""A call made after an actor was stopped fails at once instead of waiting forever.

Found by the kill -9-of-a-rank test: the sharded trainer stopped its rank actors when rank 1 died, but an
evaluation the driver had already queued then called the stopped ranks; their calls were queued behind the
end marker, nobody ran or failed them, and the run never exited."""

import contextlib
import threading
from concurrent.futures import CancelledError

import pytest

from oprl.backends.local import LocalActor
from oprl.backends.processes import ProcessActor


class Echo:
    def echo(self, value):
        return value


@pytest.mark.parametrize("actor_class", [LocalActor, ProcessActor], ids=["thread", "process"])
def test_a_call_after_stop_fails_at_once(actor_class):
    actor = actor_class("echo", Echo, (), 1)
    assert actor.call("echo", 3).result(timeout=60) == 3
    actor.stop()
    late = actor.call("echo", 4)
    with pytest.raises(CancelledError, match="stopped before echo was called"):
        late.result(timeout=5)
    actor.join(15)


def test_calls_racing_stop_each_end():
    """Calls from several threads while another stops the actor: every future ends (a result or an error)."""
    actor = LocalActor("echo", Echo, (), 1)
    futures, go = [], threading.Event()

    def caller():
        go.wait()
        futures.extend(actor.call("echo", i) for i in range(200))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    go.set()
    actor.stop()
    for t in threads:
        t.join()
    for future in futures:  # a result, or CancelledError; a future nobody ends would time out here
        with contextlib.suppress(CancelledError):
            future.result(timeout=10)
    actor.join(15)
