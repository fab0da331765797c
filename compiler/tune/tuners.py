"""Search over a task's schedule space (space.py): tuners that propose batches of configs and learn from their
measurements (grid, random, genetic, and a model-guided one over cost_model.py), a loop that runs one against any
`measure` callable (measure.py's Measurer.measure, or a synthetic cost in tests), and tune_model, which shares a
whole model's trial budget among its tasks by their weight in the model's time. Records are the caller's to write."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.errors import TuningError
from compiler.schedules.space import Config, ConfigSpace
from compiler.tune.cost_model import CostModel, scores
from compiler.tune.features import featurizer_of
from compiler.tune.task import Task

# Spaces up to this size list their valid configs once; larger ones are sampled, rejecting invalid points.
ENUMERATION_LIMIT = 1 << 16
# Random draws a tuner makes for one new valid, unvisited config of a space too large to list before it gives up.
SAMPLE_ATTEMPTS = 1000
BATCH_SIZE = 16


@dataclass
class Progress:
    """What a callback sees after each measured batch. The `model_*` fields are set under tune_model: trials over
    every task, and the model's estimated time (the sum over tuned tasks of weight x best seconds so far)."""

    task: Task
    trials: int
    budget: int
    best_seconds: float | None
    best_config: Config | None
    results: list
    task_number: int = 1
    task_count: int = 1
    model_trials: int | None = None
    model_budget: int | None = None
    estimated_seconds: float | None = None


Callback = Callable[[Progress], None]


class _Points:
    """The valid configs of a space, as indices: listed once when the space is small, sampled when it is not."""

    def __init__(self, space: ConfigSpace):
        self.space = space
        self.listed: list[int] | None = None
        if space.size <= ENUMERATION_LIMIT:
            self.listed = [index for index in range(space.size) if space.get(index).valid]

    def valid(self, index: int) -> bool:
        return self.space.get(index).valid

    def count(self) -> float:
        return len(self.listed) if self.listed is not None else math.inf

    def sample(self, rng: np.random.Generator, visited: set[int], count: int) -> list[int]:
        """Up to `count` distinct valid indices not in `visited`, uniformly."""
        if self.listed is not None:
            left = [index for index in self.listed if index not in visited]
            if len(left) <= count:
                return left
            return [left[position] for position in rng.choice(len(left), count, replace=False)]
        chosen: list[int] = []
        for _ in range(SAMPLE_ATTEMPTS * count):
            index = int(rng.integers(self.space.size))
            if index not in visited and index not in chosen and self.valid(index):
                chosen.append(index)
                if len(chosen) == count:
                    break
        return chosen


