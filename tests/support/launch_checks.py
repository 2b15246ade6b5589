"""Checks of emitted launch commands against hand-written fixtures of the launchers' own argument parsing
and validation (tests/fixtures/megatron_arguments.json, tests/fixtures/flagscale_config.json): used by
tests/unit/test_megatron_command.py, tests/unit/test_flagscale_config.py and bench/launch_check.py."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from pathlib import Path

from memx.report.megatron import MEGATRON_COMMIT

FIXTURES = Path(__file__).parent.parent / "fixtures"
FIXTURE = json.loads((FIXTURES / "megatron_arguments.json").read_text())
TYPES = {"int": int, "float": float, "str": str}


def parser() -> argparse.ArgumentParser:
    """pretrain_gpt.py's arguments as the fixture lists them (abbreviations off, as Megatron's parser)."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False, exit_on_error=False)
    for name, spec in FIXTURE["arguments"].items():
        if spec["kind"] == "flag":
            p.add_argument(name, action=spec["action"], **({"dest": spec["dest"]} if "dest" in spec else {}))
        else:
            p.add_argument(name, type=TYPES[spec["type"]], choices=spec.get("choices"), nargs=spec.get("nargs"),
                           **({"dest": spec["dest"]} if "dest" in spec else {}))
    return p


def parse(args: list[str]) -> argparse.Namespace:
    """Parse like Megatron; unknown flags and bad values raise."""
    ns, unknown = parser().parse_known_args(args)
    if unknown:
        raise ValueError(f"unknown to Megatron-LM@{MEGATRON_COMMIT[:10]}: {unknown}")
    return ns


def _holds(cond: str, args: list[str], ns: argparse.Namespace) -> bool:
    if ">" in cond:
        flag, bound = cond.split(">")
        return flag in args and getattr(ns, flag[2:].replace("-", "_")) > int(bound)
    flag, _, value = cond.partition("=")
    if flag not in args:
        return False
    return not value or str(getattr(ns, flag[2:].replace("-", "_"))) == value


def rule_problems(args: list[str]) -> list[str]:
    ns = parse(args)
    return combination_problems(args, ns) + layer_problems(ns) + batch_problems(ns)


def combination_problems(args: list[str], ns: argparse.Namespace) -> list[str]:
    """The fixture's `rules`: arguments that require or exclude others."""
    problems: list[str] = []
    for rule in FIXTURE["rules"]:
        if not _holds(rule["if"], args, ns):
            continue
        problems += [f"{rule['if']} needs {c}" for c in rule.get("requires", []) if not _holds(c, args, ns)]
        problems += [f"{rule['if']} excludes {c}" for c in rule.get("excludes", []) if _holds(c, args, ns)]
    return problems


def layer_problems(ns: argparse.Namespace) -> list[str]:
    """The layer-split checks of Megatron's TransformerConfig / PipelineParallelLayerLayout."""
    pp, layers = ns.pipeline_model_parallel_size, ns.num_layers
    if ns.pipeline_model_parallel_layout:
        flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), ns.pipeline_model_parallel_layout.replace(",", ""))
        stages = flat.split("|")
        ok = len(stages) == pp and flat.count("t") == layers and flat.startswith("E") and flat.endswith("L")
        return [] if ok else [f"layout {ns.pipeline_model_parallel_layout} does not hold {layers} layers on {pp} stages"]
    first, last = ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers
    if first is None and last is None:
        return [] if layers % pp == 0 else [f"{layers} layers do not divide over {pp} stages"]
    middle_layers = layers - (first or 0) - (last or 0)
    middle_stages = pp - (first is not None) - (last is not None)
    if min(first or 1, last or 1) <= 0 or bool(middle_layers) != bool(middle_stages) or (
            middle_stages and middle_layers % middle_stages):
        return [f"first/last {first}/{last}: {middle_layers} middle layers on {middle_stages} stages"]
    return []


def batch_problems(ns: argparse.Namespace, world: int | None = None) -> list[str]:
    problems = []
    if ns.max_position_embeddings < ns.seq_length:
        problems.append("max-position-embeddings < seq-length")
    if world is not None:
        cp = getattr(ns, "context_parallel_size", None) or 1  # Megatron: dp = world / (tp · pp · cp)
        dp = world // (ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * cp)
        if ns.global_batch_size % (ns.micro_batch_size * dp):
            problems.append("global batch not divisible by micro batch × dp")
    return problems




