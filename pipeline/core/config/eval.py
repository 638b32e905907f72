"""``eval`` config group: business eval set, runners and the release gate (evaluate stage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...facts.recipes import RECIPES
from .calibration import parse_batch_size
from .common import Problem, choice, runtime

RUNNERS = ("baseline", "engine", "simulated")
GATE_MODES = ("release", "exploratory")
REFERENCE_DTYPES = ("auto", "float32", "bfloat16", "float16", "checkpoint")


@dataclass
class GateConfig:
    min_score: float = 0.0
    """Minimum absolute score (0..1) overall and on every slice."""
    max_drop: Optional[float] = None
    """Maximum score drop vs the baseline (absolute, 0..1). ``None`` = the recipe default in
    ``max_drop_by_recipe``."""
    max_drop_by_recipe: Dict[str, float] = field(
        default_factory=lambda: {r.name: r.max_drop for r in RECIPES.values() if r.max_drop is not None}
    )
    """Default allowed drop per recipe (absolute, 0..1; the values: ``Recipe.max_drop`` in pipeline/facts/recipes.py): tighter for near-lossless formats (fp8) than for int4.  An allowance
    must be demonstrable on the eval set: with no discordant pair the 95 % upper bound is z^2 / (n + z^2), so
    the shipped 1080-item set (80 items per slice, 200 on the three quantization-sensitive v2 slices) can show
    0.25 pp overall and 3.3 pp (1.3 pp) per slice at best; hence 2 pp (4 pp per slice) for ``none``, whose numerics the fidelity thresholds (max_kld, min_top1) hold tighter."""
    slice_max_drop: Optional[float] = None
    """Allowed drop on any single slice (default: 2 x the overall allowance)."""
    min_agreement: float = 0.0
    """Minimum fraction of items whose candidate output equals the baseline's output."""
    mode: str = "release"
    """``release``: pass only when non-inferiority is shown on every scope; ``inconclusive`` (too few
    items) fails with exit 3.  ``exploratory``: an inconclusive verdict ends the run with exit 0 and a
    loud warning, recorded in the report; the verdict stays ``passed: false`` so the package stage still
    refuses to release it.  A measured drop above the allowance fails in both modes."""
    significant_only: Optional[bool] = runtime(None, doc="REMOVED (refused when set): use eval.gate.mode=exploratory")
    """Removed: it let any small set pass (a drop failed only when proven).  Setting it is a config error
    naming the replacement (``eval.gate.mode``)."""
    max_kld: Optional[float] = None
    """Maximum mean per-token KL divergence (nats) of the candidate from the baseline, teacher-forced
    (``pipeline/evaluate/fidelity.py``). ``None`` = ``max_kld_by_recipe[recipe]`` (no check when absent)."""
    max_kld_by_recipe: Dict[str, float] = field(
        default_factory=lambda: {r.name: r.max_kld for r in RECIPES.values() if r.max_kld is not None}
    )
    """Default mean-KLD ceiling per recipe (nats, eval answers, overall; the values: ``Recipe.max_kld`` in
    pipeline/facts/recipes.py).  Measured on the default model, data v2 (docs/evaluate.md, "Measured"): none 1e-12,
    int8_wo 7.5e-5, int4_awq 0.0051, int4_rtn 0.0044 nats; on its held-out calibration text
    3e-12 / 6.6e-4 / 0.019 / 0.020.  The ceilings sit well above those (a less confident user model measures more)
    and orders of magnitude below a broken build (negated lm_head: > 1 nat); recipes without an entry are not checked."""
    min_top1: Optional[float] = None
    """Minimum top-1 agreement (share of teacher-forced positions where the candidate's argmax token is the
    baseline's). ``None`` = ``min_top1_by_recipe[recipe]`` (no check when absent)."""
    min_top1_by_recipe: Dict[str, float] = field(
        default_factory=lambda: {r.name: r.min_top1 for r in RECIPES.values() if r.min_top1 is not None}
    )
    """Default top-1 agreement floor per recipe (0..1; the values: ``Recipe.min_top1`` in pipeline/facts/recipes.py).
    Measured on the default model (data v2): eval answers none 100 %, int8_wo 99.95 %, int4_awq 99.60 %,
    int4_rtn 99.61 %; held-out calibration text 100 / 99.3 / 95.7 / 96.2 %."""
    confidence: float = 0.95
    """Level of the one-sided upper bound of the drop (non-inferiority test at alpha = 1 - confidence)."""
    bootstrap_samples: int = 2000
    """Paired bootstrap resamples for the upper bound of the drop on non-binary metrics (binary metrics use an exact
    bound instead)."""
    seed: int = 0
    """Seed of the bootstrap resampling (the same scores always give the same bound)."""