class Tuner:
    """Proposes configs of `task`'s space and learns from their results. The first proposal is the template's
    fallback (what a compile without records builds), so every tuned task knows its default time and its best is
    never slower. No config is proposed twice, and none that the space's filters reject.

    Results are anything with `config` and `seconds` (None for a failed measurement), like measure.py's
    MeasureResult."""

    def __init__(self, task: Task, seed: int = 0):
        self.task = task
        self.space = task.space
        self.rng = np.random.default_rng(seed)
        self.points = _Points(self.space)
        self.visited: set[int] = set()
        self.measured: list[tuple[Config, float | None]] = []
        self.best_config: Config | None = None
        self.best_seconds: float | None = None
        self.best_trial = 0
        self.trials = 0

    def remaining(self) -> float:
        """How many configs are left to propose (inf for a space too large to list)."""
        if self.points.listed is None:
            return math.inf
        fallback = self.space.fallback.index
        extra = fallback not in self.visited and not self.space.fallback.valid
        return sum(index not in self.visited for index in self.points.listed) + extra

    def has_next(self) -> bool:
        return self.remaining() > 0

    def seconds_of(self, config: Config) -> float | None:
        """The measured seconds of `config` (None when it failed or was not measured)."""
        return next((seconds for known, seconds in self.measured if known == config), None)

    def next_batch(self, count: int) -> list[Config]:
        """Up to `count` new configs to measure (fewer, or none, once the space is exhausted)."""
        batch: list[Config] = []
        fallback = self.space.fallback
        if fallback.index not in self.visited:
            batch.append(fallback)
            self.visited.add(fallback.index)
        for config in self.propose(count - len(batch)) if count > len(batch) else []:
            if config.index not in self.visited:
                self.visited.add(config.index)
                batch.append(config)
        return batch

    def propose(self, count: int) -> list[Config]:
        """Up to `count` valid configs not visited yet."""
        raise NotImplementedError

    def random_configs(self, count: int) -> list[Config]:
        return [self.space.get(index) for index in self.points.sample(self.rng, self.visited, count)]

    def update(self, results: Sequence, trials: bool = True) -> None:
        """Learn from measurements; `trials=False` for results of an earlier run being resumed, which count as
        visited (never proposed again) and known, but not as this run's trials."""
        for result in results:
            config = result.config
            self.visited.add(config.index)
            seconds = result.seconds if result.seconds is not None and math.isfinite(result.seconds) else None
            self.measured.append((config, seconds))
            if trials:
                self.trials += 1
            if seconds is not None and (self.best_seconds is None or seconds < self.best_seconds):
                self.best_config, self.best_seconds, self.best_trial = config, seconds, self.trials

    def tune(
        self,
        trials: int,
        measure: Callable[[list[Config]], list],
        batch_size: int = BATCH_SIZE,
        early_stopping: int | None = None,
        callbacks: Sequence[Callback] = (),
        progress: Callable[[Tuner, list], Progress] | None = None,
    ) -> Tuner:
        """Measure up to `trials` configs, `batch_size` at a time, stopping early once `early_stopping` trials in a
        row found nothing faster. Each callback gets a Progress after each batch."""
        start = self.trials
        while self.trials - start < trials and self.has_next():
            batch = self.next_batch(min(batch_size, trials - (self.trials - start)))
            if not batch:
                break
            results = measure(batch)
            if len(results) != len(batch):
                raise TuningError(f"measure returned {len(results)} results for a batch of {len(batch)} configs")
            self.update(results)
            report = progress(self, results) if progress else self.progress(results, start + trials)
            for callback in callbacks:
                callback(report)
            if early_stopping is not None and self.trials - max(self.best_trial, start) >= early_stopping:
                break
        return self

    def progress(self, results: list, budget: int) -> Progress:
        return Progress(self.task, self.trials, budget, self.best_seconds, self.best_config, list(results))


class GridTuner(Tuner):
    """Every valid config in index order (the first knob varies fastest)."""

    def __init__(self, task: Task, seed: int = 0):
        super().__init__(task, seed)
        self.cursor = 0

    def propose(self, count: int) -> list[Config]:
        batch = []
        while len(batch) < count and self.cursor < self.space.size:
            index, self.cursor = self.cursor, self.cursor + 1
            if index not in self.visited and self.points.valid(index):
                batch.append(self.space.get(index))
        return batch


class RandomTuner(Tuner):
    """Valid configs drawn uniformly without repeats."""

    def propose(self, count: int) -> list[Config]:
        return self.random_configs(count)


def _mutate(config: Config, rng: np.random.Generator, rate: float) -> dict[str, int]:
    """A copy of `config`'s choices where each knob, with probability `rate` (at least one knob), takes another
    of its choices."""
    choices = dict(config.choices)
    knobs = [name for name, knob in config.space.knobs.items() if len(knob.choices) > 1]
    if not knobs:
        return choices
    changed = [name for name in knobs if rng.random() < rate] or [knobs[int(rng.integers(len(knobs)))]]
    for name in changed:
        other = int(rng.integers(len(config.space.knobs[name].choices) - 1))
        choices[name] = other + (other >= choices[name])
    return choices


