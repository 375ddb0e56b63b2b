"""What every serving engine module is: the operations the toolkit performs against an engine, one
signature each, so that a third engine is one module plus a line in curator/engines/__init__.py.

The engines are modules (curator/engines/sglang.py, vllm.py), and a module satisfies this Protocol
when it defines every name below (mypy checks the registration in ENGINES against it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from curator.engines.answer import EngineAnswer
    from curator.engines.draft import DraftLayout
    from curator.engines.launch import Check, LaunchSpec
    from curator.engines.sampling import SamplingParams
    from curator.engines.spec_counters import SpecCounters
    from training.capture.stats import ExtractStats
    from training.storage.format import StoreMeta


@dataclass
class CaptureJob:
    """One hidden-state capture handed to an engine: the records to capture, the store they go to, and
    how to reach the servers (`curator hidden-states --backend ENGINE`, curator/hidden/capture.py)."""

    model: str  # the served model name
    local: Path  # the target's local folder: config, tokenizer, final norm weights
    records: Iterable[dict[str, Any]]  # generation records, each captured unless the store holds it
    out: Path  # the store
    meta: StoreMeta  # what the store keeps (its layers, dtype, final state)
    tokenizer: Any  # the target's, to tokenise each record as the transformers backend does
    endpoints: list[str]
    concurrency: int  # requests in flight per endpoint
    retries: int
    shared_dir: str  # the folder the engine writes its files into, as it names it
    path_map: tuple[str, str] | None  # (engine dir, local dir) when that folder is mounted elsewhere here
    max_len: int | None  # each sample clipped to this many tokens
    positions: int | None  # the target's context: a longer sample is skipped as too long
    on_sample: Callable[[int], None]  # told each stored batch's sample count


class Engine(Protocol):
    """One serving engine as the toolkit speaks to it."""

    # read-only (properties), so that a module's constants satisfy them
    @property
    def NAME(self) -> str: ...  # the `--engine` value and the LaunchSpec's engine
    @property
    def LABEL(self) -> str: ...  # how messages (and the layouts' served-layer readers) name it
    @property
    def GENERATE_PATH(self) -> str: ...  # where token-exact generation is sent
    @property
    def BENCH_TAKES_TOKEN_IDS(self) -> bool: ...  # bench-serve sends rendered ids (else chat messages)
    @property
    def NEEDS_SERVED_MODEL_NAME(self) -> bool: ...  # requests name the served model
    # bench-serve's acceptance from the server's /metrics page, read before and after a group;
    # None: each answer carries its own counts (bench_counts)
    @property
    def spec_counters(self) -> Callable[[str], SpecCounters] | None: ...

    # ---- launch commands: what the doctor reads and suggests
    def recognises(self, argv: list[str]) -> bool: ...
    def parse(self, argv: list[str]) -> LaunchSpec: ...
    def step_checks(self, spec: LaunchSpec) -> list[Check]: ...
    def layout_problems(self, draft: DraftLayout) -> list[Check]: ...
    def missing_algorithm(self, spec: LaunchSpec, layout_name: str) -> Check: ...
    def export_checks(self, spec: LaunchSpec, draft: DraftLayout, target: str | Path | None) -> list[Check]: ...
    def suggested_launch(self, model: str, draft: str, steps: int, spec: LaunchSpec | None) -> str: ...

    # ---- token-exact generation
    def token_request(self, prompt_ids: Sequence[int], params: SamplingParams, model: str) -> dict[str, Any]: ...
    def parse_token_answer(self, payload: Any, prompt_ids: Sequence[int], endpoint: str) -> EngineAnswer: ...

    # ---- bench-serve
    def bench_request(self, prompt: Any, model: str | None, max_tokens: int,
                      temperature: float) -> tuple[str, dict[str, Any]]: ...
    def streamed_output(self, event: dict[str, Any]) -> bool: ...
    def bench_counts(self, last: dict[str, Any], usage: dict[str, Any], where: str) -> tuple[int, int | None]: ...

    # ---- hidden-state capture (`curator hidden-states --backend NAME`); None: the engine captures none
    @property
    def capture(self) -> Callable[[CaptureJob], ExtractStats] | None: ...
