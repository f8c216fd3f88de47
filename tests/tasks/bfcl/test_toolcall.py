"""The tool-call reward on hand-written cases: every format rule, BFCL's acceptable-value lists, parallel calls
in any order, and hostile outputs scored 0 inside the timed reward process."""

import json
import os
import signal
import time

import pytest

from oprl.tasks.bfcl.toolcall import (
    MAX_DEPTH,
    MAX_RESPONSE_CHARS,
    calls_credit,
    calls_match,
    check_format,
    parse_calls,
    reference_response,
    tool_call_blocks,
    tool_call_rewards,
    value_matches,
    verdict,
)
from oprl.tasks.rewards.verify import VerifierPool

TRIANGLE = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
SPOTIFY = [
    {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
    {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}},
]


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def think(*calls: str, thought: str = "easy") -> str:
    return f"<think>{thought}</think>\n" + "\n".join(calls)


GOOD = call("calculate_triangle_area", base=10, height=5)

# (case, ground truth, response, verdict)
TABLE = [
    ("required only", TRIANGLE, think(GOOD), "match"),
    ("optional acceptable", TRIANGLE, think(call("calculate_triangle_area", base=10, height=5, unit="units")), "match"),
    (
        "optional explicitly empty",
        TRIANGLE,
        think(call("calculate_triangle_area", base=10, height=5, unit="")),
        "match",
    ),
    ("optional wrong", TRIANGLE, think(call("calculate_triangle_area", base=10, height=5, unit="cm")), "mismatch"),
    ("required missing", TRIANGLE, think(call("calculate_triangle_area", base=10)), "mismatch"),
    ("wrong value", TRIANGLE, think(call("calculate_triangle_area", base=10, height=6)), "mismatch"),
    ("unknown argument", TRIANGLE, think(call("calculate_triangle_area", base=10, height=5, color="red")), "mismatch"),
    ("wrong name", TRIANGLE, think(call("triangle_area", base=10, height=5)), "mismatch"),
    ("string for integer", TRIANGLE, think(call("calculate_triangle_area", base="10", height=5)), "mismatch"),
    ("float for integer", TRIANGLE, think(call("calculate_triangle_area", base=10.0, height=5)), "mismatch"),
    ("extra call", TRIANGLE, think(GOOD, GOOD), "mismatch"),
    ("no think", TRIANGLE, GOOD, "malformed"),
    ("two think pairs", TRIANGLE, "<think>a</think><think>b</think>" + GOOD, "malformed"),
    ("think reversed", TRIANGLE, "</think>a<think>" + GOOD, "malformed"),
    ("think closes after the call", TRIANGLE, "<think>a" + GOOD + "</think>", "malformed"),
    ("no call", TRIANGLE, "<think>a</think> the area is 25", "malformed"),
    (
        "invalid json",
        TRIANGLE,
        think('<tool_call>{"name": "calculate_triangle_area", "arguments": {base: 10}}</tool_call>'),
        "malformed",
    ),
    ("unclosed block", TRIANGLE, think(GOOD[: -len("</tool_call>")]), "malformed"),
    ("nested block", TRIANGLE, think("<tool_call>" + GOOD + "</tool_call>"), "malformed"),
    ("stray closing tag", TRIANGLE, think("</tool_call>" + GOOD), "malformed"),
    ("arguments not an object", TRIANGLE, think('<tool_call>{"name": "f", "arguments": [1]}</tool_call>'), "malformed"),
    ("unexpected key", TRIANGLE, think('<tool_call>{"name": "f", "arguments": {}, "x": 1}</tool_call>'), "malformed"),
    (
        "parallel in order",
        SPOTIFY,
        think(
            call("spotify.play", artist="Taylor Swift", duration=20),
            call("spotify.play", artist="Maroon 5", duration=15),
        ),
        "match",
    ),
    (
        "parallel reversed",
        SPOTIFY,
        think(
            call("spotify.play", artist="Maroon 5", duration=15),
            call("spotify.play", artist="Taylor Swift", duration=20),
        ),
        "match",
    ),
    (
        "parallel as one list",
        SPOTIFY,
        think(
            "<tool_call>"
            + json.dumps(
                [
                    {"name": "spotify.play", "arguments": {"artist": "Maroon 5", "duration": 15}},
                    {"name": "spotify.play", "arguments": {"artist": "Taylor Swift", "duration": 20}},
                ]
            )
            + "</tool_call>"
        ),
        "match",
    ),
    (
        "parallel, values swapped across calls",
        SPOTIFY,
        think(
            call("spotify.play", artist="Maroon 5", duration=20),
            call("spotify.play", artist="Taylor Swift", duration=15),
        ),
        "mismatch",
    ),
    ("parallel, one missing", SPOTIFY, think(call("spotify.play", artist="Maroon 5", duration=15)), "mismatch"),
    (
        "parallel, same call twice",
        SPOTIFY,
        think(
            call("spotify.play", artist="Maroon 5", duration=15), call("spotify.play", artist="Maroon 5", duration=15)
        ),
        "mismatch",
    ),
    (
        "string normalisation",
        SPOTIFY,
        think(
            call("spotify.play", artist="taylor-swift", duration=20),
            call("spotify.play", artist="MAROON 5", duration=15),
        ),
        "match",
    ),
]


