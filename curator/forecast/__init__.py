"""How many samples of each category reach a goal acceptance, and what they cost, from drafts
trained on nested subsets of one pool.

One module a job: `law.py` fits how acceptance grows with data and solves it for a goal;
`cost.py` prices the samples (tokens, GPU-hours, disk) and reads the break-even off a bench-serve
report; `runs.py` reads the points off finished runs; `nested.py` trains the nested drafts that
make them here; `report.py` puts the whole answer together.
"""

from curator.forecast.cost import (
    BadServeReportError,
    BreakEven,
    Cost,
    GenerationCost,
    break_even_from_report,
    category_cost,
    check_verify_cost,
    generation_cost,
    store_bytes_per_token,
)
from curator.forecast.law import (
    BAND,
    LAWS,
    MIN_REACHED_SAMPLES,
    MIN_SIZES,
    BadPointError,
    Budget,
    CategoryForecast,
    Ensemble,
    Fit,
    Point,
    best_fit,
    check_acceptance,
    check_goal,
    effective_samples,
    fit_ensemble,
    fit_law,
    forecast_category,
    r_star_weights,
)
from curator.forecast.nested import NestedRun, nested_subsets, subset_store, train_nested
from curator.forecast.report import Forecast, make_forecast
from curator.forecast.runs import RunFigures, left_out_categories, points_by_category, run_point

__all__ = [
    "BAND", "LAWS", "MIN_REACHED_SAMPLES", "MIN_SIZES", "BadPointError", "BadServeReportError", "BreakEven", "Budget",
    "CategoryForecast", "Cost", "Ensemble", "Fit", "Forecast", "GenerationCost", "NestedRun", "Point", "RunFigures",
    "best_fit", "break_even_from_report", "category_cost", "check_acceptance", "check_goal", "check_verify_cost",
    "effective_samples", "fit_ensemble", "fit_law", "forecast_category", "generation_cost", "left_out_categories",
    "make_forecast", "nested_subsets", "points_by_category", "r_star_weights", "run_point", "store_bytes_per_token",
    "subset_store", "train_nested",
]
