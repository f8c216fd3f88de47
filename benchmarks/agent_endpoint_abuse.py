"""Benchmark: what hostile or careless clients cost the agent endpoint (issue 52, items 7 and 8), as bounds.

Three measurements on one endpoint (the tiny model's tokenizer), an agent's request timed alongside each:

- **slowloris**: ``--slow`` connections that open, send a header line, then one byte every 2 s; how many the
  endpoint has closed after ``--wait`` seconds (bound: all, ``REQUEST_TIMEOUT_S`` = 10 s after they opened).
- **idle flood**: with the process's file limit (soft and hard) set to ``--nofile`` (1,024, a common default), a
  child process opens ``--idle`` idle connections (1,100); whether the endpoint still serves, and the most file
  descriptors this process held (bound: below the limit; the endpoint keeps at most half of what is free).
- **empty messages**: one chat request of ``--messages`` empty messages (100,000: 3.15 MiB, under the 4 MiB
  body limit) against a 2,048-position context; its latency, the latency of another session's small request
  sent meanwhile (the event loop stays free), and the growth of this process's peak RSS.

    flock /tmp/oprl-bench.lock nice -n 5 python benchmarks/agent_endpoint_abuse.py [--json results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import httpx

from oprl.episodes.endpoint.server import Endpoint, Served
from oprl.episodes.endpoint.sessions import Session
from oprl.models.tiny import build_tokenizer
from oprl.models.truncation import Sampling

CHILD = """
import socket, sys, time, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(int(sys.argv[3])):
    try:
        held.append(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(float(sys.argv[4]))
"""


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def accepted_within(endpoint: Endpoint, session_id: str, limit: float = 30.0) -> float | None:
    """Seconds until a one-message chat request of session ``session_id`` waits in the endpoint's queue (no
    engine runs here: it is never answered; what is timed is that the endpoint read and accepted it); None when
    it was not accepted within ``limit`` seconds."""
    session = endpoint.sessions[session_id]
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {endpoint.token}"}
    url = endpoint.base_url(session_id) + "/chat/completions"

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url, json=body, headers=headers, timeout=limit)

    start = time.perf_counter()
    threading.Thread(target=send, daemon=True).start()
    while time.perf_counter() - start < limit:
        if any(p.session is session for p in endpoint.pending):
            return time.perf_counter() - start
        time.sleep(0.001)
    return None


def slowloris(endpoint: Endpoint, count: int, wait: float) -> dict:
    sockets = [socket.create_connection((endpoint.host, endpoint.port)) for _ in range(count)]
    for s in sockets:
        s.sendall(b"POST /s/x/v1/chat/completions HTTP/1.1\r\n")
        s.setblocking(False)
    start, closed = time.perf_counter(), set()
    while time.perf_counter() - start < wait:
        for k, s in enumerate(sockets):
            if k in closed:
                continue
            try:
                if s.recv(1) == b"":
                    closed.add(k)
            except BlockingIOError:
                try:
                    s.sendall(b"X")  # one byte of a header, every 2 s
                except OSError:
                    closed.add(k)
            except OSError:
                closed.add(k)
        time.sleep(2.0)
    for s in sockets:
        s.close()
    return {"connections": count, "closed": len(closed), "after_s": wait}


def idle_flood(endpoint: Endpoint, count: int, nofile: int) -> dict:
    peak = [open_files()]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], open_files())
            except OSError:  # out of files: listing /proc/self/fd needs one
                peak[0] = nofile
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, endpoint.host, str(endpoint.port), str(count), "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    opened = int(child.stdout.readline() or 0)  # type: ignore[union-attr]
    session = Session(0, endpoint.tokenizer, max_turns=4, max_tokens=400)
    session_id = endpoint.open(session)
    seconds = accepted_within(endpoint, session_id, limit=4.0)
    child.wait()
    stop.set()
    watcher.join()
    endpoint.close(session_id)
    return {
        "connections_opened_by_the_client": opened,
        "nofile_soft_limit": nofile,
        "endpoint_max_connections": getattr(getattr(endpoint, "limits", None), "bound", None),
        "peak_open_files": peak[0],
        "agent_request_accepted_s": None if seconds is None else round(seconds, 3),
    }


def empty_messages(endpoint: Endpoint, count: int) -> dict:
    endpoint.served = Served(Sampling(), 16, context=2048)
    flood, other = (Session(k, endpoint.tokenizer, max_turns=4, max_tokens=400) for k in range(2))
    for s in (flood, other):
        s.token_chars, s.message_tokens = endpoint.token_chars, getattr(endpoint, "message_tokens", 0)
    flood_id, other_id = endpoint.open(flood), endpoint.open(other)
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": ""}] * count}).encode()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result: dict = {}

    def send() -> None:
        start = time.perf_counter()
        response = httpx.post(
            endpoint.base_url(flood_id) + "/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {endpoint.token}", "Content-Type": "application/json"},
            timeout=60,
        )
        result["flood_status"], result["flood_s"] = response.status_code, round(time.perf_counter() - start, 3)
        result["flood_message"] = response.json()["error"]["message"][:120]

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.05)  # the flood is being read or parsed
    seconds = accepted_within(endpoint, other_id)
    result["other_request_accepted_s"] = None if seconds is None else round(seconds, 3)
    thread.join()
    result["body_mib"] = round(len(body) / 2**20, 2)
    result["peak_rss_growth_mb"] = round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024, 1)
    endpoint.close(flood_id)
    endpoint.close(other_id)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--wait", type=float, default=14.0)
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the whole run under the limit, as a run would be;
    limit = min(args.nofile, hard)  # hard too: the endpoint raises the soft limit to the hard one (#67)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    endpoint = Endpoint(build_tokenizer())
    results = {
        "empty_messages": empty_messages(endpoint, args.messages),
        "slowloris": slowloris(endpoint, args.slow, args.wait),
        "idle_flood": idle_flood(endpoint, args.idle, args.nofile),
    }
    endpoint.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