@dataclass
class EvalConfig:
    name: str = "eval"
    """Label of the eval preset (support_v2, ...); enters the evaluate key with the other fields.  When
    ``eval_set`` is not the named preset's file, the label becomes the file's name (``pipeline.core.config.relabel_custom_data``)."""
    eval_set: Optional[str] = runtime(None)
    """JSONL business eval set (one item per line: id, prompt, reference, metric, slice). A path: its content digest,
    not the string, enters the evaluate key."""
    limit: Optional[int] = None
    """Evaluate only the first N items (quick runs); ``None`` = all."""
    runners: List[str] = field(default_factory=lambda: ["baseline", "engine"])
    """Which runners to run: baseline (unquantized, transformers) | engine (the built engine) |
    simulated (ModelOpt simulated quantization in PyTorch)."""
    candidate: str = "auto"
    """The runner the gate judges against the baseline: engine | simulated | auto (the engine when the
    build target can run the recipe and an engine was built, else the ModelOpt simulated-quantization
    model; the choice and why are recorded in the report)."""
    batch_size: Any = runtime("auto")
    """Prompts per batch of the baseline / simulated / engine runners and the draft (speed only; outputs are the same):
    a positive integer, or ``auto`` = 16 on the CPU and for the engine (the fixed batch before ``auto``); for the
    baseline / simulated runners on CUDA the largest batch whose activations fit half the GPU's free memory beside the
    loaded model (``pipeline.evaluate.runners.choose_batch``), recorded per runner in the report."""
    max_new_tokens: int = 48
    """Default generation budget when an item has no ``max_new_tokens``."""
    stop: List[str] = field(default_factory=list)
    """Extra stop strings (the eos id list always stops)."""
    gate: GateConfig = field(default_factory=GateConfig)
    """The release gate: allowances, fidelity thresholds and the statistics behind the verdict."""
    draft_model_path: Optional[str] = runtime(None)
    """Hugging Face checkpoint of a draft model whose speculative-decoding acceptance rate is measured against the
    baseline (``None`` = not measured). A path: its content is keyed, not the string."""
    draft_tokens: int = 4
    """Draft tokens proposed per speculative step (k) when measuring the draft acceptance rate."""
    torch_threads: int = runtime(0)
    """PyTorch intra-op threads for the baseline/simulated runners; 0 = auto (1 on hosts with <= 4 CPUs, where
    threads contend: measured 10 s vs 0.15 s for one 16-prompt batch on a shared 2-core box; else PyTorch's
    default)."""
    reference_dtype: str = "auto"
    """Compute dtype of the baseline (reference) runner, which always loads the *source* checkpoint
    (``model.path``), never the export: auto (default: float32 on the CPU, the checkpoint's 16-bit dtype on CUDA,
    bfloat16 for a float32 checkpoint) | float32 | bfloat16 | float16 | checkpoint (the checkpoint's own
    ``torch_dtype``). The evaluate key holds the resolved dtype for ``auto`` (float32 on the CPU, as before ``auto``)."""
    device: str = runtime("auto")
    """Where the baseline and simulated runners run: auto (CUDA when torch sees a GPU, else the CPU) | cpu | cuda |
    cuda:N (``cuda`` on a host without one: exit 2 before any work). Not keyed as written: the evaluate key holds the
    resolved kind when it is CUDA (a CPU run's key is the one it had before this field)."""
    fidelity: bool = True
    """Teacher-forced fidelity metrics (KL divergence, top-1 agreement, ln PPL ratio) of the candidate vs
    the baseline over every eval prompt + its reference answer (``pipeline/evaluate/fidelity.py``)."""
    fidelity_heldout: int = 64
    """Also teacher-force this many calibration-domain samples that calibration did *not* use (the next ones
    in the calibration set's seeded order after ``calibration.calib_size``), reported as
    ``fidelity.calibration_heldout`` (not gated); 0 = off, and skipped when the set has no more samples."""
    worst_regressions: int = 20
    """How many worst regressions (baseline right, candidate wrong) the report shows side by side."""