def megatron_launch_problems(args: list[str], world: int, layers: list[int]) -> list[str]:
    """A pretrain_gpt.py command starts on `world` GPUs with the layer split `layers`: the fixture's checks,
    tp × pp × dp = world (Megatron-LM validate_args: the world size divisible by tp × pp, dp the quotient) and
    the split the arguments give equals `layers`."""
    ns = parse(args)
    problems = rule_problems(args) + batch_problems(ns, world)
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, getattr(ns, "context_parallel_size", None) or 1
    if world % (tp * pp * cp):
        problems.append(f"world size {world} not divisible by tp {tp} × pp {pp} × cp {cp}")
    if split_of(ns) != layers:
        problems.append(f"arguments give the layer split {split_of(ns)}, the plan {layers}")
    return problems


def split_of(ns: argparse.Namespace) -> list[int]:
    """The layers of each pipeline stage as Megatron-LM derives them from the arguments."""
    pp, total = ns.pipeline_model_parallel_size, ns.num_layers
    if ns.pipeline_model_parallel_layout:
        flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), ns.pipeline_model_parallel_layout)
        return [stage.count("t") for stage in flat.split("|")]
    first, last = ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers
    middle = pp - (first is not None) - (last is not None)
    rest = total - (first or 0) - (last or 0)
    inner = [rest // middle] * middle if middle else []
    return ([first] if first is not None else []) + inner + ([last] if last is not None else [])


# --- FlagScale (tests/fixtures/flagscale_config.json) ---
FLAGSCALE = json.loads((FIXTURES / "flagscale_config.json").read_text())


def flatten(config: dict) -> list[str]:
    """FlagScale's flattening of system/model/data into arguments, as the fixture's `about` describes it."""
    args: list[str] = []
    for key, value in config.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, dict):
            args += flatten(value)
        elif isinstance(value, list):
            args += [name, *(str(v) for v in value)]
        elif isinstance(value, bool):
            args += [name] if value else []
        else:
            args += [name, str(value)]
    return args


def flagscale_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train_gpt.py", allow_abbrev=False, add_help=False, exit_on_error=False)
    known = dict(FLAGSCALE["flagscale_arguments"])
    known.update({n: FIXTURE["arguments"][n] for n in FLAGSCALE["megatron_arguments"]["names"]})
    for name, spec in known.items():
        dest = {"dest": spec["dest"]} if "dest" in spec else {}
        if spec["kind"] == "flag":
            p.add_argument(name, action=spec["action"], **dest)
        else:
            p.add_argument(name, type=TYPES[spec["type"]], choices=spec.get("choices"), nargs=spec.get("nargs"), **dest)
    return p


def flagscale_args(config: dict) -> list[str]:
    train = config["train"]
    return flatten({**train["system"], **train["model"], **train["data"]})


def flagscale_problems(config: dict, world: int) -> list[str]:
    """Every rule of the FlagScale fixture that `config` (a parsed flagscale.yaml) breaks on `world` GPUs."""
    exp = config.get("experiment", {})
    problems = [f"experiment.task.{k} must be {v!r}" for k, v in FLAGSCALE["experiment"]["task"].items()
                if exp.get("task", {}).get(k) != v]
    if exp.get("runner", {}).get("backend") not in FLAGSCALE["experiment"]["runner_backends"]:
        problems.append("experiment.runner.backend")
    if set(config.get("train", {})) != {"system", "model", "data"}:
        return problems + ["train must hold system, model and data"]
    args = flagscale_args(config)
    ns, unknown = flagscale_parser().parse_known_args(args)
    if unknown:
        return problems + [f"unknown to FlagScale@{FLAGSCALE['commit'][:10]}: {unknown}"]
    problems += combination_problems(args, ns) + batch_problems(ns)
    return problems + hetero_problems(ns, world)


