"""A plain-Python reference of ``policy_loss`` (loops and the math module, no torch), written from the papers'
and the authors' code's formulas rather than from ``oprl.algorithms.corrections``: the tests compare the two.

``reference_loss(settings, logprobs, log_ratios, advantages, mask)`` takes lists of lists: the trainer's
log-probs, log ρ = logprobs − anchor per token, one advantage per row, the valid mask. It returns the loss,
d loss / d logprobs and the batch-level quantities the rules report (M2PO's M̂₂, BAPO's bounds).
"""

import math

LIMIT = 20.0


def _clamp(x, low, high):
    return min(max(x, low), high)


def _row_log_ratio(settings, log_ratios, mask, b, t):
    level = settings["ratio_level"]
    logs = [_clamp(log_ratios[b][u], -LIMIT, LIMIT) for u in range(len(mask[b])) if mask[b][u]]
    if level == "token":
        return _clamp(log_ratios[b][t], -LIMIT, LIMIT)
    if level == "sequence":
        return sum(logs) / len(logs)
    return _clamp(sum(logs), -LIMIT, LIMIT)  # sequence-sum: the whole response's ratio


def _binary_kl(mu, pi):
    """KL(Bern(μ) ‖ Bern(π)), with the authors' 1e-8 on 1 − p."""
    first = mu * (math.log(mu) - math.log(pi)) if mu > 0 else 0.0
    return first + (1 - mu) * math.log((1 - mu + 1e-8) / (1 - pi + 1e-8))


def _m2_mask_paper(tokens, harmful, threshold):
    """The paper's rule as its pseudo-code reads (Zheng et al. 2025, Algorithm 1), with M̂₂ over the harmful
    tokens as the authors' code measures it: while the mean (log ρ)² of the harmful tokens left exceeds τ, remove
    the one with the largest (log ρ)²."""
    left = {key: value for key, value in tokens if key in harmful}

    def mean():
        return sum(left.values()) / len(left) if left else 0.0

    before = mean()
    for key in sorted(left, key=lambda key: -left[key]):  # stable: ties keep their order
        if mean() <= threshold:
            break
        del left[key]
    kept = {key for key, _ in tokens if key not in harmful} | set(left)
    return kept, before, mean()


def _m2_mask_areal(tokens, threshold):
    """The tokens AReaL's M2PO keeps: the largest (log ρ)² dropped until the mean of the rest is < threshold."""
    ranked = sorted(tokens, key=lambda item: -item[1])  # stable: ties keep their order
    n = len(ranked)
    for k in range(n):
        rest = [value for _, value in ranked[k:]]
        if sum(rest) / len(rest) < threshold:
            return {key for key, _ in ranked[k:]}, sum(value for _, value in ranked) / n, sum(rest) / len(rest)
    return set(), (sum(value for _, value in ranked) / n if n else 0.0), 0.0


def _m2_clip_bounds(tokens, threshold, eps_low, eps_high):
    """The authors' loop (Infini-AI-Lab/M2PO kpo_clip_harmful_tokens + the min widths)."""
    values = sorted(tokens)
    n = len(values)
    tau = math.inf
    if n and sum(values) / n > threshold + 1e-12:
        target = threshold * n
        for k in range(n):
            if (values[k] - 1e-12) * (n - k - 1) + sum(values[: k + 1]) >= target - 1e-12:
                tau = 0.0 if k == 0 else math.sqrt(values[k - 1] - 1e-12)  # the authors' − 1e-12: v_{k−1} is out
                break
    low = min(math.exp(-tau), 1 - eps_low)
    high = max(math.exp(tau), 1 + eps_high)
    return low, high


def _bapo_bounds(settings, ratios, advantages, valid):
    """The authors' while loops (WooooDyy/BAPO compute_policy_loss_bapo), target as a positive share."""

    def share(low, high):
        pos = sum(min(ratios[k], high) * advantages[k] for k in valid if advantages[k] > 0)
        neg = sum(max(ratios[k], low) * -advantages[k] for k in valid if advantages[k] < 0)
        return pos / (pos + neg) if pos + neg > 0 else 1.0

    low, high = 1 - settings["eps_low"], 1 + settings["eps_high"]
    target = settings["bapo_target"]
    while share(low, high) < target and low < settings["bapo_low_max"] - 1e-12:
        low = min(low + 0.05, settings["bapo_low_max"])
    while share(low, high) < target and high < settings["bapo_high_max"] - 1e-12:
        high = min(high + 0.1, settings["bapo_high_max"])
    return low, high, share(low, high)