def validate(cfg: EvalConfig, prefix: str = "eval") -> list[Problem]:
    problems: list[Problem] = []
    for r in cfg.runners:
        choice(problems, f"{prefix}.runners", r, RUNNERS)
    if "baseline" not in cfg.runners:
        problems.append(
            Problem(
                f"{prefix}.runners",
                list(cfg.runners),
                "must include baseline: the gate judges the candidate against it.",
                "e.g. eval.runners=[baseline,engine] or eval.runners=[baseline,simulated]",
            )
        )
    choice(problems, f"{prefix}.candidate", cfg.candidate, ("auto", "engine", "simulated"))
    if cfg.draft_tokens < 1:
        problems.append(Problem(f"{prefix}.draft_tokens", cfg.draft_tokens, "must be >= 1.", "use eval.draft_tokens=4"))
    choice(problems, f"{prefix}.gate.mode", cfg.gate.mode, GATE_MODES)
    choice(problems, f"{prefix}.reference_dtype", cfg.reference_dtype, REFERENCE_DTYPES)
    if cfg.gate.significant_only is not None:
        problems.append(
            Problem(
                f"{prefix}.gate.significant_only",
                cfg.gate.significant_only,
                "was removed: the gate now requires evidence that the candidate is not worse (a one-sided upper "
                "bound of the drop within the allowance), so a small set can no longer pass a collapse.",
                "remove it; for an exploratory run that may end inconclusive use eval.gate.mode=exploratory",
            )
        )
    problems.extend(_gate_problems(cfg.gate, f"{prefix}.gate"))
    if cfg.fidelity_heldout < 0:
        problems.append(Problem(f"{prefix}.fidelity_heldout", cfg.fidelity_heldout, "must be >= 0.", "use 64, or 0 to turn it off"))
    try:
        parse_batch_size(cfg.batch_size)
    except ValueError as e:
        problems.append(Problem(f"{prefix}.batch_size", cfg.batch_size, f"{e}.", f"set {prefix}.batch_size to a positive integer, or auto"))
    d = str(cfg.device).strip().lower()
    if not (d in ("auto", "cpu", "cuda") or (d.startswith("cuda:") and d[5:].isdigit())):
        problems.append(
            Problem(f"{prefix}.device", cfg.device, "is not an evaluate device.", f"use {prefix}.device=auto, cpu, cuda or cuda:N")
        )
    if cfg.max_new_tokens < 1:
        problems.append(
            Problem(
                f"{prefix}.max_new_tokens", cfg.max_new_tokens, "must be >= 1 (tokens generated per item).", "use eval.max_new_tokens=48"
            )
        )
    if cfg.worst_regressions < 0:
        problems.append(Problem(f"{prefix}.worst_regressions", cfg.worst_regressions, "must be >= 0.", "use 20, or 0 to list none"))
    if cfg.torch_threads < 0:
        problems.append(Problem(f"{prefix}.torch_threads", cfg.torch_threads, "must be >= 0.", "use 0 (auto) or a thread count"))
    if not cfg.eval_set:
        problems.append(
            Problem(f"{prefix}.eval_set", None, "no eval set given.", "set eval.eval_set=/path/to/eval.jsonl or eval=support_v2")
        )
    if not 0.5 <= cfg.gate.confidence < 1.0:
        problems.append(Problem(f"{prefix}.gate.confidence", cfg.gate.confidence, "must be in [0.5, 1).", "use 0.95"))
    if cfg.limit is not None and cfg.limit < 1:
        problems.append(Problem(f"{prefix}.limit", cfg.limit, "must be >= 1 or null.", "remove the override or set eval.limit=100"))
    return problems


def _gate_problems(g: GateConfig, prefix: str) -> list[Problem]:
    """:func:`validate`: the ``eval.gate`` ranges (``prefix`` = ``eval.gate``)."""
    problems: list[Problem] = []
    if g.bootstrap_samples < 100:
        problems.append(Problem(f"{prefix}.bootstrap_samples", g.bootstrap_samples, "must be >= 100.", "use 2000"))
    if not 0.0 <= g.min_agreement <= 1.0:
        problems.append(Problem(f"{prefix}.min_agreement", g.min_agreement, "must be in [0, 1].", "use 0.0 (off) or e.g. 0.8"))
    for name in ("min_score", "max_drop", "slice_max_drop"):
        v = getattr(g, name)
        if v is not None and not 0.0 <= v <= 1.0:
            problems.append(
                Problem(
                    f"{prefix}.{name}",
                    v,
                    "must be in [0, 1]: a share of items, not a percentage"
                    + (" (0.05 = a drop of 5 percentage points)." if name != "min_score" else " (0.9 = 90 %)."),
                    f"e.g. {prefix}.{name}={min(abs(v) / 100, 1.0):g}" if abs(v) > 1 else f"e.g. {prefix}.{name}=0.05",
                )
            )
    for table, hi in (("max_drop_by_recipe", 1.0), ("max_kld_by_recipe", None), ("min_top1_by_recipe", 1.0)):
        for recipe, v in (getattr(g, table) or {}).items():
            if v is None or v < 0 or (hi is not None and v > hi):
                problems.append(
                    Problem(
                        f"{prefix}.{table}.{recipe}",
                        v,
                        "must be in [0, 1]." if hi is not None else "must be >= 0 (nats).",
                        f"e.g. {prefix}.{table}.{recipe}={v / 100:g} if {v} was meant in percent"
                        if hi is not None and v is not None and 1 < v <= 100
                        else "use the shipped value (pipeline --cfg job prints it) or a number in that range",
                    )
                )
    for name in ("max_kld", "min_top1"):
        v = getattr(g, name)
        if v is not None and (v < 0 or (name == "min_top1" and v > 1)):
            problems.append(Problem(f"{prefix}.{name}", v, "out of range.", "max_kld >= 0 (nats); min_top1 in [0, 1]"))
    return problems