def hetero_problems(ns: argparse.Namespace, world: int) -> list[str]:
    """The fixture's hetero `rules`, by id."""
    bad = []
    if not ns.enable_hetero:
        return ["enable_hetero"]
    flat = ns.hetero_process_meshes or []
    if not flat or len(flat) % 5:
        return ["meshes_format"]
    meshes = [flat[i:i + 5] for i in range(0, len(flat), 5)]
    tp, cp, ep, dp, pp = (list(col) for col in zip(*meshes))
    bad += ["dp_divides"] * (not all(dp[0] * ns.micro_batch_size % d == 0 for d in dp))
    bad += ["cp_same"] * (set(cp) != {1})
    bad += ["ep_all_or_none"] * (not (all(e == 1 for e in ep) or all(e != 1 for e in ep)))
    bad += ["pp_sum"] * (ns.pipeline_model_parallel_size != sum(pp))
    bad += ["no_standalone_embedding"] * bool(ns.standalone_embedding_stage)
    if not ns.untie_embeddings_and_output_weights:
        bad += ["tied_ends"] * (tp[0] != tp[-1] or (dp[0] != dp[-1] and ns.use_distributed_optimizer and not (
            (dp[0] % dp[-1] == 0 or dp[-1] % dp[0] == 0) and ns.use_partial_reduce_for_shared_embedding)))
    bad += ["no_virtual_pipeline"] * (ns.num_layers_per_virtual_pipeline_stage is not None)
    split = ns.hetero_pipeline_layer_split or []
    bad += ["layer_split"] * (sum(split) != ns.num_layers or len(split) != ns.pipeline_model_parallel_size)
    types = ns.hetero_device_types or []
    bad += ["device_types"] * (len(types) != len(meshes) or ns.hetero_current_device_type not in types)
    bad += ["world_size"] * (sum(a * b * c * d for a, b, c, d in zip(tp, cp, dp, pp)) != world)
    bad += ["batch"] * bool(ns.global_batch_size % (ns.micro_batch_size * dp[0]))
    return bad + _recompute_problems(ns, dp[0])


def _recompute_problems(ns: argparse.Namespace, dp: int) -> list[str]:
    lists = {k: getattr(ns, f"recompute_{k}_per_stage_micro_batch") for k in ("granularity", "method", "num_layers")}
    if all(v is None for v in lists.values()):
        return []
    if ns.recompute_granularity != "full" or ns.recompute_method is None:
        return ["recompute_per_stage"]
    micro_batches = ns.global_batch_size // (ns.micro_batch_size * dp)
    for kind, items in lists.items():
        if items is None:
            continue
        stages = 0
        for item in items:
            sub = ast.literal_eval(item)
            stages += sub[0]
            counts, values = sub[1::2], sub[2::2]
            if sum(counts) != micro_batches or (kind != "num_layers" and not set(values) <= {0, 1}):
                return ["recompute_per_stage"]
        if stages != ns.pipeline_model_parallel_size:
            return ["recompute_per_stage"]
    return []


def hostfile_problems(yaml_text: str, config: dict) -> list[str]:
    """The header's hostfile lines match FlagScale's pattern, name only the config's device types, and give
    as many slots as the world size."""
    lines = [ln.removeprefix("# hostfile: ") for ln in yaml_text.splitlines() if ln.startswith("# hostfile: ")]
    pattern = re.compile(FLAGSCALE["experiment"]["hostfile_line"])
    types = config["train"]["system"]["hetero"]["hetero_device_types"]
    matches = [pattern.search(ln) for ln in lines]
    if not lines or not all(matches) or any(m.group(3) not in types for m in matches):
        return [f"hostfile lines {lines}"]
    return []


def world_of(config: dict) -> int:
    """GPUs a FlagScale config's meshes hold (Σ tp·cp·dp·pp)."""
    flat = config["train"]["system"]["hetero"]["hetero_process_meshes"]
    return sum(flat[i] * flat[i + 1] * flat[i + 3] * flat[i + 4] for i in range(0, len(flat), 5))


def script_args(script: str) -> list[str]:
    """The pretrain_gpt.py arguments of a rendered megatron.sh (placeholders stay `${NAME}`)."""
    return shlex.split(script.split("pretrain_gpt.py", 1)[1].replace("\\\n", " "))
