"""The cost model of the model-guided tuner (tuners.py): gradient-boosted trees (xgboost) that rank a task's configs
by predicted speed from their features (features.py), trained online on the task's measurements. A model pretrained
on other tasks' records (loop-IR features only, which mean the same thing in every task) warm-starts a new task: its
predictions are the new model's starting margin, so the first batches are chosen by what other tasks measured."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from compiler.errors import TuningError
from compiler.tune.features import Featurizer
from compiler.tune.task import canonical, task_from_json

# Shallow trees and few rounds: a task has tens to hundreds of measurements, and a fit runs before every batch.
PARAMETERS = {
    "max_depth": 4,
    "eta": 0.3,
    "min_child_weight": 1,
    "subsample": 1.0,
    "lambda": 1.0,
    "nthread": 1,
    "verbosity": 0,
}
ROUNDS = 60
OBJECTIVES = {"rank": "rank:pairwise", "regression": "reg:squarederror"}


def scores(seconds: Sequence[float | None]) -> np.ndarray:
    """What the model learns for each measurement: the task's fastest time over this one's, in (0, 1], so that
    scores of different tasks are comparable; a failed measurement (None) scores 0."""
    times = np.array([np.nan if value is None else value for value in seconds], dtype=float)
    measured = times[np.isfinite(times) & (times > 0)]
    if measured.size == 0:
        return np.zeros(len(times))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = measured.min() / times
    return np.where(np.isfinite(result), result, 0.0)


def _xgboost():
    try:
        import xgboost
    except ImportError:
        raise TuningError(
            "the xgb tuner needs the xgboost package: pip install 'tessel[tune]' (or xgboost), or pick --tuner ga"
        ) from None
    return xgboost


class CostModel:
    """Boosted trees over feature rows. `base`: a pretrained model whose predictions on the leading
    `base.width` columns (the loop-IR features) start every prediction of this one."""

    def __init__(self, objective: str = "rank", seed: int = 0, base: CostModel | None = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown cost model objective {objective!r}; use one of {list(OBJECTIVES)}")
        self.objective = objective
        self.seed = seed
        self.base = base
        self.booster = None
        self.width: int | None = None

    @property
    def trained(self) -> bool:
        return self.booster is not None or self.base is not None

    def _matrix(self, features: np.ndarray, labels=None, groups=None):
        xgboost = _xgboost()
        features = np.asarray(features, dtype=float)
        matrix = xgboost.DMatrix(features, label=labels, nthread=PARAMETERS["nthread"])
        if self.base is not None:
            matrix.set_base_margin(self.base.predict(features))
        if groups is not None:
            matrix.set_group(groups)
        return matrix

    def fit(self, features: np.ndarray, targets: np.ndarray, groups: Sequence[int] | None = None) -> CostModel:
        """Train on rows of `features` and their scores (higher is faster); `groups`: the sizes of consecutive
        runs of rows that belong to one task, which a ranking objective compares only among themselves."""
        xgboost = _xgboost()
        features = np.asarray(features, dtype=float)
        self.width = features.shape[1]
        parameters = {**PARAMETERS, "objective": OBJECTIVES[self.objective], "seed": self.seed}
        matrix = self._matrix(features, np.asarray(targets, dtype=float), groups)
        self.booster = xgboost.train(parameters, matrix, num_boost_round=ROUNDS)
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        """A score per row, higher for configs predicted faster (comparable within one task only); columns past
        the ones it was trained on (a task's knob values, for a model pretrained on loop-IR features) are ignored."""
        features = np.asarray(features, dtype=float)
        if self.booster is None:
            return self.base.predict(features) if self.base is not None else np.zeros(len(features))
        return self.booster.predict(self._matrix(features[:, : self.width]), output_margin=True)


def pretrain(samples: Iterable[tuple[np.ndarray, Sequence[float | None]]], objective: str = "rank", seed: int = 0):
    """A model trained on other tasks' measurements: `samples` gives, per task, the loop-IR feature rows of its
    measured configs and their seconds. None when no task has two measurements to compare."""
    rows, targets, groups = [], [], []
    for features, seconds in samples:
        if len(seconds) < 2:
            continue
        rows.append(np.asarray(features, dtype=float))
        targets.append(scores(seconds))
        groups.append(len(seconds))
    if not rows:
        return None
    return CostModel(objective, seed).fit(np.concatenate(rows), np.concatenate(targets), groups)


def pretrain_records(records: Iterable[dict], exclude: Iterable[str] = (), objective: str = "rank", seed: int = 0):
    """A model pretrained on tuning records (records.read_records) of tasks other than `exclude` (task keys): each
    record's task is rebuilt from its workload and its config lowered again for its loop-IR features. Tasks this
    compiler can no longer rebuild, and configs that no longer fit their template, are left out. None when no task
    has two measurements."""
    excluded = set(exclude)
    by_task: dict[str, tuple[dict, list[tuple[dict, float | None]]]] = {}
    for record in records:
        key = canonical(record["task"])
        if key not in excluded:
            by_task.setdefault(key, (record["task"], []))[1].append((record["config"], record["seconds"]))

    def samples():
        for task_json, measured in by_task.values():
            task = task_from_json(task_json)
            if task is None:
                continue
            configs, seconds = [], []
            for values, time in measured:
                try:
                    configs.append(task.space.config(values))
                except TuningError:
                    continue
                seconds.append(time)
            yield Featurizer(task).loop_matrix(configs), seconds

    return pretrain(samples(), objective, seed)