class GATuner(Tuner):
    """A genetic search: each new config is a crossover of two parents drawn by fitness (score, cost_model.scores)
    from the best measured configs, knob by knob, then mutated; children that are invalid or seen are redrawn."""

    def __init__(self, task: Task, seed: int = 0, population: int = 16, elite: int = 4, mutation: float = 0.2):
        super().__init__(task, seed)
        self.population, self.elite, self.mutation = population, elite, mutation

    def propose(self, count: int) -> list[Config]:
        measured = [(config, seconds) for config, seconds in self.measured if seconds is not None]
        if len(measured) < 2:
            return self.random_configs(count)
        measured.sort(key=lambda item: item[1])
        parents = [config for config, _ in measured[: self.population]]
        fitness = scores([seconds for _, seconds in measured[: self.population]])
        fitness[: self.elite] *= 2.0  # the elite breed more often
        weights = fitness / fitness.sum() if fitness.sum() > 0 else None
        batch: list[Config] = []
        taken = set(self.visited)
        for _ in range(SAMPLE_ATTEMPTS * count):
            if len(batch) == count:
                break
            first, second = (parents[i] for i in self.rng.choice(len(parents), 2, p=weights))
            mask = self.rng.random(len(first.choices)) < 0.5
            child = {name: (first if keep else second).choices[name] for name, keep in zip(first.choices, mask)}
            candidate = Config(self.space, _mutate(Config(self.space, child), self.rng, self.mutation))
            if candidate.index not in taken and candidate.valid:
                taken.add(candidate.index)
                batch.append(candidate)
        # a population that breeds only configs seen already: widen the search
        return batch + [config for config in self.random_configs(count - len(batch)) if config.index not in taken]


