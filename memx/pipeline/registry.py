"""MLflow tracking and model registry for stage predictors; fingerprints (docs/architecture.md
§Model registry, §Versions and fingerprints).

- Tracking URI: the argument, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///$MEMX_HOME/mlflow.db``
  (memx.domain.home). SQLite, not the file store (MLflow 3). Run artifacts of a SQLite store go to
  ``mlartifacts/`` beside its database, never to ``./mlruns`` in the working directory.
- One registered model, ``memx-stage-predictor``; each version is tagged ``gpu_types``,
  ``model_fingerprint``, ``global_batch``, ``fingerprint`` (hash of the three), ``data_version``,
  ``held_out`` (hash of the held-out rows), ``variant``, ``predictor_version`` and its metrics.
- Aliases: ``champion-<fingerprint[:12]>`` per fingerprint and ``champion`` (the latest promotion). A new
  version is promoted only when it beats the current champion of its fingerprint on the new version's
  held-out set (the champion is re-scored on those very rows).
- Models load as data only (issue #11): the booster is stored as a plain run artifact in XGBoost's own
  UBJSON format (``booster.ubj``) beside ``predictor.json``, their sha256 recorded as model-version tags
  (``booster_sha256``, ``predictor_sha256``) and in the train manifest, checked before anything is
  parsed, and read with ``xgboost.Booster.load_model`` on the bytes. The logged MLflow model (MLmodel,
  its ``code:`` folder, ``model_class``) is never loaded: a planted ``code/`` cannot run.
- A version whose files are gone or fail the check is :class:`UnusableModel`; the champion rule treats
  an unusable champion as absent (memx.pipeline.training).
- A plan calibration (memx.learn.calibration, issue #16) fitted by ``memx train --measured`` is a
  run artifact ``calibration/<sha256[:12]>/calibration.json`` of the version, its sha256 the model-version
  tag ``calibration_sha256`` (the latest fit wins; earlier files stay), checked and parsed as data by
  :func:`load_calibration`; :func:`load_calibrated` is the version with it applied.
- Every tracking URI that is stored, logged or printed goes through :func:`redact_uri`.
mlflow and xgboost are imported inside functions: ``import memx`` stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from memx.domain.errors import InputError
from memx.domain.hashing import canonical_json, stable_hash
from memx.domain.home import home_path, memx_home, telemetry_off
from memx.domain.io import atomic_write_bytes, db_template, seed_from_template
from memx.domain.specs import Cluster, GpuType, ModelArch

MODEL_NAME = "memx-stage-predictor"
EXPERIMENT = "memx"
PREDICTOR_FILE = "predictor.json"
BOOSTER_FILE = "booster.ubj"
HASH_TAGS = {BOOSTER_FILE: "booster_sha256", PREDICTOR_FILE: "predictor_sha256"}
CALIBRATION_FILE = "calibration.json"  # a PlanCalibration fitted on measured plans (memx train --measured)
CALIBRATION_TAG = "calibration_sha256"

log = logging.getLogger(__name__)


class UnusableModel(InputError):
    """A registered version whose files are missing, unreadable or fail their sha256 check."""


def redact_uri(uri: str | None) -> str | None:
    """`uri` without user info: ``http://user:pw@host:5000/x`` → ``http://***@host:5000/x`` (issue #11).
    Anything that is not a URL with a network location is returned as it is."""
    if not uri:
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tracking_uri(uri: str | None = None) -> str:
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{memx_home() / 'mlflow.db'}"


def store_exists(uri: str | None = None) -> bool:
    """False for a SQLite tracking store whose file does not exist yet (nothing registered; reading it must
    not create it), True for every other store."""
    resolved = tracking_uri(uri)
    return not resolved.startswith("sqlite:///") or Path(resolved.removeprefix("sqlite:///")).is_file()


def public_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI as it may be stored, logged or printed: credentials redacted."""
    return redact_uri(tracking_uri(uri)) or ""


def portable_uri(uri: str | None = None) -> str:
    """The tracking URI as stored in manifests and version hashes: public_tracking_uri with a SQLite store
    under $MEMX_HOME written `sqlite:///$MEMX_HOME/…`, so a home moved or copied to another path still finds
    its stored steps (issue #25)."""
    public = public_tracking_uri(uri)
    home = f"sqlite:///{memx_home()}/"
    return "sqlite:///$MEMX_HOME/" + public.removeprefix(home) if public.startswith(home) else public