@pytest.mark.parametrize("case,truth,response,expected", TABLE, ids=[row[0] for row in TABLE])
def test_verdicts(case, truth, response, expected):
    assert verdict(json.dumps(truth), response) == expected


def test_think_rules_optional():
    assert verdict(json.dumps(TRIANGLE), GOOD, think=False) == "match"
    assert verdict(json.dumps(TRIANGLE), "</think>" + GOOD, think=False) == "match"


@pytest.mark.parametrize(
    "value,acceptable,expected",
    [
        (5, 5.0, True),
        (5.0, 5, False),
        (True, True, True),
        (1, True, False),
        (True, 1, False),
        ([1, 2], [1, 2], True),
        ([2, 1], [1, 2], False),
        ("New York, NY", "new york ny", True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1, "b": 2}, {"a": 1}, False),
        ({"city": "Paris"}, {"city": ["paris"], "zip": [""]}, True),
        ({"zip": "1"}, {"city": ["paris"], "zip": [""]}, False),
        (None, None, True),
        (None, "", False),
    ],
)
def test_value_matches(value, acceptable, expected):
    assert value_matches(value, acceptable) is expected


def test_blocks_and_matching_primitives():
    assert tool_call_blocks("a <tool_call>x</tool_call> b <tool_call>y</tool_call>") == ["x", "y"]
    assert tool_call_blocks("nothing") == []
    assert parse_calls("nothing") is None
    assert check_format(think(GOOD)) == [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}]
    # Greedy pairing would fail here: call 0 fits both, call 1 only the first; a matching exists.
    loose = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    assert calls_match([{"name": "f", "arguments": {"x": 1}}, {"name": "f", "arguments": {"x": 2}}], loose)


def test_reference_response_is_a_minimal_correct_call():
    text = reference_response(TRIANGLE)
    assert verdict(json.dumps(TRIANGLE), text) == "match"
    assert text == (
        "<think>The request is answered by calling calculate_triangle_area with arguments from the question.</think>"
        '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}</tool_call>'
    )  # the optional unit (its list holds "") is left out
    assert verdict(json.dumps(SPOTIFY), reference_response(SPOTIFY)) == "match"  # parallel: one block per call
    assert reference_response(SPOTIFY, think=False).count("<tool_call>") == 2
    # Nested specs (a dict argument, and dicts inside a list argument) resolve key by key; null is a value.
    nested = [
        {
            "f": {
                "where": [{"city": ["Paris", "Paris, France"], "zip": ["", "75001"]}],
                "rows": [[{"x": [1.5], "y": [2]}]],
                "start": [None],
            }
        }
    ]
    calls = check_format(reference_response(nested))
    assert calls == [
        {"name": "f", "arguments": {"where": {"city": "Paris"}, "rows": [{"x": 1.5, "y": 2}], "start": None}}
    ]
    assert verdict(json.dumps(nested), reference_response(nested)) == "match"
    with pytest.raises(ValueError, match="no acceptable value"):  # BFCL rows no call can match
        reference_response([{"record": {"acc_routing_start": []}}])


