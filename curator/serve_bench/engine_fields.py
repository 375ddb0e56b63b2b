"""The engines' own acceptance figures, read from the fields they publish (checked in their source).

SGLang (python/sglang/srt/managers/tokenizer_manager.py, 0.5.x): every `/generate` answer of a
server started with a speculative algorithm carries `meta_info.spec_verify_ct` (target verify
forwards of that request) beside `meta_info.completion_tokens`; its acceptance length is
completion_tokens / spec_verify_ct (SGLang's own `spec_accept_length` is that ratio).

vLLM (vllm/v1/spec_decode/metrics.py, v1 engine): Prometheus counters on `/metrics`,
`vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
`vllm:spec_decode_num_accepted_tokens` and `vllm:spec_decode_num_accepted_tokens_per_pos`
(label `position`), exposed with prometheus_client's `_total` suffix and labelled per engine and
model; mean acceptance length = 1 + accepted / drafts, position k's rate = per_pos[k] / drafts.
Counters are server-wide and cumulative: a run reads them before and after and takes the
difference, so nothing else may use the server meanwhile.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from curator.errors import EndpointError

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

# name{labels} value [timestamp]
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Return (name, labels, value) of every sample in a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue  # a line of another exposition format: not ours to judge
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, value))
    return samples


def _counter(name: str, sample_name: str) -> bool:
    """Return whether a sample is counter `name` (prometheus_client adds `_total`; `_created` is not it)."""
    return sample_name in (name, name + "_total")


@dataclass
class VllmSpecCounters:
    """vLLM's speculative-decoding counters at one moment (summed over engines)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, text: str) -> VllmSpecCounters:
        """Return the counters in a `/metrics` page; refused when it has none (no speculation)."""
        c, found = cls(), False
        for name, labels, value in parse_prometheus(text):
            if _counter(VLLM_ACCEPTED_PER_POS, name):
                pos = int(labels.get("position", "0"))
                c.accepted_per_pos[pos] = c.accepted_per_pos.get(pos, 0.0) + value
            elif _counter(VLLM_DRAFTS, name):
                c.drafts += value
                found = True
            elif _counter(VLLM_DRAFT_TOKENS, name):
                c.draft_tokens += value
            elif _counter(VLLM_ACCEPTED, name):
                c.accepted += value
        if not found:
            raise EndpointError(f"the /metrics page has no {VLLM_DRAFTS} counter: the server runs without speculative decoding")
        return c

    def minus(self, before: VllmSpecCounters) -> VllmSpecCounters:
        """Return what was counted since `before`."""
        return VllmSpecCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens, self.accepted - before.accepted,
            {p: v - before.accepted_per_pos.get(p, 0.0) for p, v in self.accepted_per_pos.items()},
        )

    @property
    def acceptance_length(self) -> float:
        """Return 1 + accepted / drafts (vLLM's mean acceptance length, bonus token included)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else math.nan

    def position_rates(self) -> list[float]:
        """Return per draft position the share of drafts whose tokens 1..k were all accepted."""
        return [self.accepted_per_pos[p] / self.drafts if self.drafts else math.nan for p in sorted(self.accepted_per_pos)]


def sglang_verify_counts(meta_info: Any) -> tuple[int, int | None]:
    """Return (completion_tokens, spec_verify_ct or None when the server does not speculate)."""
    if not isinstance(meta_info, dict) or not isinstance(meta_info.get("completion_tokens"), int):
        raise EndpointError("the SGLang /generate answer has no meta_info.completion_tokens: not an SGLang server?")
    verify = meta_info.get("spec_verify_ct")
    if verify is not None and not isinstance(verify, int):
        raise EndpointError(f"meta_info.spec_verify_ct is {verify!r}, not a count")
    return meta_info["completion_tokens"], verify
