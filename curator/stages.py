"""One stage-and-record policy for the stages whose runs the catalog records (build-mix, generate,
train), shared by their commands and by `curator demo`.

A stage writes its output to disk first and records it in the catalog after. By then the output
is complete whatever the catalog says, so a catalog failure after the stage (a file held open by
another program, a read-only or damaged file, a full disk under the catalog) is a warning that
the caller shows, never an error: a script carries on with the mix, answers or draft it asked
for. A catalog the stage itself needs before it starts (`build-mix --from-catalog`, a recipe's
license filter) is opened by the caller, and its failure stays an error.

The stages' heavy imports (pyarrow, torch) stay inside the functions: the CLI imports this
module only when a command runs, and `--help` must not pay for them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union

from curator.catalog import ENV_VAR, Catalog, resolve_path
from curator.errors import CatalogError
from training.io.diskspace import DiskFullError

if TYPE_CHECKING:
    from curator.generate import GenerateConfig, GenerationStats
    from curator.mix.recipe import Recipe
    from training.train.config import TrainConfig
    from training.train.trainer import TrainResult

T = TypeVar("T")
# A catalog already opened (say to build a recipe from it), or where to open one (None: the default).
CatalogRef = Union[Catalog, str, os.PathLike[str], None]


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """A finished stage's result, with its catalog id, or the warning saying why it has none."""

    result: T
    catalog_id: str | None
    warning: str | None
    note: str | None = None  # why nothing was recorded, where that is no failure (no catalog was asked for)


def unasked_default(catalog: CatalogRef) -> Path | None:
    """Return ./catalog.duckdb when `catalog` names no catalog (None, and $CURATOR_CATALOG unset) and
    there is none there: a stage then records nothing instead of leaving a new catalog file in
    whatever folder it was run from. None when a catalog was named or the default one exists."""
    if catalog is not None or os.environ.get(ENV_VAR):
        return None
    path = resolve_path(None)
    return None if path.exists() else path


def record_after(result: T, catalog: CatalogRef, record: Callable[[Catalog], str]) -> Recorded[T]:
    """Record a finished stage's `result` with `record` (given the open catalog, it returns the
    catalog id); a catalog failure becomes the returned warning, because the stage's output is
    already complete on disk and must not be reported as a failure. With no catalog named and none
    at the default path, nothing is recorded and `note` says so."""
    missing = unasked_default(catalog)
    if missing is not None:
        return Recorded(result, None, None, f"no catalog at {missing} (--catalog or ${ENV_VAR} names one)")
    try:
        with _open(catalog) as cat:
            catalog_id = record(cat)
    except (CatalogError, DiskFullError) as exc:  # a full disk under the catalog is not the stage's failure
        return Recorded(result, None, _warning(exc, _path_of(catalog)))
    return Recorded(result, catalog_id, None)


def build_and_record_mix(recipe: Recipe, out: Path, catalog: CatalogRef, **build_kwargs: Any) -> Recorded[dict[str, Any]]:
    """Build `recipe` into `out` (build_mix's options in `build_kwargs`), then record the mix;
    the result is the mix's manifest, the catalog id its mix id."""
    from curator.mix.build import build_mix  # pyarrow and the normalisers: only a build pays for them

    manifest = build_mix(recipe, out, **build_kwargs)
    return record_after(manifest, catalog, lambda cat: cat.record_mix(recipe.name, out.resolve(),
                                                                      recipe.model_dump(mode="json"), manifest))


def generate_and_record(config: GenerateConfig, catalog: CatalogRef, **generate_kwargs: Any) -> Recorded[GenerationStats]:
    """Regenerate `config.mix` into `config.out` (generate's options, e.g. on_progress, in
    `generate_kwargs`), then record the run; the catalog id is its run id. A run whose every row
    failed is recorded too: whether that is an error is the caller's call."""
    from curator.generate import generate  # loads torch (token-exact rendering)

    stats = generate(config, **generate_kwargs)
    return record_generation(stats, config, catalog)


def record_generation(stats: GenerationStats, config: GenerateConfig, catalog: CatalogRef) -> Recorded[GenerationStats]:
    """Record a finished generation run (a resumed run updates its row); the catalog id is its run id."""

    def record(cat: Catalog) -> str:
        cat.record_generation_run(stats.run_id, str(config.mix), str(config.out), config.model, stats.endpoints,
                                  stats.as_dict())
        return stats.run_id

    return record_after(stats, catalog, record)


def train_and_record(cfg: TrainConfig, catalog: CatalogRef, *, record: bool = True,
                     **train_kwargs: Any) -> Recorded[TrainResult]:
    """Train the draft `cfg` describes (the trainer's options in `train_kwargs`), then record the
    run unless `record` is false: under torchrun only rank 0 records, the others would write the
    same row again."""
    from training.train.trainer import train  # loads torch

    result = train(cfg, **train_kwargs)
    return record_training(result, cfg, catalog) if record else Recorded(result, None, None)


def record_training(result: TrainResult, cfg: TrainConfig, catalog: CatalogRef) -> Recorded[TrainResult]:
    """Record a finished training run under its run folder's name, which is its catalog id."""

    def record(cat: Catalog) -> str:
        cat.record_training_run(result.run_dir.name, result.run_dir, cfg.to_dict(),
                                {"train": result.train, "eval": result.eval, "vocab": result.vocab,
                                 "checkpoint": str(result.checkpoint), "step": result.step})
        return result.run_dir.name

    return record_after(result, catalog, record)


def _open(catalog: CatalogRef) -> Catalog:
    # Opened only now, after the stage: a catalog that cannot be opened is then a warning too.
    return catalog if isinstance(catalog, Catalog) else Catalog.open(catalog)


def _warning(exc: Exception, path: Path) -> str:
    # The catalog's errors name its file; one that does not gets the name here, once.
    where = "" if str(path) in str(exc) else f" {path}"
    return f"the run is complete but was not recorded in the catalog{where}: {exc}"


def _path_of(catalog: CatalogRef) -> Path:
    return catalog.path if isinstance(catalog, Catalog) else resolve_path(catalog)
