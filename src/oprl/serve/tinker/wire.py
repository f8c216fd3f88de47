"""The bytes on the wire: the protobuf bodies the Tinker SDK (0.38) sends and expects, to and from plain data.

The SDK sends ``forward_backward`` as a ``tinker_public_pb2.ForwardBackwardRequest`` (``Content-Type:
application/x-protobuf``, zstd-compressed when the server's client config says ``proto_compress_fwdbwd``), and
reads ``ForwardBackwardOutput`` and ``SampleResponse`` results only as protobuf (``PROTO_SUPPORTED_TYPES`` in
``tinker.proto.response_conv``): a JSON body for them is refused by the SDK. Every other request and result
is JSON. Tokens travel as int32 bytes, tensors as raw little-endian bytes with a dtype enum and a shape.

Decoding errors raise ``WireError`` naming the field (``data[3].loss_fn_inputs.advantages``), which the app
answers with HTTP 400. The plain data on this side (``records.py``) is what the backend computes on and answers
with: only this module imports the SDK's protobuf classes.
"""

from __future__ import annotations

import math

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from oprl.serve.tinker.errors import WireError  # raised here; app.py and futures.py name it wire.WireError
from oprl.serve.tinker.records import Datum, ForwardBackward, ForwardOutput, Sampled, Target

_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def decode_forward_backward(body: bytes) -> ForwardBackward:
    """A ``ForwardBackwardRequest`` protobuf body as plain data (``loss_fn_config_v2`` preferred: it holds
    strings too; the SDK writes both maps)."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise WireError(f"body: not a ForwardBackwardRequest protobuf ({type(exc).__name__})") from None
    config: dict[str, float | str] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [_datum(d, f"data[{i}]") for i, d in enumerate(message.data)]
    return ForwardBackward(message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data)


def _datum(message, where: str) -> Datum:
    tokens: list[int] = []
    for j, chunk in enumerate(message.model_input):
        if chunk.WhichOneof("chunk") not in (None, "encoded_text"):
            raise WireError(f"{where}.model_input.chunks[{j}]: only text chunks are served (no image or audio)")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    inputs = {name: tensor(t, f"{where}.loss_fn_inputs.{name}") for name, t in message.loss_fn_inputs.items()}
    return Datum(tokens, inputs)


def tensor(message, where: str) -> np.ndarray:
    """A dense ``Tensor`` as a numpy array of its shape (sparse CSR tensors are refused)."""
    if message.HasField("sparse_csr"):
        raise WireError(f"{where}: sparse tensors are not served; send it dense")
    dtype = _DTYPES.get(message.dtype)
    if dtype is None:
        raise WireError(f"{where}: dtype {message.dtype} is not float32 or int64")
    values = np.frombuffer(message.dense, dtype=dtype)
    shape = list(message.shape)
    if shape and math.prod(shape) != values.size:
        raise WireError(f"{where}: shape {shape} does not hold its {values.size} values")
    return values.reshape(shape) if shape else values


def encode_forward_backward_output(result: ForwardOutput) -> bytes:
    """``ForwardBackwardOutput``: one ``ArrayRecord`` whose fields batch every datum's 1-D float32 arrays
    (byte offsets delimit the datums), plus the metrics (keys ``name:reduction``, the SDK folds chunks by it)."""
    outputs = result.outputs
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    message.metrics.update(result.metrics)
    if outputs:
        record = message.loss_fn_outputs.add(num_datums=len(outputs))
        for name in outputs[0]:
            arrays = [np.ascontiguousarray(o[name], dtype=np.float32).reshape(-1) for o in outputs]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
            batched = record.fields[name]
            batched.data = b"".join(a.tobytes() for a in arrays)
            batched.offsets = offsets.tobytes()
            batched.dtype = pb.DTYPE_FLOAT32
    return message.SerializeToString()


MASK_LOGPROB = -99999.0
"""The SDK's empty top-K entry (``tinker.types.topk_logprobs.MASK_LOGPROB``, with token id 0): a row of them
reads as None, trailing ones are dropped."""


def encode_sample_response(sampled: Sampled) -> bytes:
    """``SampleResponse``: tokens as int32, log-probs as float32; prompt log-probs with NaN where there is none
    (position 0, or before ``prompt_logprobs_last_n``), which the SDK reads as None; top-K as ``TopkLogprobs``
    (length, k) matrices, each ``-inf`` entry (no mass: outside the kept set, or no row) as the SDK's empty
    sentinel; ``target_prompt_logprobs`` as a float32 ``Tensor`` in the request's layout (dense or CSR)."""
    message = pb.SampleResponse()
    for s in sampled.sequences:
        sequence = message.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes(),
        )
        if s.top_ids is not None and s.top_logprobs is not None:
            _topk(sequence.topk_sampled_logprobs, s.top_ids, s.top_logprobs)
    if sampled.prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(sampled.prompt_logprobs, dtype=np.float32).tobytes()
    if sampled.topk_prompt is not None:
        _topk(message.topk_prompt_logprobs, *sampled.topk_prompt)
    if sampled.target is not None:
        _target(message.target_prompt_logprobs, sampled.target)
    return message.SerializeToString()


def _topk(message, ids, logprobs) -> None:
    """Fill a ``TopkLogprobs``: (length, k) int32 ids and float32 log-probs, ``-inf`` entries as the sentinel."""
    values = np.asarray(logprobs, dtype=np.float32)
    tokens = np.asarray(ids, dtype=np.int32)
    k = values.shape[1] if values.ndim == 2 else 0
    values, tokens = values.reshape(-1, k), tokens.reshape(-1, k)
    empty = np.isneginf(values)
    values, tokens = np.where(empty, np.float32(MASK_LOGPROB), values), np.where(empty, 0, tokens)
    message.length, message.k = values.shape[0], k
    message.token_ids = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    message.logprobs = np.ascontiguousarray(values, dtype=np.float32).tobytes()


def _target(message, target: Target) -> None:
    """Fill a float32 ``Tensor`` with a ``Target``'s log-probs, in the layout its request came in."""
    assert target.logprobs is not None  # scored by sampling._prompt_side before it is answered
    message.dtype = pb.DTYPE_FLOAT32
    message.shape.extend(target.shape)
    values = np.ascontiguousarray(target.logprobs, dtype=np.float32).tobytes()
    if target.crow is None:
        message.dense = values
    else:
        message.sparse_csr.values = values
        message.sparse_csr.crow_indices = np.asarray(target.crow, dtype=np.int64).tobytes()
        message.sparse_csr.col_indices = np.asarray(target.col, dtype=np.int64).tobytes()
