"""``bigembed tune``: hyperparameter search with Optuna, each trial an ordinary training.

The config's ``tune`` section names config keys (as ``-p`` takes them) and their
distributions; ``early_stopping`` names the validation edges. Every trial is the config with
the sampled values and its own ``checkpoint_path`` (``OUTPUT/trial_N/model``), trained by
:func:`~bigembed.selection.early_stopping.train_model`: it evaluates on the validation edges
every ``early_stopping.every`` epochs, reports each value to Optuna, and stops when Optuna's
pruner says the trial is worse than the median of earlier ones at the same epoch (or when early
stopping ends it). A trial's value is its best validation metric (the version kept in
``best/``).

The study lives in ``OUTPUT/study.db`` (SQLite), so an interrupted search resumes where it was:
finished trials are kept, a trial that was running when the process died is marked failed and
its parameters are tried again. At the end :class:`TuneResult` has the table of trials and the
best config, which the command writes to ``OUTPUT/best_config.yaml``: the best trial's config,
its ``checkpoint_path`` that trial's checkpoint (``OUTPUT/trial_N/model``, kept), so that
``bigembed train best_config.yaml`` reuses the model the study found instead of resuming (or
being refused by) whatever the user's own ``checkpoint_path`` holds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigembed.checkpoints import CheckpointStore
from bigembed.config import (
    ConfigSchema,
    TuneParamSchema,
    TuneSchema,
    apply_overrides,
    config_to_dict,
    parse_config_dict,
)
from bigembed.errors import BigembedError, ConfigError
from bigembed.selection.early_stopping import Evaluation, train_model
from bigembed.train import StopTraining

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

STUDY_FILE = "study.db"
STUDY_NAME = "bigembed"


@dataclass
class TrialRow:
    """One line of the results table."""

    number: int
    state: str  # complete | pruned | failed
    value: float | None
    params: dict[str, Any]
    epochs: int
    checkpoint: str
    note: str = ""


@dataclass
class TuneResult:
    """The finished study: every trial, and the best one's config."""

    metric: str
    rows: list[TrialRow]
    best: TrialRow | None
    best_config: dict[str, Any] | None
    ran: int  # trials run by this call (the rest were resumed from the study)
    param_names: list[str] = field(default_factory=list)

    def table(self) -> str:
        head = ["trial", "state", self.metric, "epochs", *self.param_names]
        lines = [head]
        for r in self.rows:
            value = "-" if r.value is None else f"{r.value:.4f}"
            cells = [str(r.number), r.state, value, str(r.epochs)]
            cells += [_show(r.params.get(p)) for p in self.param_names]
            lines.append(cells)
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
        return "\n".join(line.rstrip() for line in out)

    def tsv(self) -> str:
        head = ["trial", "state", self.metric, "epochs", *self.param_names, "checkpoint", "note"]
        rows = ["\t".join(head)]
        for r in self.rows:
            value = "" if r.value is None else repr(r.value)
            cells = [str(r.number), r.state, value, str(r.epochs)]
            cells += ["" if r.params.get(p) is None else str(r.params[p]) for p in self.param_names]
            rows.append("\t".join([*cells, r.checkpoint, r.note]))
        return "\n".join(rows) + "\n"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise BigembedError(
            "bigembed tune needs Optuna: pip install 'bigembed[tune]' (or pip install optuna)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _override_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


class Tuner:
    """One search: ``cfg`` (with ``tune`` and ``early_stopping``), results under ``output``."""

    def __init__(
        self,
        cfg: ConfigSchema,
        output: str | Path,
        *,
        source: str = "<config>",
        report: Callable[[str], None] | None = None,
        n_trials: int | None = None,
        progress: bool = False,
    ) -> None:
        if cfg.tune is None:
            raise ConfigError(
                f"{source}: tune: missing; add a tune section with params (the search space) "
                "and n_trials (see docs/tuning.md)"
            )
        if cfg.early_stopping is None:
            raise ConfigError(
                f"{source}: early_stopping: missing; bigembed tune needs validation edges "
                "(early_stopping.valid_path) to compare trials"
            )
        if not cfg.tune.params:
            raise ConfigError(f"{source}: tune.params: empty; name at least one config key")
        self.cfg = cfg
        self.tune: TuneSchema = cfg.tune
        self.metric = cfg.early_stopping.metric
        self.output = Path(output)
        self.source = source
        self.report = report or (lambda line: None)
        self.n_trials = n_trials if n_trials is not None else self.tune.n_trials
        self.progress = progress  # each trial's training and evaluation progress bars
        self.base = config_to_dict(cfg)
        self.base["tune"] = None
        for key, spec in self.tune.params.items():
            self._check_param(key, spec)

    # ------------------------------------------------------------------ search space
    def _check_param(self, key: str, spec: TuneParamSchema) -> None:
        where = f"{self.source}: tune.params.{key}"
        if spec.type == "float" and spec.log and spec.step is not None:
            raise ConfigError(f"{where}: log and step cannot be combined (Optuna's rule)")
        if key.split(".")[0] in ("tune", "checkpoint_path", "early_stopping"):
            raise ConfigError(f"{where}: this key is not tunable")
        example = spec.choices[0] if spec.choices else spec.low
        if spec.type == "int" and example is not None:
            example = int(example)
        try:
            apply_overrides(self.base, [f"{key}={_override_text(example)}"], ConfigSchema, where)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(f" -p {key}=", " value ")) from None

    def _sample(self, trial: optuna.Trial) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, spec in self.tune.params.items():
            if spec.type == "categorical":
                out[key] = trial.suggest_categorical(key, spec.choices or [])
            elif spec.type == "int":
                assert spec.low is not None and spec.high is not None
                step = int(spec.step) if spec.step else 1
                out[key] = trial.suggest_int(
                    key, int(spec.low), int(spec.high), step=step, log=spec.log
                )
            else:
                assert spec.low is not None and spec.high is not None
                out[key] = trial.suggest_float(
                    key, spec.low, spec.high, step=spec.step, log=spec.log
                )
        return out

    def trial_config(self, number: int, params: dict[str, Any]) -> ConfigSchema:
        """The config of trial ``number``: the base one, ``params`` set, its own checkpoint."""
        where = f"{self.source}: trial {number}"
        overrides = [f"{k}={_override_text(v)}" for k, v in params.items()]
        data = apply_overrides(self.base, overrides, ConfigSchema, where)
        data["checkpoint_path"] = str(self.trial_dir(number) / "model")
        return parse_config_dict(data, where)

    def trial_dir(self, number: int) -> Path:
        return self.output / f"trial_{number}"

    # ------------------------------------------------------------------ the study
    def _study(self) -> Any:
        optuna = _optuna()
        seed = self.cfg.seed
        sampler = (
            optuna.samplers.RandomSampler(seed=seed)
            if self.tune.sampler == "random"
            else optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.tune.startup_trials)
        )
        pruner = (
            optuna.pruners.NopPruner()
            if self.tune.pruner == "none"
            else optuna.pruners.MedianPruner(n_startup_trials=self.tune.startup_trials)
        )
        self.output.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{(self.output / STUDY_FILE).resolve()}"
        return optuna.create_study(
            study_name=STUDY_NAME,
            storage=storage,
            direction="maximize",
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
        )

    def run(self) -> TuneResult:
        optuna = _optuna()
        states = optuna.trial.TrialState
        study = self._study()
        for t in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
            # its process died mid-trial: close it as failed and try its parameters again
            study.tell(t.number, state=states.FAIL)
            study.enqueue_trial(t.params, skip_if_exists=False)
            self.report(f"trial {t.number}: interrupted earlier; its parameters run again")
        ran = 0
        while (count := self._counted(study, states)) < self.n_trials:
            self._run_trial(study, optuna, count + 1)
            ran += 1
        return self._result(study, optuna, ran)

    @staticmethod
    def _counted(study: Any, states: Any) -> int:
        """Trials that count towards n_trials: finished ones, not the interrupted (a genuine
        failure carries a note)."""
        done = study.get_trials(
            deepcopy=False, states=(states.COMPLETE, states.PRUNED, states.FAIL)
        )
        return sum(1 for t in done if t.state != states.FAIL or "note" in t.user_attrs)

    def _run_trial(self, study: Any, optuna: Any, position: int) -> None:
        trial = study.ask()
        params = self._sample(trial)
        shown = " ".join(f"{k}={_show(v)}" for k, v in params.items())
        self.report(f"trial {trial.number} ({position}/{self.n_trials}): {shown}")
        try:
            cfg = self.trial_config(trial.number, params)
        except ConfigError as exc:
            trial.set_user_attr("note", f"invalid config: {exc}")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.report(f"trial {trial.number}: failed: {exc}")
            return
        trial.set_user_attr("checkpoint", cfg.checkpoint_path)
        pruned: list[int] = []

        def on_evaluation(ev: Evaluation) -> None:
            trial.report(ev.value, step=ev.epoch)
            if trial.should_prune():
                pruned.append(ev.epoch)
                raise StopTraining(f"pruned after epoch {ev.epoch}")

        def report(line: str) -> None:
            self.report(f"  trial {trial.number}: {line}")

        train_model(cfg, progress=self.progress, report=report, on_evaluation=on_evaluation)
        store = CheckpointStore(cfg.checkpoint_path)
        evaluations = store.read_validation()
        trial.set_user_attr("epochs", int(evaluations[-1]["epoch"]) if evaluations else 0)
        best = store.read_best()
        if pruned:
            trial.set_user_attr("note", f"pruned after epoch {pruned[0]}")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.report(f"trial {trial.number}: pruned after epoch {pruned[0]}")
            return
        if best is None or not math.isfinite(float(best["value"])):
            trial.set_user_attr("note", "no validation result")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.report(f"trial {trial.number}: failed: no validation result")
            return
        value = float(best["value"])
        trial.set_user_attr("best_version", int(best["version"]))
        trial.set_user_attr("note", f"best at epoch {best.get('epoch')}")
        study.tell(trial, value)
        epoch = best.get("epoch")
        self.report(f"trial {trial.number}: {self.metric} {value:.4f} (best at epoch {epoch})")

    def _result(self, study: Any, optuna: Any, ran: int) -> TuneResult:
        states = optuna.trial.TrialState
        names = {states.COMPLETE: "complete", states.PRUNED: "pruned", states.FAIL: "failed"}
        rows = []
        for t in study.get_trials(deepcopy=False):
            if t.state not in names:
                continue
            value = t.value if t.state == states.COMPLETE else None
            if t.state == states.PRUNED and t.intermediate_values:
                value = t.intermediate_values[max(t.intermediate_values)]
            rows.append(
                TrialRow(
                    t.number,
                    names[t.state],
                    value,
                    dict(t.params),
                    int(t.user_attrs.get("epochs", 0)),
                    str(t.user_attrs.get("checkpoint", "")),
                    str(t.user_attrs.get("note", "interrupted")),
                )
            )
        complete = [r for r in rows if r.state == "complete" and r.value is not None]
        best = max(complete, key=lambda r: r.value or 0.0) if complete else None
        best_config = None
        if best is not None:
            # the best trial's own config, its checkpoint included: training it reuses (or,
            # with more epochs, continues) exactly the model the study found
            best_config = config_to_dict(self.trial_config(best.number, best.params))
            best_config["tune"] = None
        return TuneResult(self.metric, rows, best, best_config, ran, list(self.tune.params))