def relocate(uri: str) -> None:
    """A SQLite store under $MEMX_HOME whose experiments keep their artifacts under another folder's
    `mlartifacts` (MLflow stores absolute paths; the home was moved or copied): rewrite those paths to this
    home's `mlartifacts`, in one transaction, with a warning naming both. Without it a moved home would
    read and write the old folder (or fail where it is gone)."""
    db = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not db.is_file() or db.parent.resolve() != memx_home().resolve():
        return
    import sqlite3

    new = artifact_location(uri)
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        tables = {r[0]: {c[1] for c in con.execute(f"pragma table_info('{r[0]}')")}
                  for r in con.execute("select name from sqlite_master where type = 'table'")}
        if "artifact_location" not in tables.get("experiments", ()):
            return
        olds = {r[0] for r in con.execute("select artifact_location from experiments")
                if r[0] and r[0].endswith("/mlartifacts") and r[0] != new}
        for old in olds:
            for table, column in RELOCATED_COLUMNS:
                if column in tables.get(table, ()):
                    con.execute(f"update {table} set {column} = ? || substr({column}, ?) "
                                f"where substr({column}, 1, ?) = ?", (new, len(old) + 1, len(old), old))
            log.warning("memx: MEMX_HOME moved: MLflow's artifact paths %s rewritten to %s", old, new)


# Where MLflow's SQLite store keeps absolute artifact paths (MLflow 3 schema; absent columns are skipped).
RELOCATED_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                     ("logged_models", "artifact_location"), ("model_versions", "storage_location"),
                     ("model_versions", "source"))


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps run artifacts: beside a SQLite database, under $MEMX_HOME for other
    database stores, the server's choice for an HTTP tracking server."""
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).absolute().parent / "mlartifacts").as_uri()
    return home_path("mlartifacts").as_uri()


def mlflow_template() -> Path:
    """Where `make install` keeps an empty SQLite tracking store migrated by this environment's MLflow."""
    return db_template("mlflow")


def build_mlflow_template() -> Path:
    """Migrate an empty SQLite tracking store once per environment (`make install`): a new SQLite store starts
    as a copy (`seed_sqlite`) instead of running MLflow's Alembic migrations (~2.7 CPU s each time a fresh
    $MEMX_HOME or a test's temporary home opens its store, docs/benchmarks.md §Test time and plan CPU, session 5). Without the default
    experiment, which MLflow creates on first open with that store's own artifact root. Written to a temporary
    name, then renamed."""
    path = mlflow_template()
    if path.is_file():
        return path
    telemetry_off()
    import sqlite3

    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mlflow.db"
        for store in (SqlAlchemyStore(f"sqlite:///{db}", Path(tmp).as_uri()), RegistryStore(f"sqlite:///{db}")):
            store.engine.dispose()
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            con.execute("delete from experiments")
        atomic_write_bytes(path, db.read_bytes())
    return path


