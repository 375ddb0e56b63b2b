"""The serving engines, one module each: what the toolkit speaks to each (launch flags, generation
requests and answers, the metrics bench-serve reads, hidden-state capture). See docs/adding-a-layout-or-engine.md."""

from __future__ import annotations

import shlex

from curator.engines import sglang, vllm
from curator.engines.base import Engine
from curator.engines.launch import LaunchSpec
from curator.errors import ConfigError

# a third engine: its module, and one entry here (docs/adding-a-layout-or-engine.md)
ENGINES: dict[str, Engine] = {sglang.NAME: sglang, vllm.NAME: vllm}
# which engine serves an export of each layout when no launch command says otherwise
ENGINE_OF_LAYOUT = {"sglang": sglang.NAME, "speculators": vllm.NAME}

__all__ = ["ENGINES", "ENGINE_OF_LAYOUT", "Engine", "LaunchSpec", "parse_launch"]


def parse_launch(command: str) -> LaunchSpec:
    """Return the speculative settings of an SGLang or vLLM launch command."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"cannot parse the launch command ({exc})") from None
    # Leading VAR=value assignments (CUDA_VISIBLE_DEVICES=0 ...) are the shell's, not the server's.
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        argv = argv[1:]
    for engine in ENGINES.values():
        if engine.recognises(argv):
            return engine.parse(argv)
    raise ConfigError("the launch command is neither `python -m sglang.launch_server ...` nor `vllm serve ...`")
