"""Stage-prediction cache (docs/architecture.md §Cache).

A prediction is stored under a 64-bit hash of its *full* signature (every SIGNATURE_COLUMNS field and the training precision:
layer count, recompute layers, inflight, first/last included — the paper leaves the fields open, we
don't) keyed with the predictor version, so two predictor versions never share entries. The cache is
persisted as Parquet beside the registered model version (see memx.pipeline.registry.cache_path); the
fingerprint of GPU types, model structure and global batch selects that version, so a change of any of
the three uses a different version and a different cache.

Integrity (issue #11): the sha256 of the Parquet bytes is written beside it (``predictions.parquet.sha256``,
after the table) and checked on load. A cache that is truncated, does not parse, lacks its hash or fails
the check is discarded with a warning naming it and rebuilt from the predictor: edited cached values
never change a plan under the same version hash.

A hash beside the data proves only that nobody changed one without the other (issue #25: scaled rows plus
a rewritten ``.sha256`` changed a pick silently). So the cache also stores each entry's canonical
signature, and a load checks it against what produced it: every key must be the hash of its stored
signature under this predictor version, and SPOT_CHECKS entries drawn at random (os.urandom: a forger
cannot know which) are predicted again by the predictor and must agree (rtol SPOT_RTOL). A forged
cache is discarded with a warning and rebuilt. A forger who alters a handful of a million entries may
escape one spot check of 64 (docs/reliability.md §Integrity says so).

The per-signature keys are pandas' vectorised 64-bit hash (`hash_pandas_object`), not
memx.domain.hashing: millions of keys per search, where sha256 per row would dominate the search time.
The predictor version (memx.domain.hashing) is the hash key, so the two families never mix.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from memx.domain.io import atomic_write_bytes
from memx.domain.moe_records import MOE_DEFAULTS, MOE_STAGE_COLUMNS
from memx.domain.records import BOOL_COLUMNS, with_record_defaults
from memx.learn.experts import predict_columns
from memx.planner.cost import precision_column
from memx.planner.signatures import INTERVAL_COLUMNS, PREDICTION_COLUMNS, PREDICTOR_INPUT_COLUMNS, StagePredictor

# What an entry is keyed on: the signature and the training precision (issue #23: fp16 and bf16 stages differ)
TIED = "tied_embeddings"
KEY_COLUMNS = tuple(c for c in PREDICTOR_INPUT_COLUMNS if c != TIED)
# and a MoE stage's expert columns (issue #27: a learned predictor reads ep and the all-to-all link,
# memx.learn.experts) and tied embeddings (issue #23: one weight on a pp = 1 stage), hashed only on rows where
# one is not default, so an entry written before them keeps its key
STORED_COLUMNS = (*KEY_COLUMNS, *MOE_STAGE_COLUMNS, TIED)

# What is cached per signature: the prediction and, when the predictor gives one, its interval (NaN otherwise).
CACHED_COLUMNS = PREDICTION_COLUMNS + INTERVAL_COLUMNS

log = logging.getLogger(__name__)
SPOT_CHECKS = 64  # cached entries predicted again on every load
SPOT_RTOL = 1e-6  # the same predictor on the same signature: equal up to float rounding

_INT = ("tp", "layers", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads", "query_groups", "vocab",
        "dp")


def canonical_signatures(sigs: pd.DataFrame) -> pd.DataFrame:
    """Signature columns in fixed dtypes, so equal signatures hash equally whatever their source."""
    sigs = with_record_defaults(sigs)  # option columns absent: their defaults (memx.domain.records)
    out = {c: sigs[c].to_numpy(dtype=np.int64) for c in _INT}
    out["recompute_layers"] = pd.to_numeric(sigs["recompute_layers"], errors="coerce").fillna(-1).to_numpy(np.int64)
    for c in BOOL_COLUMNS:
        out[c] = sigs[c].to_numpy(dtype=bool).astype(np.int64)
    for c in ("gpu", "recompute", "mlp"):
        out[c] = sigs[c].astype(str).to_numpy(dtype=object)
    out["precision"] = precision_column(sigs)  # bf16 where a frame has none
    out.update({c: sigs[c].to_numpy(dtype=np.float64) for c in MOE_STAGE_COLUMNS})
    return pd.DataFrame({c: out[c] for c in STORED_COLUMNS})


_EMPTY_SIGS = pd.DataFrame({c: pd.Series(dtype=object if c in ("gpu", "recompute", "mlp", "precision") else
                                      bool if c in BOOL_COLUMNS else np.int64) for c in (*KEY_COLUMNS, TIED)}).assign(
    **{c: pd.Series(dtype=np.float64) for c in MOE_STAGE_COLUMNS})


def signature_keys(sigs: pd.DataFrame, version: str) -> np.ndarray:
    """uint64 key per row: hash of the full signature, with the predictor version as the hash key; a MoE stage's
    expert columns and `tied_embeddings` enter only where one is not default (a dense, untied entry's key is the one
    it always had; a MoE entry's too unless tied)."""
    hash_key = (version + "0" * 16)[:16]
    canon = canonical_signatures(sigs)
    keys = pd.util.hash_pandas_object(canon.loc[:, list(KEY_COLUMNS)], index=False, hash_key=hash_key)
    keys = keys.to_numpy(np.uint64).copy()
    moe = np.zeros(len(canon), dtype=bool)
    for c in MOE_STAGE_COLUMNS:
        moe |= canon[c].to_numpy() != float(MOE_DEFAULTS[c])
    tied = canon[TIED].to_numpy() != 0
    for rows, cols in ((moe & ~tied, (*KEY_COLUMNS, *MOE_STAGE_COLUMNS)), (tied, STORED_COLUMNS)):
        if rows.any():
            keys[rows] = pd.util.hash_pandas_object(canon.loc[rows, list(cols)], index=False,
                                                    hash_key=hash_key).to_numpy(np.uint64)
    return keys


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    queries: int
    hits: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class CachedPredictor:
    """StagePredictor wrapper: answers known signatures from the cache, asks `inner` for the rest.

    `version` must change whenever `inner`'s predictions can change (memx.learn.model's
    LearnedStagePredictor.version is a content hash). With `path`, the cache is loaded from and saved
    to Parquet (atomically) after every call that added entries.
    """

    def __init__(self, inner: StagePredictor, *, version: str, path: str | Path | None = None):
        self.inner, self.version = inner, version
        self.path = Path(path) if path is not None else None
        self.name = f"cached-{inner.name}"
        self._keys = pd.Index(np.empty(0, dtype=np.uint64))
        self._values = np.empty((0, len(CACHED_COLUMNS)))
        self._sigs = canonical_signatures(_EMPTY_SIGS)  # canonical signature per entry (checked on load)
        self.history: list[CacheStats] = []
        if self.path is not None and self.path.exists():
            self._load()

    def __getattr__(self, attr):  # memory_source, time_only, variant ... of the wrapped predictor
        if attr in ("inner", "_keys", "_values"):
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def hash_path(self) -> Path:
        """Where the sha256 of the cache file is kept (beside it)."""
        return self.path.with_name(self.path.name + ".sha256")

    def _load(self) -> None:
        """The stored entries of this version, after the hash check; a bad cache is discarded."""
        try:
            data = self.path.read_bytes()
            want = self.hash_path.read_text().strip() if self.hash_path.exists() else None
            if want != hashlib.sha256(data).hexdigest():
                raise ValueError("no recorded sha256" if want is None else "sha256 check failed")
            df = pd.read_parquet(io.BytesIO(data))
            df = df[df["version"].astype(str) == self.version].reset_index(drop=True)
            keys = pd.Index(df["key"].to_numpy(np.uint64))
            values = df.loc[:, list(CACHED_COLUMNS)].to_numpy(np.float64)
            df = with_record_defaults(df)  # a cache from before the expert columns: a dense stage's
            self._verify(df, keys.to_numpy(np.uint64), values)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            log.warning("memx: prediction cache %s discarded (%s); it is rebuilt from the predictor",
                        self.path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.path.unlink(missing_ok=True)
            self.hash_path.unlink(missing_ok=True)
            return
        self._keys, self._values = keys, values
        self._sigs = df.loc[:, list(STORED_COLUMNS)]

    def _verify(self, df: pd.DataFrame, keys: np.ndarray, values: np.ndarray) -> None:
        """ValueError unless the stored entries are what this predictor gives (see the module doc)."""
        if not len(df):
            return
        sigs = df.loc[:, list(STORED_COLUMNS)]  # a cache from before the precision column: KeyError, rebuilt
        if not np.array_equal(signature_keys(sigs, self.version), keys):
            raise ValueError("a key is not the hash of its stored signature")
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        rows = rng.choice(len(df), size=min(SPOT_CHECKS, len(df)), replace=False)
        sample = sigs.iloc[rows].copy()
        sample["recompute_layers"] = sample["recompute_layers"].where(sample["recompute_layers"] >= 0)
        for c in BOOL_COLUMNS:
            sample[c] = sample[c].astype(bool)
        fresh = self.inner.predict(sample).reindex(columns=list(PREDICTION_COLUMNS)).to_numpy(np.float64)
        cached = values[rows][:, :len(PREDICTION_COLUMNS)]
        if not np.allclose(fresh, cached, rtol=SPOT_RTOL, atol=0.0, equal_nan=True):
            raise ValueError(f"cached predictions disagree with the predictor ({SPOT_CHECKS} entries predicted again)")

    def save(self) -> None:
        if self.path is None:
            return
        df = pd.DataFrame(self._values, columns=list(CACHED_COLUMNS))
        df.insert(0, "key", self._keys.to_numpy(np.uint64))
        df.insert(1, "version", self.version)
        df = pd.concat([df, self._sigs.reset_index(drop=True)], axis=1)
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        data = buf.getvalue()
        # table first, hash last: a crash in between leaves a mismatch, i.e. a discarded cache, never a wrong one
        atomic_write_bytes(self.path, data)
        atomic_write_bytes(self.hash_path, (hashlib.sha256(data).hexdigest() + "\n").encode())

    def __len__(self) -> int:
        return len(self._keys)

    def predict_columns(self, cols) -> pd.DataFrame:
        """`predict` on the search's numpy columns, a MoE stage's expert columns kept (memx.learn.experts)."""
        return predict_columns(self, cols)

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        keys = signature_keys(sigs, self.version)
        pos = self._keys.get_indexer(keys) if len(self._keys) else np.full(len(keys), -1)
        hit = pos >= 0
        out = np.empty((len(sigs), len(CACHED_COLUMNS)))
        out[hit] = self._values[pos[hit]]
        if (~hit).any():
            miss_keys, first = np.unique(keys[~hit], return_index=True)
            rows = np.flatnonzero(~hit)[first]
            miss = with_record_defaults(sigs.iloc[rows])
            pred = self.inner.predict(miss.assign(precision=precision_column(miss)).loc[:, list(STORED_COLUMNS)])
            vals = pred.reindex(columns=list(CACHED_COLUMNS)).to_numpy(np.float64)
            self._keys = self._keys.append(pd.Index(miss_keys))
            self._values = np.vstack([self._values, vals])
            self._sigs = pd.concat([self._sigs, canonical_signatures(sigs.iloc[rows])], ignore_index=True)
            out[~hit] = vals[np.searchsorted(miss_keys, keys[~hit])]
            self.save()
        self.history.append(CacheStats(queries=len(sigs), hits=int(hit.sum())))
        frame = pd.DataFrame(out, columns=list(CACHED_COLUMNS), index=sigs.index)
        given = [c for c in INTERVAL_COLUMNS if not np.isnan(out[:, CACHED_COLUMNS.index(c)]).all()]
        return frame.loc[:, [*PREDICTION_COLUMNS, *given]]  # interval columns only where the predictor gives them

    @property
    def last_hit_rate(self) -> float:
        return self.history[-1].hit_rate if self.history else 0.0

    @property
    def hit_rate(self) -> float:
        """Over every call so far."""
        q = sum(s.queries for s in self.history)
        return sum(s.hits for s in self.history) / q if q else 0.0
