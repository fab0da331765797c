"""Tuning on the visitor's own device ("Tune on this device"): the service searches a model's wasm schedule spaces
with tune_model while a connected page times each candidate in its own WebAssembly engine and posts the times (and
its outputs, which the service checks against the fallback's) back. The log that results is the page's to compile
with (POST /api/compile with the field `records`). A driver beside app.py: it sees every stage through compiler.tune."""

from __future__ import annotations

import base64
import json
import queue
import secrets
import threading
import time
from pathlib import Path

import numpy as np

from compiler.errors import TesselError
from compiler.runtime.wasm import memory_import
from compiler.tune.measure import Built, LocalBuilder, Measurer, mismatch, probe_arrays
from compiler.tune.records import RecordLog
from compiler.tune.task import extract_tasks
from compiler.tune.tuners import tune_model

# A page gets this long to answer one candidate; after one goes unanswered the session stops asking.
ANSWER_SECONDS = 60.0
MAX_TRIALS = 256
MAX_SESSIONS = 2
TUNER = "xgb"


class Abandoned(Exception):
    """No page answered in time: the session fails its remaining candidates at once."""


def _encode(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


class BrowserRunner:
    """A runner (measure.py) whose one device is the page connected to the session."""

    devices = 1

    def __init__(self, session: TuningSession):
        self.session = session

    def run(self, built: list[Built]) -> list[tuple[float | None, str | None]]:
        answers = []
        for candidate in built:
            try:
                answer = self.session.ask(candidate, timed=True)
            except Abandoned as reason:
                answers.append((None, f"timeout: {reason}"))
                continue
            if answer.get("error"):
                answers.append((None, f"run: {answer['error']}"))
                continue
            try:
                outputs = self.session.decode_outputs(candidate, answer)
                seconds = float(answer["seconds"])
            except (TesselError, KeyError, TypeError, ValueError) as error:
                answers.append((None, f"run: the page's answer is not a measurement ({error})"))
                continue
            wrong = mismatch(outputs, candidate.reference) if candidate.reference is not None else None
            answers.append((None, wrong) if wrong else (seconds, None))
        return answers

    def outputs(self, built: Built) -> list[np.ndarray]:
        try:
            answer = self.session.ask(built, timed=False)
        except Abandoned as reason:
            raise TesselError(f"the page stopped tuning: {reason}") from None
        if answer.get("error"):
            raise TesselError(f"the page could not run the fallback kernel: {answer['error']}")
        return self.session.decode_outputs(built, answer)

    def close(self) -> None:
        return None


class TuningSession:
    """One model tuned for one page: a thread runs tune_model; `next_candidate` hands the page what to time and
    `answer` takes its reply. States: tuning, done, failed."""

    def __init__(self, model_path: Path, log_path: Path, trials: int, make_builder=None):
        self.id = secrets.token_hex(16)
        # what builds the candidates: a process here, or Ray tasks under `tessel serve --ray` (RayBuilder)
        self.make_builder = make_builder or (lambda: LocalBuilder(1))
        self.model_path, self.log_path, self.trials = model_path, log_path, trials
        self.state, self.error = "tuning", None
        self.measured = 0
        self.best_seconds: float | None = None
        self.estimated_seconds: float | None = None
        self.tasks = 0
        self.pending: queue.Queue = queue.Queue()
        self.answers: dict[int, dict] = {}
        self.answered = threading.Condition()
        self.numbers = iter(range(1, 1 << 62))
        self.abandoned = False
        self.thread = threading.Thread(target=self._tune, daemon=True)

    def start(self) -> TuningSession:
        self.thread.start()
        return self

    # -- the tuning thread --

    def _tune(self) -> None:
        builder = self.make_builder()
        try:
            tasks = extract_tasks(str(self.model_path), "wasm")
            self.tasks = len(tasks)
            runner = BrowserRunner(self)
            with RecordLog(self.log_path) as log:

                def measurer(task):
                    return Measurer(task, "wasm", runner, builder=builder, records=log, callbacks=[self._measured])

                tune_model(tasks, measurer, self.trials, tuner=TUNER, callbacks=[self._progress])
            self.state = "done"
        except Exception as error:  # noqa: BLE001 - the page is told, the service goes on
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
        finally:
            builder.close()
            self.pending.put(None)

    def _measured(self, task, result) -> None:
        self.measured += 1

    def _progress(self, report) -> None:
        self.best_seconds, self.estimated_seconds = report.best_seconds, report.estimated_seconds

    def ask(self, built: Built, timed: bool) -> dict:
        """Queue `built` for the page and wait for its answer."""
        if self.abandoned:
            raise Abandoned("no page is connected to this tuning session")
        number = next(self.numbers)
        self.pending.put((number, built, timed))
        deadline = time.monotonic() + ANSWER_SECONDS + built.timing.timeout
        with self.answered:
            while number not in self.answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.abandoned = True
                    raise Abandoned(f"no page answered candidate {number} in {ANSWER_SECONDS:g} s")
                self.answered.wait(left)
            return self.answers.pop(number)

    @staticmethod
    def decode_outputs(built: Built, answer: dict) -> list[np.ndarray]:
        outputs = []
        for spec, text in zip(built.specs[len(built.specs) - built.outputs :], answer.get("outputs", [])):
            data = np.frombuffer(base64.b64decode(text), np.dtype(spec.dtype))
            if data.size != int(np.prod(spec.shape)):
                raise TesselError(f"the page sent {data.size} elements for output {spec.name!r} of shape {spec.shape}")
            outputs.append(data.reshape(spec.shape))
        if len(outputs) != built.outputs:
            raise TesselError(f"the page sent {len(outputs)} outputs, the kernel has {built.outputs}")
        return outputs

    # -- the page's side --

    def next_candidate(self, wait: float) -> dict:
        """What the page should do next: time a candidate, wait and ask again, or stop (done or failed)."""
        try:
            item = self.pending.get(timeout=wait)
        except queue.Empty:
            return {"state": self.state, "wait": True, **self.status()}
        if item is None:
            self.pending.put(None)
            return {"state": self.state, **self.status()}
        number, built, timed = item
        arrays = probe_arrays(built.specs, built.outputs, built.seed)
        return {
            "state": self.state,
            "candidate": {
                "number": number,
                "name": built.name,
                "wasm": base64.b64encode(built.library).decode(),
                "memory": memory_import(built.library),
                "arrays": [_encode(array) for array in arrays],
                "outputs": built.outputs,
                "timed": timed,
                "repeat": built.timing.repeat,
                "number_of_calls": built.timing.number,
            },
            **self.status(),
        }

    def answer(self, body: dict) -> None:
        number = body.get("number")
        if not isinstance(number, int):
            raise TesselError('an answer names its candidate: {"number": N, "seconds": ..., "outputs": [...]}')
        with self.answered:
            self.answers[number] = body
            self.answered.notify_all()

    def status(self) -> dict:
        return {
            "session": self.id,
            "measured": self.measured,
            "trials": self.trials,
            "tasks": self.tasks,
            "best_seconds": self.best_seconds,
            "estimated_seconds": self.estimated_seconds,
            "error": self.error,
        }


class Sessions:
    """The service's tuning sessions, at most MAX_SESSIONS tuning at once."""

    def __init__(self, folder: Path, make_builder=None):
        self.folder = folder
        self.make_builder = make_builder
        self.sessions: dict[str, TuningSession] = {}

    def start(self, model: bytes, trials: int) -> TuningSession:
        if not 1 <= trials <= MAX_TRIALS:
            raise TesselError(f"trials must be between 1 and {MAX_TRIALS}, not {trials}")
        if sum(session.state == "tuning" for session in self.sessions.values()) >= MAX_SESSIONS:
            raise TesselError(f"this server tunes {MAX_SESSIONS} models at a time; try again when one finishes")
        name = secrets.token_hex(8)
        model_path, log_path = self.folder / f"{name}.tune.onnx", self.folder / f"{name}.tune.jsonl"
        model_path.write_bytes(model)
        session = TuningSession(model_path, log_path, trials, self.make_builder)
        self.sessions[session.id] = session
        return session.start()

    def get(self, session_id: str) -> TuningSession | None:
        return self.sessions.get(session_id)

    def records(self, session: TuningSession) -> bytes:
        return session.log_path.read_bytes() if session.log_path.is_file() else b""


def parse_answer(data: bytes) -> dict:
    try:
        body = json.loads(data)
    except ValueError:
        raise TesselError("an answer is a JSON object") from None
    if not isinstance(body, dict):
        raise TesselError("an answer is a JSON object")
    return body