def test_hostile_outputs_are_malformed_quickly():
    deep = think("<tool_call>" + '{"name": "f", "arguments": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}</tool_call>")
    huge = think(call("calculate_triangle_area", base=10, height=5, unit="x" * MAX_RESPONSE_CHARS))
    big_int = think('<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>")
    just_deep = think(
        "<tool_call>"
        + '{"name": "f", "arguments": {"x": '
        + "[" * (MAX_DEPTH + 1)
        + "]" * (MAX_DEPTH + 1)
        + "}}</tool_call>"
    )
    start = time.perf_counter()
    for response in (deep, huge, big_int, just_deep):
        assert verdict(json.dumps(TRIANGLE), response) == "malformed"
    assert time.perf_counter() - start < 1.0


def test_rewards_in_timed_worker():
    pool = VerifierPool(processes=1, timeout=5.0, kind="tool-call")
    try:
        deep = "<think>a</think><tool_call>" + "[" * 1_000_000 + "</tool_call>"
        rewards = tool_call_rewards(
            pool,
            [json.dumps(TRIANGLE)] * 4,
            [think(GOOD), think(call("calculate_triangle_area", base=1, height=5)), GOOD, deep],
        )
        assert [r.total for r in rewards] == [1.0, 0.0, 0.0, 0.0]
        assert [r.components["correct"] for r in rewards] == [1.0, 0.0, 0.0, 0.0]
        assert [r.components["format"] for r in rewards] == [1.0, 1.0, 0.0, 0.0]
        assert pool.counts["malformed"] == 2 and pool.counts["match"] == 1
        no_think = tool_call_rewards(pool, [json.dumps(TRIANGLE)], [GOOD], think=False)
        assert no_think[0].total == 1.0
        # format-aware: correct + b if well formed else - b; the components (accuracy) do not move
        aware = tool_call_rewards(
            pool,
            [json.dumps(TRIANGLE)] * 3,
            [think(GOOD), think(call("calculate_triangle_area", base=1, height=5)), GOOD],
            format_bonus=0.2,
        )
        assert [r.total for r in aware] == [1.2, 0.2, -0.2]
        assert [r.components["correct"] for r in aware] == [1.0, 0.0, 0.0]
    finally:
        pool.close()


# (case, ground truth, calls, credit): (1 + key score + value score) / 3 per call, over max(|calls|, |truth|)
CREDIT = [
    ("a match", TRIANGLE, [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}], 1.0),
    ("wrong name", TRIANGLE, [{"name": "triangle_area", "arguments": {"base": 10, "height": 5}}], 0.0),
    # K = {base, height}: both keys known (1), one value right (1/2)
    (
        "one wrong value",
        TRIANGLE,
        [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 6}}],
        2.5 / 3,
    ),
    # K = {base, height}: one key passed (1/2), its value right (1/2)
    ("required missing", TRIANGLE, [{"name": "calculate_triangle_area", "arguments": {"base": 10}}], 2 / 3),
    # K = {base, height, color}: 2 of 3 keys known, 2 of 3 values right
    (
        "unknown argument",
        TRIANGLE,
        [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "color": "red"}}],
        (1 + 2 / 3 + 2 / 3) / 3,
    ),
    # the optional unit is a known key with an unacceptable value
    (
        "optional wrong",
        TRIANGLE,
        [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "cm"}}],
        (1 + 1 + 2 / 3) / 3,
    ),
    # "" is a value only where the ground truth lists it: for a required argument it is wrong
    (
        "empty for required",
        TRIANGLE,
        [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": ""}}],
        2.5 / 3,
    ),
    # an extra copy of the right call: 1 for the pair, 0 for the extra, over max(2, 1)
    ("extra call", TRIANGLE, [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}] * 2, 0.5),
    # parallel, in reverse order: the best pairing finds both (a match)
    (
        "parallel reversed",
        SPOTIFY,
        [
            {"name": "spotify.play", "arguments": {"artist": "Maroon 5", "duration": 15}},
            {"name": "spotify.play", "arguments": {"artist": "Taylor Swift", "duration": 20}},
        ],
        1.0,
    ),
    # one of two parallel calls, right: half the set
    ("one of two", SPOTIFY, [{"name": "spotify.play", "arguments": {"artist": "Maroon 5", "duration": 15}}], 0.5),
    # both calls, one with a wrong duration: (1 + 2.5/3) / 2
    (
        "parallel one wrong value",
        SPOTIFY,
        [
            {"name": "spotify.play", "arguments": {"artist": "Taylor Swift", "duration": 20}},
            {"name": "spotify.play", "arguments": {"artist": "Maroon 5", "duration": 16}},
        ],
        (1 + 2.5 / 3) / 2,
    ),
]