def seed_sqlite(uri: str) -> None:
    """A SQLite tracking store whose file does not exist yet starts as a copy of `mlflow_template()`."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        seed_from_template(db, mlflow_template())


def setup(uri: str | None = None, experiment: str = EXPERIMENT):
    """Point MLflow at the tracking store and `experiment` (created with artifact_location when new);
    returns an MlflowClient."""
    telemetry_off()  # before mlflow is imported
    import mlflow

    for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables…", migrations: not for users
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keeps CLI stdout clean
    # MLflow writes "View run … at: <URL with credentials>" to stdout after every run on a server (issue #11)
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    resolved = tracking_uri(uri)
    seed_sqlite(resolved)
    relocate(resolved)
    mlflow.set_tracking_uri(resolved)
    mlflow.set_registry_uri(resolved)
    # mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI; undo that so a later MEMX_HOME is honoured
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_location(resolved))
    mlflow.set_experiment(experiment)
    return mlflow.MlflowClient()


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    gpu_types: str  # comma-separated sorted names
    gpu_specs: str  # hash of the spec sheets
    model_fingerprint: str
    global_batch: int
    fingerprint: str

    def tags(self) -> dict[str, str]:
        return {"gpu_types": self.gpu_types, "model_fingerprint": self.model_fingerprint,
                "global_batch": str(self.global_batch), "fingerprint": self.fingerprint}


def fingerprint(gpus: Cluster | Mapping[str, GpuType], model: ModelArch, global_batch: int) -> Fingerprint:
    """Hash of GPU types (names and specs, not counts: adding nodes of known types keeps it), model
    structure (ModelArch.structure) and global batch size."""
    table = {g.name: g for g in gpus.gpu_types} if isinstance(gpus, Cluster) else dict(gpus)
    specs = {n: dataclasses.asdict(g) for n, g in sorted(table.items())}
    model_fp = stable_hash(model.structure())
    gpu_fp = stable_hash(specs)
    return Fingerprint(gpu_types=",".join(sorted(table)), gpu_specs=gpu_fp, model_fingerprint=model_fp,
                       global_batch=int(global_batch), fingerprint=stable_hash(gpu_fp, model_fp, int(global_batch)))


def cache_path(fp: str, version: int | str) -> Path:
    """Where the prediction cache of a registered version lives: beside its other local artifacts."""
    return home_path("models", fp, f"v{version}", "predictions.parquet")


def champion_alias(fp: str) -> str:
    return f"champion-{fp[:12]}"


@dataclass(frozen=True, kw_only=True)
class LoggedPredictor:
    """What log_predictor logged: the MLflow model (for the registry UI) and the sha256 of the two
    files that load_version reads."""

    info: Any
    hashes: dict[str, str]  # tag name → sha256 hex

    @property
    def model_uri(self) -> str:
        return self.info.model_uri


def predictor_files(predictor) -> dict[str, bytes]:
    """The files a predictor is stored as: its JSON description and its booster (UBJSON, may be empty)."""
    return {PREDICTOR_FILE: canonical_json(predictor.to_json()).encode(), BOOSTER_FILE: predictor.booster_bytes()}


def log_predictor(predictor, example: pd.DataFrame) -> LoggedPredictor:
    """Inside an active run: booster.ubj and predictor.json as plain artifacts (what loads), their sha256,
    and the booster via mlflow.xgboost.log_model (signature and input example, for registration and the
    UI; never loaded)."""
    import mlflow
    import xgboost
    from mlflow.models import infer_signature

    from memx.learn.features import FEATURE_NAMES
    from memx.learn.model import prepare

    X = prepare(example, predictor.gpus, predictor.variant, predictor.calibration, bool(predictor.moe_seen)).X
    frame = pd.DataFrame(X, columns=list(FEATURE_NAMES[:X.shape[1]]))  # a dense predictor: no MoE features
    out = predictor.booster.inplace_predict(X)
    # explicit requirements: mlflow's requirement inference costs seconds per model
    info = mlflow.xgboost.log_model(predictor.booster, name="model", input_example=frame.head(5),
                                    signature=infer_signature(frame, out), model_format="ubj",
                                    pip_requirements=[f"xgboost=={xgboost.__version__}"])
    files = predictor_files(predictor)
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
            mlflow.log_artifact(str(Path(tmp) / name))
    return LoggedPredictor(info=info, hashes={HASH_TAGS[n]: sha256(d) for n, d in files.items()})


def register(logged: LoggedPredictor, *, run_id: str, fp: Fingerprint, data_version: str, held_out: str,
             predictor_version: str, variant: str, metrics: Mapping[str, float]) -> int:
    """Register a logged model as a new version of MODEL_NAME with its tags; returns the version number."""
    import mlflow

    client = mlflow.MlflowClient()
    mv = mlflow.register_model(logged.model_uri, MODEL_NAME, tags={
        **fp.tags(), **logged.hashes, "data_version": data_version, "held_out": held_out, "variant": variant,
        "predictor_version": predictor_version, "run_id": run_id,
        **{f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()}})
    client.set_model_version_tag(MODEL_NAME, mv.version, "gpu_specs", fp.gpu_specs)
    return int(mv.version)


def champion(fp: str) -> Any | None:
    """The champion ModelVersion of a fingerprint, or None."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.MlflowClient().get_model_version_by_alias(MODEL_NAME, champion_alias(fp))
    except MlflowException:
        return None


def promote(version: int, fp: str) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    client.set_registered_model_alias(MODEL_NAME, champion_alias(fp), str(version))
    client.set_registered_model_alias(MODEL_NAME, "champion", str(version))