def _keep(settings, rho, a, lp, anchor):
    """The token mask of the per-token clip modes."""
    mode = settings["clip_mode"]
    el, eh = settings["eps_low"], settings["eps_high"]
    in_band = 1 - el <= rho <= 1 + eh
    if mode == "none":
        return True
    if mode == "one-side":
        return (a >= 0 and rho <= 1 + eh) or (a <= 0 and rho >= 1 - el)
    if mode == "two-side":
        return in_band
    if mode == "ring":
        return (
            in_band
            or (a >= 0 and rho <= 1 - settings["eps_low_prime"])
            or (a <= 0 and rho >= 1 + settings["eps_high_prime"])
        )
    if mode == "mask":
        return settings["mask_low"] <= rho <= settings["mask_high"]
    pi, mu = math.exp(min(lp, 0.0)), math.exp(min(anchor, 0.0))  # probabilities: a log-prob > 0 is 1
    if mode == "dppo-tv":
        return pi - mu <= eh if a > 0 else pi - mu >= -el
    if mode == "dppo-kl":
        kl = _binary_kl(mu, pi)
        return (kl <= eh or pi <= mu) if a > 0 else (kl <= el or pi >= mu)
    raise KeyError(mode)


def _weight(settings, rho, a):
    name, cap = settings["weight"], settings["is_cap"]
    if name == "none":
        return 1.0
    if name == "importance-sampling":
        return rho
    if name == "truncated-is":
        return min(rho, cap)
    if name == "clipped-is":
        return _clamp(rho, 1 - settings["eps_low"], 1 + settings["eps_high"])
    if name == "advantage":
        return math.exp(a / settings["weight_temperature"])
    if name == "flipped-is":
        return min(1 / rho, cap) if a > 0 else min(rho, cap)
    if name == "tapered":
        return 1.0 if a > 0 else min(rho, 1.0)
    if name == "soft-gate":
        tau = settings["tau_pos"] if a > 0 else settings["tau_neg"]
        gate = 1 / (1 + math.exp(-tau * (rho - 1)))
        return 4 * gate * (1 - gate) * rho
    if name == "gamma":  # VESPO (TRL get_gamma_weights): e^λ·w^k·e^(−λw), w the response's Π_t ρ_t, log w ≥ log 1e-8
        k, lam = (settings["vespo_k_pos"], settings["vespo_lambda_pos"]) if a >= 0 else (
            settings["vespo_k_neg"], settings["vespo_lambda_neg"])  # fmt: skip
        log_w = _clamp(math.log(rho), math.log(1e-8), 20.0)
        return math.exp(lam) * math.exp(k * log_w) * math.exp(-lam * math.exp(log_w))
    raise KeyError(name)


def _quantile(values, q):
    """numpy's / torch's default ('linear') quantile of a non-empty list."""
    ranked = sorted(values)
    position = q * (len(ranked) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ranked) - 1)
    return ranked[below] + (position - below) * (ranked[above] - ranked[below])


def _entropy_bands(settings, entropy, valid, rows):
    """ASPO's code (use_dynamic_clip): per response, tokens above the entropy_quantile of its tokens' entropies
    get ε_low = ε_high = entropy_eps, the others the preset's; ({token: (ε_low, ε_high)}, the wide tokens).
    No ``entropy`` is a constant one: no token lies above its response's quantile."""
    base = (settings["eps_low"], settings["eps_high"])
    if settings.get("entropy_eps") is None or entropy is None:
        return dict.fromkeys(valid, base), set()
    wide = set()
    for b in rows:
        tokens = [k for k in valid if k[0] == b]
        q = _quantile([entropy[b][t] for _, t in tokens], settings["entropy_quantile"])
        wide |= {k for k in tokens if entropy[b][k[1]] > q}
    return {k: (settings["entropy_eps"],) * 2 if k in wide else base for k in valid}, wide


def _dual_clipped(settings, rho, a, low):
    """Dual-clip PPO in verl's form: for A < 0, min(max(−A·ρ, −A·clip(ρ)), −A·c); the token is capped (no
    gradient) where the constant −A·c is the smaller."""
    c = settings.get("dual_clip")
    if c is None or a >= 0:
        return False
    return -a * c < max(-a * rho, -a * max(rho, low))


