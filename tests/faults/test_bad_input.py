"""Bad input at the library level: catalogs, simulator traits, spec types, records imports, Megatron
logs and the profiler. Each case asserts the exception type and exit code, that the message names the
field (and the file, where there is one) in one line (`NothingUsable`: a summary with a line per
reason), and that nothing was written. CLI-level cases live beside these (the lead's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError, NothingUsable, SpecError
from memx.domain.specs import GpuType, ModelArch, Node, Weights
from memx.profiling import profile
from memx.profiling.backends.command import check_template
from memx.profiling.backends.imported import ingest_megatron
from memx.simulator.traits import load_traits

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
CSV_HEADER = ("gpu,tp,layers,micro_batch,seq_len,recompute,first,last,inflight,hidden,ffn_hidden,heads,"
              "query_groups,vocab,mlp,time_ms,peak_mem_mib")
CSV_ROW = dict(gpu="vendor-y-64g", tp=1, layers=1, micro_batch=1, seq_len=4096, recompute="none", first=False,
               last=False, inflight=1, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32, vocab=32000,
               mlp="swiglu", time_ms=12.5, peak_mem_mib=3000)
LOG = ("memx-point: {header}\n"
       " iteration 10/ 20 | elapsed time per iteration (ms): {iter_ms} |\n"
       "[Rank 0] memory (MB) | allocated: 1000.0 | max allocated: {peak} | reserved: 4000.0\n")
HEADER = {"tp": 1, "layers": 2, "micro_batch": 1, "micro_batches": 4}


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Path, Path], object]  # (input folder, output folder) → call that must fail
    error: type[Exception]
    names: tuple[str, ...]  # what the message must name: the field, and the file where there is one
    writes: tuple[str, ...] = ()  # files allowed under the output folder (failed rows kept for resume)


# --- helpers: write one bad input ---------------------------------------------------------------------
def _yaml_with(kind: str, entry: str, **raw: str) -> str:
    """A shipped catalog entry with some keys replaced by raw YAML text."""
    data = yaml.safe_load((CONF / kind / f"{entry}.yaml").read_text())
    lines = [f"{k}: {raw.pop(k) if k in raw else json.dumps(v)}" for k, v in data.items()]
    return "\n".join(lines + [f"{k}: {v}" for k, v in raw.items()]) + "\n"


def _file(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def gpu(**raw: str) -> Callable[[Path, Path], object]:
    return lambda d, out: load_gpu(_file(d, "g.yaml", _yaml_with("gpus", "a100-80g", **raw)))


def model(**raw: str) -> Callable[[Path, Path], object]:
    return lambda d, out: load_model(_file(d, "m.yaml", _yaml_with("models", "llama2-7b", **raw)))


def search(**raw: str) -> Callable[[Path, Path], object]:
    return lambda d, out: load_search(_file(d, "s.yaml", _yaml_with("search", "small", **raw)))


def cluster(nodes: str, **raw: str) -> Callable[[Path, Path], object]:
    return lambda d, out: load_cluster(_file(d, "c.yaml", _yaml_with("clusters", "xy-2", nodes=nodes, **raw)))


def traits(**raw: str) -> Callable[[Path, Path], object]:
    def run(d: Path, out: Path) -> object:
        _file(d, "simulator/bad-1g.yaml", _yaml_with("simulator", "default", name="bad-1g", **raw))
        return load_traits("bad-1g", d)
    return run


def records(*rows: dict, text: str | bytes | None = None) -> Callable[[Path, Path], object]:
    """`profile --backend records` on xy-2 (vendor-x-32g, vendor-y-64g) of a CSV with these rows."""
    def run(d: Path, out: Path) -> object:
        body = text if text is not None else "\n".join(
            [CSV_HEADER] + [",".join(str({**CSV_ROW, **r}[c]) for c in CSV_HEADER.split(",")) for r in rows])
        path = _file(d, "runs.csv", body)
        return _profile(out, backend="records", records=path)
    return run


def _profile(out: Path, **kw: object) -> object:
    c, m, s = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    return profile(c, m, s, out_dir=out, **kw)


def logs(*files: str, gpu_name: str = "a100-80g") -> Callable[[Path, Path], object]:
    """`ingest megatron` of a folder holding these logs (run0.log, run1.log, …)."""
    def run(d: Path, out: Path) -> object:
        for i, text in enumerate(files):
            _file(d / "logs", f"run{i}.log", text)
        return ingest_megatron(d / "logs", model=load_model("llama2-7b"), gpu=gpu_name)
    return run


def log(header: dict | str | None = None, iter_ms: str = "1600.0", peak: str = "3000.5") -> str:
    head = header if isinstance(header, str) else json.dumps({**HEADER, **(header or {})})
    return LOG.format(header=head, iter_ms=iter_ms, peak=peak)


def call(fn: Callable[[], object]) -> Callable[[Path, Path], object]:
    return lambda d, out: fn()


NODE = "[{gpu: a100-80g, count: %s}]"
INF, NAN = ".inf", ".nan"
BIG = "1.0e+308"

CASES = [
    # GPU catalog entries
    Case("gpu-memory-inf", gpu(memory_gib=INF), InputError, ("memory_gib", "g.yaml", "finite")),
    Case("gpu-memory-nan", gpu(memory_gib=NAN), InputError, ("memory_gib", "g.yaml")),
    Case("gpu-tflops-minus-inf", gpu(peak_tflops_bf16="-.inf"), InputError, ("peak_tflops_bf16", "g.yaml")),
    Case("gpu-memory-over-bound", gpu(memory_gib="1.0e+9"), InputError, ("memory_gib", "16384")),
    Case("gpu-bandwidth-over-bound", gpu(intra_node_bandwidth_gbps="1.0e+12"), InputError,
         ("intra_node_bandwidth_gbps", "g.yaml")),
    Case("gpu-name-is-a-path", gpu(name="../../etc/passwd"), InputError, ("'name'", "g.yaml", "no '/'")),
    Case("gpu-name-too-long", gpu(name="a" * 100), InputError, ("'name'", "at most 64")),
    Case("gpu-binary-file", lambda d, out: load_gpu(_file(d, "g.yaml", b"name: a\xff\xfe\x00\x81")), InputError,
         ("g.yaml", "UTF-8")),
    Case("gpu-not-a-file", lambda d, out: load_gpu((d / "dir.yaml").mkdir() or d / "dir.yaml"), InputError,
         ("dir.yaml",)),
    # model catalog entries
    Case("model-1e8-layers", model(layers="100000000"), InputError, ("layers", "m.yaml", "1024")),
    Case("model-seq-len-1e308", model(seq_len=BIG), InputError, ("seq_len", "m.yaml")),
    Case("model-seq-len-1e308-text", model(seq_len="1e308"), InputError, ("seq_len", "m.yaml")),
    Case("model-seq-len-over-bound", model(seq_len="2097152"), InputError, ("seq_len", "1048576")),
    Case("model-hidden-over-bound", model(hidden="1048576"), InputError, ("hidden", "262144")),
    Case("model-vocab-over-bound", model(vocab="99999999999"), InputError, ("vocab", "m.yaml")),
    Case("model-heads-over-bound", model(heads="100000"), InputError, ("heads",)),
    Case("model-ffn-inf", model(ffn_hidden=INF), InputError, ("ffn_hidden", "m.yaml")),
    Case("model-layers-nan", model(layers=NAN), InputError, ("layers", "m.yaml")),
    # cluster catalog entries
    Case("node-of-1e8-gpus", cluster(NODE % "100000000"), InputError, ("nodes.0.count", "c.yaml", "1024")),
    Case("node-count-inf", cluster(NODE % INF), InputError, ("nodes.0.count", "c.yaml")),
    Case("cluster-over-65536-gpus", cluster("[" + ", ".join(["{gpu: a100-80g, count: 1000}"] * 70) + "]"),
         InputError, ("'nodes'", "65536")),
    Case("cluster-bandwidth-nan", cluster(NODE % "8", inter_node_bandwidth_gbps=NAN), InputError,
         ("inter_node_bandwidth_gbps", "c.yaml")),
    Case("cluster-latency-over-bound", cluster(NODE % "8", inter_node_latency_ms="1.0e+6"), InputError,
         ("inter_node_latency_ms", "c.yaml")),
    Case("cluster-name-5000-chars", call(lambda: load_cluster("x" * 5000)), InputError,
         ("cluster", "too long")),
    Case("cluster-name-nul-byte", call(lambda: load_cluster("a\x00b")), InputError, ("cluster", "null")),
    Case("cluster-binary-file", lambda d, out: load_cluster(_file(d, "c.yaml", bytes(range(256)))), InputError,
         ("c.yaml", "UTF-8")),
    # search catalog entries
    Case("search-global-batch-1e15", search(global_batch="1.0e+15"), InputError, ("global_batch", "s.yaml")),
    Case("search-tp-over-bound", search(tp_options="[1, 100000]"), InputError, ("tp_options", "s.yaml")),
    Case("search-micro-batch-inf", search(micro_batch_options=f"[{INF}]"), InputError, ("micro_batch_options",)),
    Case("search-epsilon-nan", search(epsilon_mib2=NAN), InputError, ("epsilon_mib2", "s.yaml")),
    Case("search-time-ratio-inf", search(max_time_ratio=INF), InputError, ("max_time_ratio", "s.yaml")),
    Case("search-seq-len-1e308", search(seq_len=BIG), InputError, ("seq_len", "s.yaml")),
    Case("search-reserve-minus-inf", search(reserve_gib="-.inf"), InputError, ("reserve_gib", "s.yaml")),
    Case("search-max-pp-over-bound", search(max_pp="100000"), InputError, ("max_pp", "s.yaml")),
    Case("search-balance-tolerance-1", search(balance_tolerance="1.0"), InputError, ("balance_tolerance", "s.yaml", "less than 1")),
    Case("search-balance-tolerance-negative", search(balance_tolerance="-0.1"), InputError,
         ("balance_tolerance", "s.yaml", "greater than or equal to 0")),
    Case("search-margin-floor-1.5", search(margin_floor="1.5"), InputError, ("margin_floor", "s.yaml", "less than 1")),
    # simulator traits
    Case("traits-link-efficiency-nan", traits(link_efficiency=NAN), InputError, ("link_efficiency", "bad-1g.yaml")),
    Case("traits-context-inf", traits(context_memory_mib=INF), InputError, ("context_memory_mib", "bad-1g.yaml")),
    Case("traits-driver-reserve-negative", traits(driver_reserved_mib="-1"), InputError, ("driver_reserved_mib", "bad-1g.yaml")),
    Case("traits-launch-overhead-over-bound", traits(kernel_launch_overhead_ms="1.0e+9"), InputError,
         ("kernel_launch_overhead_ms",)),
    Case("traits-gpu-name-is-a-path", call(lambda: load_traits("../../etc/passwd")), InputError,
         ("GPU name", "passwd")),
    # spec types built in code
    Case("weights-nan", call(lambda: Weights(profile="custom", w_time=float("nan"), w_mem=0.0, w_var=1.0)),
         SpecError, ("w_time", "finite")),
    Case("spec-model-1e8-layers", call(lambda: ModelArch(name="m", layers=10**8, hidden=64, ffn_hidden=64, heads=4,
                                                         query_groups=4, vocab=8, seq_len=8)), SpecError, ("layers",)),
    Case("spec-node-1e8-gpus", call(lambda: Node(gpu=load_gpu("a100-80g"), count=10**8)), SpecError, ("count",)),
    Case("spec-gpu-memory-inf", call(lambda: GpuType(name="g", vendor="v", memory_gib=float("inf"), peak_tflops_bf16=1,
                                                     memory_bandwidth_gbps=1, intra_node_bandwidth_gbps=1)),
         SpecError, ("memory_gib",)),
    # records imports: every row rejected → NothingUsable, nothing written
    Case("records-gpu-is-a-path", records({"gpu": "../../etc/passwd"}), NothingUsable, ("'gpu'",)),
    Case("records-peak-6e9-mib-on-64-gib", records({"peak_mem_mib": 6e9}), NothingUsable,
         ("'peak_mem_mib'", "the GPU's memory")),
    Case("records-peak-6e9-mib-unknown-gpu", records({"gpu": "h100-80g", "peak_mem_mib": 6e9}), NothingUsable,
         ("'peak_mem_mib'", "16 TiB")),
    Case("records-layers-1e15", records({"layers": 1e15}), NothingUsable, ("'layers'", "0..1024")),
    Case("records-negative-time", records({"time_ms": -5}), NothingUsable, ("'time_ms'", "≥ 0")),
    Case("records-infinite-time", records({"time_ms": "inf"}), NothingUsable, ("'time_ms'", "finite")),
    Case("records-seq-len-1e308", records({"seq_len": "1e308"}), NothingUsable, ("'seq_len'",)),
    Case("records-header-only", records(), NothingUsable, ("no rows",)),
    Case("records-binary-file", records(text=b"gpu,tp\n\xff\xfe\x00\x01"), InputError, ("runs.csv",)),
    Case("records-path-5000-chars", lambda d, out: _profile(out, backend="records", records=Path("r" * 5000)),
         InputError, ("--records", "too long")),
    # Megatron logs
    Case("log-time-1.600.0", logs(log(iter_ms="1.600.0")), InputError,
         ("run0.log", "line 2", "elapsed time per iteration (ms)", "1.600.0")),
    Case("log-peak-1.2.3", logs(log(peak="1.2.3")), InputError, ("run0.log", "line 3", "max allocated")),
    Case("log-micro-batches-eight", logs(log({"micro_batches": "eight"})), InputError,
         ("run0.log", "line 1", "micro_batches", "eight")),
    Case("log-micro-batches-negative", logs(log({"micro_batches": -3})), InputError, ("run0.log", "micro_batches")),
    Case("log-tp-two", logs(log({"tp": "two"})), InputError, ("run0.log", "line 1", "'tp'")),
    Case("log-header-not-json", logs(log("{tp: 1, layers: 2}")), InputError, ("run0.log", "line 1", "memx-point")),
    Case("log-layers-1e15", logs(log({"layers": 10**15})), NothingUsable, ("'layers'",)),
    Case("log-nothing-recognisable", logs("hello\n", "just notes\n"), NothingUsable, ("all 2 row(s) rejected",)),
    Case("log-gpu-is-a-path", logs(log(), gpu_name="../../etc/passwd"), InputError, ("--gpu", "no '/'")),
    # the profiler
    Case("profile-jobs-0", lambda d, out: _profile(out, jobs=0), InputError, ("--jobs",)),
    Case("profile-jobs-1e6", lambda d, out: _profile(out, jobs=10**6), InputError, ("--jobs", "1024")),
    Case("profile-timeout-nan", lambda d, out: _profile(out, backend="command", command=["prog"],
                                                          timeout_s=float("nan")), InputError, ("--timeout", "nan")),
    Case("profile-retries-huge", lambda d, out: _profile(out, backend="command", command=["prog"],
                                                           retries=10**20), InputError, ("--retries",)),
    Case("profile-records-missing", lambda d, out: _profile(out, backend="records", records=d / "nope.csv"),
         InputError, ("--records", "nope.csv")),
    Case("profile-unknown-placeholder", call(lambda: check_template(["prog", "{pp}"])), InputError, ("'pp'",)),
    Case("profile-every-point-fails", lambda d, out: _profile(out, backend="command", command=["/nonexistent/prof"],
                                                                timeout_s=5), NothingUsable,
         ("command not found",), writes=("stage_runs.parquet",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_naming_the_field(case: Case, tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    before = sorted(p.relative_to(inputs) for p in inputs.rglob("*"))
    with pytest.raises(case.error) as e:
        case.run(inputs, out)
    exc = e.value
    assert exc.exit_code == {InputError: 2, SpecError: 2, NothingUsable: 5}[case.error]
    message = str(exc)
    if case.error is NothingUsable:  # a summary line, then one line per reason and the first rows
        assert message.startswith("nothing usable: ") and (exc.counts or message.endswith("no rows"))
    else:
        assert "\n" not in message, f"not one line: {message!r}"
    assert len(message) < 2000, "a hostile value must not flood the message"
    for name in case.names:
        assert name in message, f"{name!r} not in {message!r}"
    written = sorted(p.name for p in out.rglob("*") if p.is_file()) if out.exists() else []
    assert set(written) <= set(case.writes), f"written: {written}"
    assert sorted(p.relative_to(inputs) for p in inputs.rglob("*")) >= before  # inputs untouched, none removed


def test_at_least_forty_cases():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)

