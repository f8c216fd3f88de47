"""oprl.noise: vLLM's Triton and NUMA notices and Ray's token-auth notice stay off the console and land in the run's
workers.log; every other line still reaches the console."""

import logging
import os

from oprl.noise import LOG_ENV, keep_noise_out, stderr_kept

NUMA = (
    "[W1207 17:43:32.288170104 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on "
    "the NUMA nodes (0). (function init_cpu_memory_env)\n"
)


def test_a_noise_record_goes_to_workers_log_not_to_the_console(tmp_path, monkeypatch):
    log_file = tmp_path / "workers.log"
    monkeypatch.setenv(LOG_ENV, str(log_file))
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        keep_noise_out()
        keep_noise_out()  # idempotent
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("the head node is gone")  # anything else still shows
    finally:
        logger.removeHandler(handler)
    assert seen == ["the head node is gone"]
    assert log_file.read_text().startswith("WARNING ray._private.authentication.authentication_token_setup: Token")


def test_cpp_stderr_lines_are_sorted_between_workers_log_and_the_console(tmp_path, monkeypatch, capfd):
    log_file = tmp_path / "workers.log"
    log_file.write_text("a reward's print\n")
    monkeypatch.setenv(LOG_ENV, str(log_file))
    with stderr_kept(), stderr_kept():  # nested (two threads building engines): one redirection
        os.write(2, NUMA.encode())
        os.write(2, b"vLLM could not allocate the KV cache\n")
    assert capfd.readouterr().err == "vLLM could not allocate the KV cache\n"
    assert log_file.read_text() == "a reward's print\n" + NUMA + "vLLM could not allocate the KV cache\n"
    assert not list(tmp_path.glob("workers.log.*stderr"))  # the per-process scratch file is gone


def test_outside_a_run_stderr_is_untouched(monkeypatch, capfd):
    monkeypatch.delenv(LOG_ENV, raising=False)
    with stderr_kept():
        os.write(2, b"plain\n")
    assert capfd.readouterr().err == "plain\n"