def _scale(settings, valid, rows, width):
    counts = {b: sum(1 for r, _ in valid if r == b) for b in rows}
    return {
        "token-mean": lambda b: 1 / len(valid),
        "seq-mean-token-mean": lambda b: 1 / len(rows) / counts[b],
        "seq-mean-token-sum": lambda b: 1 / len(rows),
        "seq-mean-token-sum-norm": lambda b: 1 / len(rows) / width,
    }[settings["loss_agg"]]


def reference_loss(settings, logprobs, log_ratios, advantages, mask, entropy=None):
    """(loss, gradient as a list of lists, report) of ``policy_loss`` with ``settings`` (see the module doc);
    ``entropy`` (lists of lists) is read only with ``entropy_eps``."""
    width = len(mask[0])
    valid = [(b, t) for b in range(len(mask)) for t in range(width) if mask[b][t]]
    rows = sorted({b for b, _ in valid})
    rho = {k: math.exp(_row_log_ratio(settings, log_ratios, mask, *k)) for k in valid}
    adv = {(b, t): advantages[b] for b, t in valid}
    report = {}
    bands, wide = _entropy_bands(settings, entropy, valid, rows)
    banded = {k: {**settings, "eps_low": bands[k][0], "eps_high": bands[k][1]} for k in valid}  # per-token ε
    report["entropy_wide_frac"] = len(wide) / len(valid)
    mode = settings["clip_mode"]
    harmful = {k for k in valid if (adv[k] > 1e-12 and rho[k] > 1 + 1e-12) or (adv[k] < -1e-12 and rho[k] < 1 - 1e-12)}
    if mode == "m2-mask":
        tokens = [(k, math.log(rho[k]) ** 2) for k in valid]
        kept, report["m2"], report["m2_kept"] = _m2_mask_paper(tokens, harmful, settings["m2_threshold"])
        keep = {k: k in kept for k in valid}
    elif mode == "m2-mask-areal":
        tokens = [(k, math.log(rho[k]) ** 2) for k in valid]
        kept, report["m2"], report["m2_kept"] = _m2_mask_areal(tokens, settings["m2_threshold"])
        keep = {k: k in kept for k in valid}
    elif mode in ("m2-clip", "bapo"):
        if mode == "m2-clip":
            values = [math.log(rho[k]) ** 2 for k in valid if k in harmful]
            low, high = _m2_clip_bounds(values, settings["m2_threshold"], settings["eps_low"], settings["eps_high"])
        else:
            low, high, report["bapo_positive_share"] = _bapo_bounds(settings, rho, adv, valid)
        report["low"], report["high"] = low, high
        keep = {k: (adv[k] >= 0 and rho[k] <= high) or (adv[k] <= 0 and rho[k] >= low) for k in valid}
    else:
        keep = {k: _keep(banded[k], rho[k], adv[k], logprobs[k[0]][k[1]], logprobs[k[0]][k[1]] - log_ratios[k[0]][k[1]])
                for k in valid}  # fmt: skip
    low = report.get("low", 1 - settings["eps_low"])
    capped = {k: _dual_clipped(settings, rho[k], adv[k], low) for k in valid}
    report["dual_clip_frac"] = sum(capped.values()) / len(valid)
    keep = {k: keep[k] and not capped[k] for k in valid}
    scale = _scale(settings, valid, rows, width)
    grad = [[0.0] * width for _ in mask]
    loss = 0.0
    if settings["objective"] == "advantage-regression":
        beta = settings["regression_beta"]
        for b in rows:
            tokens = [t for r, t in valid if r == b]
            residual = beta * sum(log_ratios[b][t] for t in tokens) - advantages[b]
            for t in tokens:
                loss += scale(b) * residual**2
                grad[b][t] += 2 * beta * residual * len(tokens) * scale(b)
    else:
        for b, t in valid:
            m_w_a = keep[b, t] * _weight(banded[b, t], rho[b, t], adv[b, t]) * adv[b, t]
            loss += scale(b) * -m_w_a * logprobs[b][t]
            grad[b][t] += scale(b) * -m_w_a
    c = settings["regularizer_coef"]
    for b, t in valid:
        reg, reg_grad = {
            "none": (0.0, 0.0),
            "squared-log-ratio": (c * log_ratios[b][t] ** 2, 2 * c * log_ratios[b][t]),
            "forward-kl": (-c * logprobs[b][t], -c),
        }[settings["regularizer"]]
        loss += scale(b) * reg
        grad[b][t] += scale(b) * reg_grad
    return loss, grad, report