@pytest.mark.parametrize("case, truth, calls, credit", CREDIT, ids=[c[0] for c in CREDIT])
def test_partial_credit_closed_form(case, truth, calls, credit):
    assert calls_credit(calls, truth) == pytest.approx(credit)
    assert (calls_credit(calls, truth) == 1.0) is calls_match(calls, truth)  # 1 exactly for a match


@pytest.mark.parametrize("case, truth, response, expected", TABLE, ids=[c[0] for c in TABLE])
def test_partial_credit_is_1_exactly_for_a_match(case, truth, response, expected):
    calls = check_format(response)
    if calls is not None:
        assert 0.0 <= calls_credit(calls, truth) <= 1.0
        assert (calls_credit(calls, truth) == 1.0) is (expected == "match"), case


def test_partial_credit_reward_ranks_wrong_calls_and_keeps_accuracy():
    """total = correct + format term + w * credit of a well-formed wrong call; ``correct`` (accuracy) and
    ``format`` do not move, ``credit`` is logged; a correct call still beats every wrong one."""
    pool = VerifierPool(processes=1, timeout=5.0, kind="tool-call")
    try:
        responses = [
            think(GOOD),
            think(call("calculate_triangle_area", base=10, height=6)),  # credit 2.5/3
            think(call("calculate_triangle_area", base=10)),  # credit 2/3
            think(call("triangle_area", base=10, height=5)),  # credit 0
            GOOD,  # malformed (no think): no credit
        ]
        rewards = tool_call_rewards(pool, [json.dumps(TRIANGLE)] * 5, responses, format_bonus=0.1, partial_credit=0.5)
        assert [r.total for r in rewards] == pytest.approx([1.1, 0.1 + 0.5 * 2.5 / 3, 0.1 + 0.5 * 2 / 3, 0.1, -0.1])
        assert [r.components["correct"] for r in rewards] == [1.0, 0.0, 0.0, 0.0, 0.0]
        assert [r.components["format"] for r in rewards] == [1.0, 1.0, 1.0, 1.0, 0.0]
        assert [r.components["credit"] for r in rewards] == pytest.approx([1.0, 2.5 / 3, 2 / 3, 0.0, 0.0])
        plain = tool_call_rewards(pool, [json.dumps(TRIANGLE)] * 5, responses)  # cached verdicts, w = 0
        assert [r.total for r in plain] == [1.0, 0.0, 0.0, 0.0, 0.0]
    finally:
        pool.close()


def test_worker_timeout_scores_zero():
    """A worker that does not answer within the timeout is killed and replaced; the answer scores 0, flagged.
    The worker is stopped (SIGSTOP) so that it cannot answer however loaded the machine is; a tiny timeout
    alone races with a fast worker whose reply is already waiting when the parent wakes up."""
    pool = VerifierPool(processes=1, timeout=5.0, kind="tool-call")
    try:
        (warm,) = tool_call_rewards(pool, [json.dumps(TRIANGLE)], [think(GOOD)])  # the worker is up
        assert warm.total == 1.0
        (worker,) = pool._processes
        os.kill(worker.process.pid, signal.SIGSTOP)
        pool.timeout = 0.5
        rewards = tool_call_rewards(pool, [json.dumps(TRIANGLE)], [think(call("calculate_triangle_area", base=10))])
        assert rewards[0].total == 0.0 and rewards[0].components["verify_timeout"] == 1.0
        assert pool.counts["timeout"] == 1
        pool.timeout = 5.0
        (after,) = tool_call_rewards(pool, [json.dumps(TRIANGLE)], [think(GOOD)])  # a fresh worker answers
        assert after.total == 1.0 and pool._processes[0] is not worker
    finally:
        pool.close()
