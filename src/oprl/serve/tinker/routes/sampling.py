"""The sampling clients' routes: create one (on a checkpoint path or a base model), describe it, and ``asample``
(queued for the sampler's next batch, ``Futures.submit_sample``). Sampling requests are not ordered: a retried
one is recognised by its ``(sampling_session_id, seq_id)`` (``Futures.sample_once``, the newest ``MAX_SAMPLED``
keys); one without a ``seq_id`` is never taken for another.
oprl's own route ``/api/v1/oprl/sequence_versions/{sequence_id}`` answers which weights drew each token of a
sampled sequence (the SDK's responses carry no such field)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from oprl.serve.tinker.errors import NotFound, UserError
from oprl.serve.tinker.routes.common import body_json, future, server_of
from oprl.serve.tinker.sampling import check_sampling_params, check_top_k

router = APIRouter()


@router.post("/api/v1/create_sampling_session")
async def create_sampling_session(request: Request):
    server, data = server_of(request), await body_json(request)
    session_id = data["session_id"]
    server.session(session_id, server.owner_of(request))
    sampler_id = f"{session_id}:sample:{data['sampling_session_seq_id']}"
    if data.get("model_path"):
        server.backend.path_sampler(sampler_id, session_id, data["model_path"])
    elif data.get("base_model"):
        server.backend.base_sampler(sampler_id, session_id, data["base_model"])
    else:
        raise UserError("model_path: give a model_path or a base_model")
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@router.get("/api/v1/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request):
    server = server_of(request)
    sampler = server.sampler(sampler_id, server.owner_of(request))
    return {"sampler_id": sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}


@router.post("/api/v1/asample")
async def asample(request: Request):
    server, data = server_of(request), await body_json(request)
    if data.get("sampling_session_id") is None:
        raise UserError("sampling_session_id: required (create a sampling client first)")
    sampler = server.sampler(data["sampling_session_id"], server.owner_of(request))
    check_sampling_params(data.get("sampling_params") or {})
    check_top_k(data)  # the rest (target_prompt_logprobs against the prompt) is checked with the prompt, plan()
    n = int(data.get("num_samples", 1))
    request_id = server.sample_once(sampler, data)  # a retry (same seq_id) gets the first request's id
    return future(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(n)])


@router.get("/api/v1/oprl/sequence_versions/{sequence_id}")
async def sequence_versions(sequence_id: str, request: Request):
    """Per token of a sampled sequence (``SampledSequence.sequence_id``), the optimizer-step version of the weights
    it was drawn under: one value for a snapshot sampler, rising within a sequence for an in-flight sampler whose
    model published new weights while it ran. Not part of the Tinker API; kept while the request's result is."""
    server = server_of(request)
    request_id, _, index = sequence_id.rpartition(":")
    result = server.results.get(request_id)
    if result is None or result.owner is None or server.sessions[result.owner].owner != server.owner_of(request):
        raise NotFound(f"sequence_id: no sampled sequence {sequence_id!r} of this API key (or it expired)")
    if not result.done.is_set() or result.versions is None or not index.isdigit():
        raise NotFound(f"sequence_id: {sequence_id!r} is not a finished sampled sequence")
    if int(index) >= len(result.versions):
        raise NotFound(f"sequence_id: {sequence_id!r}: its request sampled {len(result.versions)} sequences")
    return {"sequence_id": sequence_id, "versions": result.versions[int(index)]}
