"""Plain reference implementations of the evaluator's numbers (shared by the evaluator, chat and real-model
tests)."""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections import Counter

import torch

ARCHS = ["llama", "gpt2", "qwen2", "mistral", "gpt_neox"]
TOL = 1e-4
#: The five axes computed by default before docs/validity.md narrowed the default to confidence and generation.
FIVE_AXES = "activation,activation_rel,confidence,generation,mirroring"

RECORDS = [
    {"id": "a", "variants": ["What is the capital of France?", "france capital is which", "Name the capital of France."],
     "kinds": ["canonical", "paraphrase", "typo"], "reference": " Paris"},
    {"id": "b", "variants": ["Two plus two equals", "2 + 2 =", "what do you get adding two and two"],
     "kinds": ["canonical", "paraphrase", "typo"]},
    {"id": "c", "variants": ["The sky is", "Colour of the sky:", "the skyy is"],
     "kinds": ["canonical", "paraphrase", "typo"], "reference": " blue"},
    {"id": "d", "variants": ["Dogs say", "A dog goes", "dgos say"], "kinds": ["canonical", "paraphrase", "typo"]},
]


# ------------------------------------------------------------------ plain reference implementation
def ref_normalize(s: str) -> str:
    # SPEC: Unicode punctuation (categories P*) goes; symbols such as "+" and "=" (S*) stay.
    s = s.lower()
    s = "".join(ch for ch in s if not unicodedata.category(ch).startswith("P"))
    return re.sub(r"\s+", " ", s).strip()


def ref_f1(a: str, b: str) -> float:
    ta, tb = ref_normalize(a).split(), ref_normalize(b).split()
    if not ta and not tb:
        return 1.0
    if not ta or not tb:
        return 0.0
    common = sum((Counter(ta) & Counter(tb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


def ref_generate(model, tok, ids: list[int], max_new: int, eos_id: int = 257, pad_id: int = 258) -> str:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id, eos_token_id=eos_id)
    new = out[0, len(ids):].tolist()
    if eos_id in new:
        new = new[: new.index(eos_id)]
    return tok.decode(new, skip_special_tokens=True)


def ref_logprob_sum(model, prompt: list[int], cont: list[int]) -> float:
    """log P(cont | prompt), summed over cont's tokens, from one plain forward in float64."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + cont])).logits[0].double(), -1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(cont))


def ref_answer_logprobs(model, tok, prompts: list[list[int]], outs: list[str], reference: str,
                        canonical: int = 0) -> list[float] | None:
    """The reference's mean log-probability per token after each prompt and the model's own lead-in to it (the
    first output, canonical first, that contains it case-insensitively, up to where it starts), from one plain
    forward each in which only the reference's positions are summed; None when no output contains it or the
    lead-in is empty (the bare reference is scored)."""
    target = reference.strip().lower()
    lead = None
    for k in [canonical] + [k for k in range(len(outs)) if k != canonical]:
        if target in outs[k].lower():
            lead = outs[k][: outs[k].lower().index(target)]
            break
    if lead is None or not lead.rstrip():
        return None
    lead_ids = tok(lead.rstrip(), add_special_tokens=False)["input_ids"]
    ref_ids = tok((" " if lead[-1].isspace() else "") + reference.strip(), add_special_tokens=False)["input_ids"]
    out = []
    for p in prompts:
        full = p + lead_ids + ref_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
        start = len(p) + len(lead_ids)
        out.append(sum(float(logp[start - 1 + j, t]) for j, t in enumerate(ref_ids)) / len(ref_ids))
    return out


def ref_posix(model, tok, prompts: list[list[int]], outs: list[str]) -> float:
    """POSIX, Eq. 1 of Chatterjee et al. (2024): the mean over ordered pairs i != j of
    |log P(y_j | x_i) - log P(y_j | x_j)| / L(y_j), y_j the greedy response to x_j (an empty one contributes 0)."""
    k = len(prompts)
    ys = [tok(y, add_special_tokens=False)["input_ids"] if y else [] for y in outs]
    total = 0.0
    for j, y in enumerate(ys):
        if not y:
            continue
        own = ref_logprob_sum(model, prompts[j], y)
        total += sum(abs(ref_logprob_sum(model, prompts[i], y) - own) for i in range(k) if i != j) / len(y)
    return total / (k * (k - 1))


def reference_group(model, tok, rec: dict, layers: list[int], max_new: int, pooling: str = "last", *,
                    encode=None, eos_id: int = 257, pad_id: int = 258, span=None) -> dict:
    """One variant at a time; ``encode(variant) -> ids`` defaults to the tokenizer's plain encoding; ``span(output)``
    is the answer span the lead-in and posix read (default: the whole output)."""
    prompts = [encode(v) if encode else tok(v)["input_ids"] for v in rec["variants"]]
    outs = [ref_generate(model, tok, p, max_new, eos_id, pad_id) for p in prompts]
    spans = [span(y) for y in outs] if span is not None else outs
    r = rec.get("reference") or outs[rec.get("canonical", 0)]
    r_ids = tok(r, add_special_tokens=False)["input_ids"]
    vecs, lps = [], []
    with torch.no_grad():
        for p in prompts:
            o = model(torch.tensor([p]), output_hidden_states=True)
            if pooling == "last":
                vecs.append([o.hidden_states[layer + 1][0, -1].double() for layer in layers])
            else:
                vecs.append([o.hidden_states[layer + 1][0].double().mean(0) for layer in layers])
            if r_ids:
                logits = model(torch.tensor([p + r_ids])).logits[0].double()
                logp = torch.log_softmax(logits, -1)
                lps.append(sum(float(logp[len(p) - 1 + j, t]) for j, t in enumerate(r_ids)) / len(r_ids))
    k = len(prompts)
    pairs = list(itertools.combinations(range(k), 2))
    per_layer = []
    for li in range(len(layers)):
        d = [1 - float(torch.nn.functional.cosine_similarity(vecs[i][li], vecs[j][li], dim=0)) for i, j in pairs]
        per_layer.append(min(1.0, max(0.0, sum(d) / len(d))))  # each layer's value clipped to [0, 1]
    out = {"activation": sum(per_layer) / len(per_layer)}
    if lps:
        ps = [math.exp(x) for x in lps]
        out["confidence_prob"] = sum(abs(ps[i] - ps[j]) for i, j in pairs) / len(pairs)
        answer = ref_answer_logprobs(model, tok, prompts, spans, rec["reference"], rec.get("canonical", 0)) \
            if rec.get("reference") else None
        qs = [math.exp(x) for x in answer] if answer is not None else ps
        out["confidence"] = sum(1 - min(qs[i], qs[j]) / max(qs[i], qs[j]) for i, j in pairs) / len(pairs)
        out["_answer_lps"] = answer
    else:
        out["confidence"] = out["confidence_prob"] = math.nan
    out["posix"] = ref_posix(model, tok, prompts, spans)
    out["generation"] = 1 - sum(ref_f1(outs[i], outs[j]) for i, j in pairs) / len(pairs)
    # mirroring
    pw = [set(ref_normalize(v).split()) for v in rec["variants"]]
    refw = set(ref_normalize(rec["reference"]).split()) if rec.get("reference") else set()
    ms = []
    for i in range(k):
        uniq = pw[i] - set().union(*[pw[j] for j in range(k) if j != i]) - refw
        yw = ref_normalize(outs[i]).split()
        ms.append(sum(w in uniq for w in yw) / len(yw) if yw else 0.0)
    out["mirroring"] = sum(ms) / k
    out["_outputs"] = outs
    out["_lps"] = lps
    return out