class XGBTuner(Tuner):
    """Model-guided search (AutoTVM's XGBTuner): before each batch, gradient-boosted trees are fit to the task's
    measurements (features.py's features, cost_model.scores) and rank candidates: every unvisited valid config of
    a space of up to `pool` of them, else the points a simulated-annealing walk under the model visits. The batch
    is the best-ranked, with a fraction `exploration` drawn at random so that the model sees what it mispredicts.
    `pretrained`: a cost model of other tasks (cost_model.pretrain) that ranks the first batches."""

    def __init__(
        self,
        task: Task,
        seed: int = 0,
        objective: str = "rank",
        pretrained: CostModel | None = None,
        exploration: float = 0.1,
        pool: int = 1024,
        walkers: int = 32,
        steps: int = 24,
    ):
        super().__init__(task, seed)
        self.featurizer = featurizer_of(task)
        self.objective, self.seed, self.pretrained = objective, seed, pretrained
        self.exploration, self.pool, self.walkers, self.steps = exploration, pool, walkers, steps
        self.model: CostModel | None = pretrained

    def propose(self, count: int) -> list[Config]:
        if sum(seconds is not None for _, seconds in self.measured) >= 2:
            configs = [config for config, _ in self.measured]
            model = CostModel(self.objective, self.seed + len(configs), base=self.pretrained)
            self.model = model.fit(self.featurizer(configs), scores([seconds for _, seconds in self.measured]))
        if self.model is None:
            return self.random_configs(count)
        explored = int(round(count * self.exploration)) if self.measured else 0
        candidates = self.candidates(count - explored)
        ranking = np.argsort(-self.model.predict(self.featurizer(candidates)), kind="stable") if candidates else []
        batch = [candidates[position] for position in ranking[: count - explored]]
        chosen = self.visited | {config.index for config in batch}
        extra = [self.space.get(index) for index in self.points.sample(self.rng, chosen, count - len(batch))]
        return batch + extra

    def candidates(self, count: int) -> list[Config]:
        """The unvisited valid configs the model ranks: all of them when they are few, else a walk's best."""
        if self.points.listed is not None and self.points.count() - len(self.visited) <= self.pool:
            return [self.space.get(index) for index in self.points.listed if index not in self.visited]
        return self.anneal(count)

    def anneal(self, count: int) -> list[Config]:
        """Simulated annealing under the model: walkers start at the best measured configs (and random ones),
        step to a mutated neighbour, keep it when the model scores it higher or by the Metropolis rule as the
        temperature falls to zero; the `count` best unvisited valid points any walker reached."""
        measured = sorted((item for item in self.measured if item[1] is not None), key=lambda item: item[1])
        starts = [config for config, _ in measured[: self.walkers // 2]]
        starts += self.random_configs(self.walkers - len(starts))
        if not starts:
            return []
        current = starts
        current_scores = self.model.predict(self.featurizer(current))
        seen: dict[int, tuple[float, Config]] = {}
        for step in range(self.steps):
            temperature = 1.0 - step / self.steps
            proposals = []
            for config in current:
                for _ in range(SAMPLE_ATTEMPTS):
                    neighbour = Config(self.space, _mutate(config, self.rng, 0.0))
                    if neighbour.valid:
                        break
                else:
                    neighbour = config
                proposals.append(neighbour)
            proposal_scores = self.model.predict(self.featurizer(proposals))
            spread = float(np.std(proposal_scores)) or 1.0
            for position, (config, score) in enumerate(zip(proposals, proposal_scores)):
                if config.index not in self.visited:
                    seen[config.index] = (float(score), config)
                gain = (score - current_scores[position]) / spread
                if gain >= 0 or self.rng.random() < math.exp(gain / max(temperature, 1e-3)):
                    current[position], current_scores[position] = config, score
        best = sorted(seen.values(), key=lambda item: -item[0])[:count]
        return [config for _, config in best]


TUNERS: dict[str, type[Tuner]] = {"grid": GridTuner, "random": RandomTuner, "ga": GATuner, "xgb": XGBTuner}


def make_tuner(name: str, task: Task, seed: int = 0, **options) -> Tuner:
    if name not in TUNERS:
        raise TuningError(f"unknown tuner {name!r}; choose one of {', '.join(TUNERS)}")
    return TUNERS[name](task, seed=seed, **options)


# -- a whole model ---------------------------------------------------------------------------------------------------


@dataclass
class TaskResult:
    """One task's outcome under tune_model: its fallback's and its best config's seconds, trials spent, and the
    confirmation (measure.py's Measurer.confirm) that decided which config a compile gets, when the measurer has one."""

    task: Task
    tuner: Tuner = field(repr=False)
    fallback_seconds: float | None = None
    confirmation: object | None = None

    @property
    def chosen_config(self) -> Config | None:
        """The config a compile with this run's records gets: the confirmed one, else the search's best."""
        return self.confirmation.chosen if self.confirmation is not None else self.best_config

    @property
    def chosen_seconds(self) -> float | None:
        return self.confirmation.chosen_seconds if self.confirmation is not None else self.best_seconds

    @property
    def default_seconds(self) -> float | None:
        """The fallback's time, from the confirmation's rounds when there are some (measured beside the choice)."""
        if self.confirmation is not None and self.confirmation.fallback_seconds is not None:
            return self.confirmation.fallback_seconds
        return self.fallback_seconds

    @property
    def best_seconds(self) -> float | None:
        return self.tuner.best_seconds

    @property
    def best_config(self) -> Config | None:
        return self.tuner.best_config

    @property
    def trials(self) -> int:
        return self.tuner.trials


def split_budget(budget: int, weights: Sequence[float], caps: Sequence[float]) -> list[int]:
    """`budget` trials shared in proportion to `weights`, no share above its cap (what a share cannot use goes to
    the others, in the same proportions); whole trials, the remainders to the largest fractions."""
    shares = [0.0] * len(weights)
    open_ = [i for i, weight in enumerate(weights) if weight > 0 and caps[i] > 0]
    left = float(budget)
    while open_ and left > 1e-9:
        total = sum(weights[i] for i in open_)
        capped = [i for i in open_ if shares[i] + left * weights[i] / total >= caps[i]]
        if not capped:
            for i in open_:
                shares[i] += left * weights[i] / total
            break
        for i in capped:
            left -= caps[i] - shares[i]
            shares[i] = float(caps[i])
        open_ = [i for i in open_ if i not in capped]
    whole = [math.floor(share) for share in shares]
    order = sorted(range(len(shares)), key=lambda i: whole[i] - shares[i])
    for i in order[: int(round(sum(shares))) - sum(whole)]:
        whole[i] += 1
    return whole


def tune_model(
    tasks: Sequence[Task],
    measurer_factory: Callable[[Task], object],
    trials: int,
    tuner: str = "xgb",
    early_stopping: int | None = None,
    batch_size: int = BATCH_SIZE,
    callbacks: Sequence[Callback] = (),
    seed: int = 0,
    history: Mapping[str, Sequence] | None = None,
    confirm: int = 3,
    **tuner_options,
) -> list[TaskResult]:
    """Tune a model's tasks (extract_tasks) within `trials` measurements in all. Each task with a choice to make
    first measures its fallback; the rest of the budget goes to the tasks in order of weight x fallback seconds
    (their share of the model's time), each given its share of what is left, so the trials a task leaves unused
    (early stopping, a small space) go to the tasks after it. `measurer_factory(task)` gives an object with
    `measure(configs) -> results`, made when the task is first measured; `history` (task key -> results of an
    earlier run) resumes a run: those configs are known and never measured again. When the search is done, each task
    whose measurer can `confirm(configs)` re-measures its `confirm` best configs beside the fallback, which decides
    the config its records give a compile (a single lucky measurement on a loaded machine cannot)."""
    results = [
        TaskResult(task, make_tuner(tuner, task, seed, **tuner_options)) for task in tasks if len(task.space) > 1
    ]
    measurers: dict[int, object] = {}

    def spent() -> int:
        return sum(result.trials for result in results)

    def run(number: int, result: TaskResult, count: int, **options) -> None:
        def progress(tuner: Tuner, batch: list) -> Progress:
            estimate = sum(item.task.weight * (item.best_seconds or item.fallback_seconds or 0.0) for item in results)
            report = tuner.progress(batch, budget)
            report.task_number, report.task_count = number, len(results)
            report.model_trials, report.model_budget, report.estimated_seconds = spent(), trials, estimate
            return report

        budget = result.trials + count
        if number not in measurers:
            measurers[number] = measurer_factory(result.task)
        result.tuner.tune(count, measurers[number].measure, callbacks=callbacks, progress=progress, **options)

    for result in results:
        if history and result.task.key in history:
            result.tuner.update(history[result.task.key], trials=False)
    for number, result in enumerate(results, 1):
        if spent() < trials and result.task.space.fallback.index not in result.tuner.visited:
            run(number, result, 1)
        result.fallback_seconds = result.tuner.seconds_of(result.task.space.fallback)
    known = [result.fallback_seconds for result in results if result.fallback_seconds is not None]
    typical = float(np.mean(known)) if known else 1.0
    weights = {
        number: result.task.weight * (result.fallback_seconds if result.fallback_seconds is not None else typical)
        for number, result in enumerate(results, 1)
    }
    order = sorted(weights, key=lambda number: -weights[number])
    for position, number in enumerate(order):
        pending = order[position:]
        caps = [results[other - 1].tuner.remaining() for other in pending]
        share = split_budget(trials - spent(), [weights[other] for other in pending], caps)[0]
        if share > 0:
            run(number, results[number - 1], share, batch_size=batch_size, early_stopping=early_stopping)
    for number, result in enumerate(results, 1):
        best = _best_configs(result.tuner, confirm)
        if confirm and best and hasattr(measurers.get(number), "confirm"):
            result.confirmation = measurers[number].confirm(best)
    return results


def _best_configs(tuner: Tuner, count: int) -> list[Config]:
    """The `count` fastest configs a tuner measured, the fallback left out (it is always re-measured beside them)."""
    measured = sorted((seconds, config.index, config) for config, seconds in tuner.measured if seconds is not None)
    fallback = tuner.space.fallback
    return [config for _, _, config in measured if config != fallback][:count]
