"""One Tinker server per test module, on a randomly initialised tiny model (no warm start: these tests check the
protocol and the math, not what the model knows), reached by the real ``tinker`` SDK. The test modules import
these helpers from here and get the fixtures (``running``, ``service``) from ``tests/conftest.py``: a second
``conftest.py`` would be imported under the name ``conftest`` too and shadow ``tests/conftest.py`` for every test
module collected after it (``from conftest import SMALL``)."""

import os
import socket
import threading
import time

os.environ.setdefault("TINKER_TELEMETRY", "0")  # before the test module imports the SDK

TINY = "tiny-test"


def tiny_model_dir(path):
    """The embedded architecture, random weights, saved as a Hugging Face directory (instant)."""
    from oprl.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


class Running:
    """A server on a free loopback port, in a thread; ``url`` for ``TINKER_BASE_URL``."""

    def __init__(self, server):
        import uvicorn

        from oprl.serve.tinker import create_app

        self.server = server
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uvicorn = uvicorn.Server(uvicorn.Config(create_app(server), port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = ""  # the served model's directory, where the fixture serves it under its path too

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=10)


def serve(root, **options):
    """A second server on the random tiny model, started with ``build_server``'s ``options`` (those the module's
    ``running`` fixture does not set, e.g. ``stable_reinforce``); serves it as ``TINY`` and under its path."""
    from oprl.serve.tinker import build_server

    model = tiny_model_dir(root / "model")
    server = build_server(models=[f"{TINY}={model}", f"{model}={model}"], state_dir=root / "state", **options)
    up = Running(server)
    up.model_dir = model
    return up


def datum(tokens, **inputs):
    """A Tinker datum: model input ``tokens[:-1]``, targets ``tokens[1:]``, other per-position inputs as given."""
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], **inputs},
    )
