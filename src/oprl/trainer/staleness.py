"""Per-token policy versions on the trainer's side (partial rollouts, docs/runtime.md#partial-rollouts).

``Experience.behavior_versions[t]`` is the version whose weights computed the distribution token t was drawn
from; ``policy_version`` stays the version the response started with (its oldest token), which is what
``sync.max_staleness`` bounds. ``token_lag_metrics`` reports the lag per token; ``mask_stale_tokens`` drops
tokens older than a bound from the loss (``trainer.max_token_lag``: slime's on-policy-tokens-only mode, for
comparison): data shaping before the loss, which itself needs no change.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from oprl.messages import Experience


def token_versions(exp: Experience) -> list[int]:
    """The version of each response token (all ``policy_version`` for a row sampled by one policy)."""
    if exp.behavior_versions is not None:
        return exp.behavior_versions
    return [exp.policy_version] * len(exp.response_ids)


def _model_token_versions(exp: Experience) -> list[int]:
    versions = token_versions(exp)
    if exp.loss_mask is None:
        return versions
    return [v for v, m in zip(versions, exp.loss_mask, strict=True) if m]


def token_lag_metrics(batch: list[Experience], version: int) -> dict[str, float]:
    """Per-token lag of the model tokens of ``batch`` against the trainer's ``version``:
    ``lag/token_min|mean|max``, ``lag/token_frac_<L>`` (fraction of tokens at lag L, for each L present),
    ``batch/version_min|max`` over tokens and ``batch/switched_frac`` (rows sampled by more than one policy)."""
    versions = [v for e in batch for v in _model_token_versions(e)] or [e.policy_version for e in batch]
    counts = Counter(version - v for v in versions)
    out = {
        "lag/token_min": float(min(counts)),
        "lag/token_mean": sum(lag * n for lag, n in counts.items()) / len(versions),
        "lag/token_max": float(max(counts)),
        "batch/version_min": float(min(versions)),
        "batch/version_max": float(max(versions)),
        "batch/switched_frac": sum(len(set(token_versions(e))) > 1 for e in batch) / len(batch),
    }
    out |= {f"lag/token_frac_{lag}": n / len(versions) for lag, n in sorted(counts.items())}
    return out


def mask_stale_tokens(batch: list[Experience], version: int, max_lag: int) -> tuple[list[Experience], float]:
    """``batch`` with every model token older than ``max_lag`` versions (lag = ``version`` - its version)
    taken out of the loss (``loss_mask`` 0: context only), and the fraction of model tokens masked. Rows are
    copied; the buffer's objects stay as they are. ``max_lag=0`` keeps on-policy tokens only (slime)."""
    out, masked, total = [], 0, 0
    for exp in batch:
        mask = list(exp.loss_mask) if exp.loss_mask is not None else [1] * len(exp.response_ids)
        for t, v in enumerate(token_versions(exp)):
            if mask[t]:
                total += 1
                if version - v > max_lag:
                    mask[t], masked = 0, masked + 1
        out.append(replace(exp, loss_mask=mask) if mask != (exp.loss_mask or [1] * len(mask)) else exp)
    return out, masked / max(total, 1)
