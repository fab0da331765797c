"""Confirmation (Measurer.confirm under tune_model): on a loaded machine one measurement says little, so the search's
best configs are measured again beside the fallback in interleaved rounds, and a config reaches a compile only when
the rounds show it faster. A synthetic runner whose times are noisy around known means stands in for the load."""

import json

import numpy as np

from compiler.target import Target
from compiler.tune.measure import Built, Measurer, confirmed_faster
from compiler.tune.records import RecordLog, best_records, load_records, read_records
from compiler.tune.report import summarize
from compiler.tune.tuners import tune_model
from tests.tune.test_measure import small_conv_task


class FakeBuilder:
    """Every config 'builds' at once into an empty library: the runner below never calls it."""

    def build(self, jobs):
        return [Built(job.config, job.target, job.name, b"") for job in jobs]

    def close(self):
        pass


class NoisyRunner:
    """Times drawn around a mean per config (`means`, by config JSON; `default` for the others) with a spread of
    `noise` times the mean, except that the first measurement of each config in `lucky` comes out at `lucky` times
    its mean: the quiet moment that, kept as the single fastest record, used to decide a compile."""

    def __init__(self, means: dict, default: float, noise: float = 0.15, lucky: dict | None = None, seed: int = 0):
        self.means, self.default, self.noise, self.lucky = means, default, noise, dict(lucky or {})
        self.rng = np.random.default_rng(seed)
        self.calls: dict[str, int] = {}

    def run(self, built):
        times = []
        for candidate in built:
            key = json.dumps(candidate.config, sort_keys=True)
            mean = self.means.get(key, self.default)
            self.calls[key] = self.calls.get(key, 0) + 1
            if key in self.lucky and self.calls[key] == 1:
                times.append((mean * self.lucky[key], None))
            else:
                times.append((mean * float(np.exp(self.rng.normal(0.0, self.noise))), None))
        return times

    def outputs(self, built):
        return []

    def close(self):
        pass


def run_tuning(tmp_path, means, default, lucky=None, trials=24):
    task = small_conv_task()
    log_path = tmp_path / "log.jsonl"
    runner = NoisyRunner(means, default, lucky=lucky)
    with RecordLog(log_path) as log:
        results = tune_model(
            [task], lambda task: Measurer(task, Target.parse("llvm"), runner, builder=FakeBuilder(), records=log),
            trials, tuner="grid",
        )  # fmt: skip
    return task, results[0], log_path


def key_of(config) -> str:
    return json.dumps(config.to_json(), sort_keys=True)


def test_a_lucky_measurement_of_a_slower_config_does_not_reach_the_compile(tmp_path):
    task = small_conv_task()
    fallback = task.space.fallback
    # the grid visits configs in index order: the first non-fallback one is measured once at a fifth of its mean
    slower = next(task.space.get(index) for index in range(len(task.space)) if task.space.get(index) != fallback)
    means = {key_of(fallback): 1.0e-3, key_of(slower): 1.3e-3}
    task, result, log_path = run_tuning(tmp_path, means, 2.0e-3, lucky={key_of(slower): 0.2})
    # the search alone is fooled: its best is the slower config's lucky time
    assert result.best_config == slower and result.best_seconds < 0.5e-3
    assert result.chosen_config == fallback
    records = read_records(log_path)
    chosen = [record for record in records if record.get("chosen")]
    assert len(chosen) == 1 and chosen[0]["config"] == fallback.to_json() and len(chosen[0]["confirmation"]) == 5
    assert load_records(log_path)[task.key] == fallback.to_json()
    # without its confirmation records, the old rule (the single fastest) would have picked the slower config
    unconfirmed = [record for record in records if "confirmation" not in record]
    assert best_records(unconfirmed)[task.key]["config"] == slower.to_json()
    (summary,) = summarize(log_path)
    assert summary.confirmed and summary.best_config == fallback.to_json() and summary.speedup == 1.0


def test_a_config_faster_through_the_noise_is_confirmed_and_chosen(tmp_path):
    task = small_conv_task()
    fallback = task.space.fallback
    faster = task.space.get(len(task.space) // 2)
    assert faster != fallback
    means = {key_of(fallback): 1.0e-3, key_of(faster): 0.7e-3}
    task, result, log_path = run_tuning(tmp_path, means, 2.0e-3, trials=len(task.space))
    assert result.chosen_config == faster
    # the fastest of five rounds with 15% spread: a little below the means
    assert 0.5e-3 < result.chosen_seconds < 0.75e-3 and 0.7e-3 < result.default_seconds < 1.05e-3
    assert load_records(log_path)[task.key] == faster.to_json()


def test_confirmed_faster_needs_a_gain_beyond_the_rounds_spread():
    fallback = [1.0, 1.0, 1.0, 1.0, 1.0]
    assert confirmed_faster([0.8, 0.82, 0.79, 0.81, 0.8], fallback)
    assert not confirmed_faster([0.99, 0.995, 0.99, 0.99, 0.99], fallback)  # within MIN_GAIN
    assert not confirmed_faster([0.5, 1.4, 0.6, 1.3, 0.9], fallback)  # the median gains, the spread does not support it
    assert not confirmed_faster([0.8, None, 0.8, 0.8, 0.8], fallback)  # a failed round
    # real rounds (ms) of a vit_tiny MatMul on wasm at load 11, where each timing lands in a fast or a ~2.5x slower
    # state: the fallback drew the fast one once, the candidate four times, so its median (1.00 against 1.68) and
    # ratios favour it, but the fastest rounds show it 1.6x slower (as it is inside the compiled module)
    assert not confirmed_faster([2.637, 1.0, 0.994, 1.035, 1.001], [1.678, 1.811, 1.566, 0.619, 2.06])
    # paired ratios of 0.9 in four rounds, but the candidate's slow rounds put its median (9) above the fallback's (1)
    assert not confirmed_faster([0.9, 0.9, 9.0, 9.0, 20.0], [1.0, 1.0, 1.0, 10.0, 10.0])


def test_logs_without_confirmations_still_load_their_fastest_record(tmp_path):
    task = small_conv_task()
    fallback, other = task.space.fallback, task.space.get(1)
    log_path = tmp_path / "old.jsonl"
    with RecordLog(log_path) as log:
        log.write(task.to_json(), fallback.to_json(), 2e-3, None, fallback=True)
        log.write(task.to_json(), other.to_json(), 1e-3, None)
    assert load_records(log_path)[task.key] == other.to_json()
