"""Benchmark: how long one agent's huge requests delay another agent's small one (issue 67, item 8), as a bound.

One endpoint (the tiny model's tokenizer, a 2,048-position context, a responder thread that answers every
accepted request at once in place of the engine). A small chat request (one user message, a session of its
own each time) is sent every ``--every`` seconds and timed from send to reply, first alone (``--probes`` of
them: the baseline), then while a separate client process sends ``--flood`` concurrent chat requests of
``--messages`` empty messages each (100,000: 3.15 MiB, under the 4 MiB body limit), one per session, all
refused with a 400 (past the context). Reported: the small request's latency alone and during the flood
(p50, p90, max), and each flood request's time to its 400.

``--before SRC`` times another source tree too (``git archive COMMIT src | tar -x -C DIR``, then ``DIR/src``),
alternating with this one ``--rounds`` times, each configuration in a fresh process, so the two are compared
on the same machine under the same load.

    git archive fc88471 src | tar -x -C /tmp/before
    flock /tmp/oprl-bench.lock nice -n 5 python benchmarks/agent_endpoint_parsing.py --before /tmp/before/src \\
        --before-label fc88471 --json benchmarks/results/agent_endpoint_parsing.json

Also reported: the CPU seconds of one ``json.loads`` of the flood's body, the one step of a huge request that
holds the interpreter throughout (a small request may wait that long at each hand-off between threads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

FLOOD = """
import json, sys, threading, time, httpx
url, token, sessions, count = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": ""}] * count}).encode()
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
results = [None] * len(sessions)
go = threading.Event()
def send(k):
    go.wait()
    start = time.perf_counter()
    try:
        r = httpx.post(url.format(sessions[k]), content=body, headers=headers, timeout=600)
        results[k] = [r.status_code, time.perf_counter() - start]
    except httpx.HTTPError as exc:
        results[k] = [type(exc).__name__, time.perf_counter() - start]
threads = [threading.Thread(target=send, args=(k,)) for k in range(len(sessions))]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
go.set()
for t in threads:
    t.join()
print(json.dumps(results), flush=True)
"""


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)]  # noqa: E731
    return {
        "n": len(values),
        "p50_s": round(statistics.median(ordered), 4),
        "p90_s": round(pick(0.9), 4),
        "max_s": round(ordered[-1], 4),
    }


def child(args) -> dict:
    """One configuration, in this process: the endpoint, the responder, the probes, the flood's process."""
    import httpx

    from oprl.episodes.endpoint.server import Endpoint, Served
    from oprl.episodes.endpoint.sessions import Choice, Session
    from oprl.models.tiny import build_tokenizer
    from oprl.models.truncation import Sampling

    tokenizer = build_tokenizer()
    endpoint = Endpoint(tokenizer)
    endpoint.served = Served(Sampling(), 16, context=2048)
    stop = threading.Event()

    def respond() -> None:  # the engine's place: every accepted request answered at once, one EOS token
        while not stop.is_set():
            for p in endpoint.take(1, timeout=0.01):
                choices = [Choice(ids=[tokenizer.eos_token_id], logprobs=[0.0], text="", ended=True)]
                choices[0].message = {"role": "assistant", "content": ""}
                with endpoint.lock:
                    p.session.record(choices, p.segment)
                p.future.set_result(choices)

    threading.Thread(target=respond, daemon=True).start()

    def session() -> str:
        s = Session(0, tokenizer, max_turns=1000, max_tokens=100_000)
        s.token_chars, s.message_tokens = endpoint.token_chars, getattr(endpoint, "message_tokens", 0)
        return endpoint.open(s)

    headers = {"Authorization": f"Bearer {endpoint.token}"}
    small = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    client = httpx.Client(timeout=600)

    def probe() -> float:
        start = time.perf_counter()
        r = client.post(endpoint.base_url(session()) + "/chat/completions", json=small, headers=headers)
        assert r.status_code == 200, r.text
        return time.perf_counter() - start

    probe()  # warm
    flood_body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": ""}] * args.messages})
    cpu = time.thread_time()
    json.loads(flood_body)  # the one step of a huge request that holds the interpreter throughout
    loads_cpu = time.thread_time() - cpu
    alone = []
    for _ in range(args.probes):
        alone.append(probe())
        time.sleep(args.every)
    flooders = [session() for _ in range(args.flood)]
    url = f"http://{endpoint.host}:{endpoint.port}/s/{{}}/v1/chat/completions"
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, url, endpoint.token, ",".join(flooders), str(args.messages)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flood.stdout is not None and flood.stdin is not None
    assert flood.stdout.readline().strip() == "ready"
    flood.stdin.write("\n")
    flood.stdin.flush()
    start, during = time.perf_counter(), []
    while flood.poll() is None:
        during.append(probe())
        time.sleep(args.every)
    wall = time.perf_counter() - start
    answers = json.loads(flood.stdout.readline())
    stop.set()
    endpoint.stop()
    return {
        "small_alone": percentiles(alone),
        "small_during_flood": percentiles(during),
        "flood_statuses": sorted({str(a[0]) for a in answers}),
        "flood_request_s": percentiles([a[1] for a in answers]),
        "flood_wall_s": round(wall, 3),
        "json_loads_cpu_s": round(loads_cpu, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=12)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.05)
    parser.add_argument("--before", help="another source tree's src/ to time alongside this one")
    parser.add_argument("--before-label", default="before", help="what --before is (a commit)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    configs = {f"after ({head.strip()})": str(root / "src")}
    configs |= {f"before ({args.before_label})": args.before} if args.before else {}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, src in configs.items():
            env = dict(os.environ, PYTHONPATH=src)
            command = [sys.executable, __file__, "--child", *sys.argv[1:]]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(name, runs[name][-1], flush=True)
    result = {
        "what": "another session's one-message chat request (send to reply) while N concurrent requests of M empty "
        "messages each, one per session, are refused past a 2,048-position context",
        "flood": args.flood,
        "messages": args.messages,
        "cpu": "2-core AMD EPYC (avx512_bf16, no AMX), shared and loaded by other jobs",
        "load_average_1m_at_end": os.getloadavg()[0],
        "runs": runs,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