def _fetch(run_id: str, name: str, dst: str) -> bytes:
    import mlflow

    try:
        return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name, dst_path=dst)).read_bytes()
    except Exception as exc:  # MlflowException, OSError, botocore errors: the file is not there to load
        raise UnusableModel(f"model version files {name} of run {run_id} cannot be read: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_version(version: int | str):
    """The LearnedStagePredictor of a registered version, loaded as data only: predictor.json and
    booster.ubj of its run, each checked against the sha256 tag recorded when it was registered, then
    parsed (JSON; ``xgboost.Booster.load_model`` on the bytes). UnusableModel when a file is missing,
    a hash is missing or differs, or the loaded predictor is not the registered one."""
    import mlflow
    import xgboost

    from memx.learn.model import from_json

    mv = mlflow.MlflowClient().get_model_version(MODEL_NAME, str(version))
    data = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tag in HASH_TAGS.items():
            want = mv.tags.get(tag)
            if not want:
                raise UnusableModel(f"model version {version} has no {tag} tag (registered before integrity checks "
                                    "or by another tool); it is not loaded — train again")
            data[name] = _fetch(mv.run_id, name, tmp)
            if sha256(data[name]) != want:
                raise UnusableModel(f"model version {version}: {name} fails its sha256 check (expected {want[:12]}…, "
                                    f"got {sha256(data[name])[:12]}…); it is not loaded")
    booster = None
    if data[BOOSTER_FILE]:
        booster = xgboost.Booster()
        booster.load_model(bytearray(data[BOOSTER_FILE]))
    predictor = from_json(json.loads(data[PREDICTOR_FILE]), booster)
    if predictor.version != mv.tags.get("predictor_version"):
        raise UnusableModel(f"model version {version}: loaded predictor {predictor.version} is not the registered "
                            f"{mv.tags.get('predictor_version')}")
    return predictor


def _calibration_artifact(digest: str) -> str:
    return f"calibration/{digest[:12]}/{CALIBRATION_FILE}"


def store_calibration(version: int | str, calibration) -> str:
    """Attach a PlanCalibration to a registered version (artifact of its run + sha256 tag); returns the sha256."""
    import mlflow

    data = canonical_json(calibration.to_dict()).encode()
    digest = sha256(data)
    client = mlflow.MlflowClient()
    mv = client.get_model_version(MODEL_NAME, str(version))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / CALIBRATION_FILE
        path.write_bytes(data)
        client.log_artifact(mv.run_id, str(path), artifact_path=str(Path(_calibration_artifact(digest)).parent))
    client.set_model_version_tag(MODEL_NAME, str(version), CALIBRATION_TAG, digest)
    return digest


def load_calibration(version: int | str):
    """The PlanCalibration attached to a version, or None; UnusableModel when its file is missing or
    fails the sha256 check, InputError when it does not parse."""
    import mlflow

    from memx.learn.calibration import calibration_from_dict  # scipy: only when a calibration is loaded

    mv = mlflow.MlflowClient().get_model_version(MODEL_NAME, str(version))
    want = mv.tags.get(CALIBRATION_TAG)
    if not want:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        data = _fetch(mv.run_id, _calibration_artifact(want), tmp)
    if sha256(data) != want:
        raise UnusableModel(f"model version {version}: {CALIBRATION_FILE} fails its sha256 check (expected "
                            f"{want[:12]}…, got {sha256(data)[:12]}…); it is not loaded")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise InputError(f"model version {version}: {CALIBRATION_FILE} is not JSON ({exc})") from None
    return calibration_from_dict(doc, source=f"model version {version} {CALIBRATION_FILE}")


def load_calibrated(version: int | str):
    """(the version's predictor with its plan calibration applied, the calibration or None)."""
    predictor, calibration = load_version(version), load_calibration(version)
    return (predictor if calibration is None else calibration.wrap(predictor)), calibration


def usable(version: int | str) -> bool:
    """Whether a registered version loads (load_version); a warning names it when it does not."""
    try:
        load_version(version)
    except UnusableModel as exc:
        log.warning("memx: %s; treated as absent", exc)
        return False
    return True


def predictor_version_of(version: int | str, tracking_uri_: str | None = None) -> str | None:
    """The predictor_version tag of a registered version in this registry; None when it is not there."""
    import mlflow
    from mlflow.exceptions import MlflowException

    setup(tracking_uri_)
    try:
        return mlflow.MlflowClient().get_model_version(MODEL_NAME, str(version)).tags.get("predictor_version")
    except MlflowException:
        return None


def experiment_of(run_id: str) -> str:
    import mlflow

    return mlflow.get_run(run_id).info.experiment_id


def list_versions() -> pd.DataFrame:
    """One row per registered version: number, aliases, tags and metrics side by side."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    try:
        aliases = client.get_registered_model(MODEL_NAME).aliases
    except MlflowException:
        return pd.DataFrame(columns=["version", "aliases", "fingerprint", "variant"])
    by_version: dict[str, list[str]] = {}
    for alias, v in aliases.items():
        by_version.setdefault(str(v), []).append(alias)
    rows = []
    for mv in client.search_model_versions(f"name='{MODEL_NAME}'"):
        t = mv.tags
        row = {"version": int(mv.version), "aliases": ",".join(sorted(by_version.get(str(mv.version), []))),
               "fingerprint": t.get("fingerprint", ""), "gpu_types": t.get("gpu_types", ""),
               "global_batch": t.get("global_batch", ""), "data_version": t.get("data_version", ""),
               "variant": t.get("variant", "")}
        row.update({k.removeprefix("metric."): float(v) for k, v in t.items() if k.startswith("metric.")})
        rows.append(row)
    return pd.DataFrame(rows).sort_values("version").reset_index(drop=True)


def versions_for(fp: str) -> list[int]:
    import mlflow

    found = mlflow.MlflowClient().search_model_versions(f"name='{MODEL_NAME}' and tags.fingerprint='{fp}'")
    return sorted(int(mv.version) for mv in found)
