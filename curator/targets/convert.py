"""A GGUF model file turned into an ordinary Hugging Face folder that every stage and engine reads.

transformers reads GGUF files (`from_pretrained(dir, gguf_file=...)`, dequantising the weights) but
refuses to save such a model ("quantized with gguf and is not serializable"). So the model is built
again from its config, given the dequantised weights, and saved as safetensors with the tokenizer
(its chat template included) and a generation config: a folder whose logits equal the GGUF model's,
which vLLM, SGLang and `transformers` load unchanged.

Imports only the standard library, torch, transformers (with its `gguf` reader) and safetensors, so
the GPU node, which has no curator dependencies, runs it too.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from curator.errors import CuratorError
from training.io.diskspace import named_disk_full

GGUF_MAGIC = b"GGUF"
MARKER = "curator-target.json"  # written last into a finished folder: what it was made from
DTYPES = ("float32", "bfloat16", "float16")


class TargetError(CuratorError):
    """A target folder cannot be made: the file is not a GGUF model, or transformers cannot read it."""


def check_gguf(path: Path) -> int:
    """Return the GGUF version of `path`; raise TargetError when it is not a GGUF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise TargetError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise TargetError(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise TargetError(f"{path}: GGUF version {version}; transformers reads versions 2 and 3")
    return int(version)


def made_from(folder: Path) -> dict[str, Any] | None:
    """Return what a finished target folder was made from (its marker), None when it is not one."""
    marker = folder / MARKER
    if folder.is_symlink() or marker.is_symlink() or not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _load(gguf: Path, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-tensor bars would drown the command's own line
    kwargs = {"gguf_file": gguf.name}
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # the GGUF dequantiser draws a plain tqdm bar of its own
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=getattr(torch, dtype), **kwargs)
    except ImportError as exc:
        raise TargetError(f"reading GGUF files needs the `gguf` package ({exc}); pip install gguf") from None
    except (ValueError, KeyError, OSError, RuntimeError, struct.error, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise TargetError(f"{gguf}: transformers cannot read this GGUF model: {first}") from None
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before
    return model, tokenizer


def rebuild(model: Any) -> Any:
    """Return a plain (serialisable) copy of a model transformers read from GGUF: same config, same weights."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised: the folder holds plain tensors
    config._name_or_path = ""
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or [])
    if unexpected or set(missing) - tied - {"lm_head.weight"}:
        raise TargetError(f"the GGUF model's weights do not fit its own config (missing {sorted(missing)[:4]}, "
                          f"unexpected {sorted(unexpected)[:4]})")
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.eval()
    return plain


def gguf_to_folder(gguf: str | Path, out: str | Path, *, dtype: str = "float32", sha256: str | None = None,
                   source: str | None = None) -> Path:
    """Write the Hugging Face folder of the GGUF model `gguf` at `out` and return it.

    The folder is written beside `out` and renamed into place once whole, with a marker naming the
    GGUF file and its sha256 (given, or computed): a killed run leaves no folder that looks finished.
    `dtype` is the weights' type on disk; float32 keeps the dequantised values exactly.
    """
    from curator.wheels import sha256_of

    gguf, out = Path(gguf), Path(out)
    if dtype not in DTYPES:
        raise TargetError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    check_gguf(gguf)
    digest = sha256 or sha256_of(gguf)
    if out.exists() or out.is_symlink():
        raise TargetError(f"{out} exists; pick another folder or remove it")
    model, tokenizer = _load(gguf, dtype)
    if not getattr(tokenizer, "chat_template", None):
        raise TargetError(f"{gguf}: the GGUF file carries no chat template (a base model?); every stage renders "
                          "conversations with the target's own template, so a chat model is needed")
    plain = rebuild(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    try:
        with named_disk_full(out.parent):  # a full disk is named, whether torch, safetensors or json hit it
            plain.save_pretrained(stage, safe_serialization=True)
            tokenizer.save_pretrained(stage)
            marker = {"made_by": "curator target", "gguf": gguf.name, "gguf_sha256": digest, "dtype": dtype,
                      "source": source or str(gguf)}
            (stage / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
            os.rename(stage, out)  # fails when another run put a folder there meanwhile: theirs is kept
    except OSError as exc:
        raise TargetError(f"{out}: cannot write the target folder ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out
