"""Configuration of the head-role analyses, and what each role analysis returns.

Every threshold is here, with its source; all are configurable.

>>> RolesConfig().margin, RolesConfig().positional_threshold
(0.1, 0.9)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields

import pandas as pd

#: seeds the generators take: numpy's classic bound; derived seeds (clustering: seed * 1_000_003 + crc32) stay < 2**64
MAX_SEED = 2**32 - 1


def is_seed(value) -> bool:
    """An int (not a bool) in ``[0, MAX_SEED]``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


@dataclass(frozen=True, kw_only=True)
class RolesConfig:
    """Settings of the role analyses (:func:`~headscope.analyses.roles.pipeline.head_roles`),
    written into run.json: the seed, the uncertainty (bootstrap resamples, permutations, the
    interval level), the verdict (``alpha``, ``correction`` ``"bh"``/``"by"``/``"none"`` over a
    ``family`` ``"role"``/``"global"``, ``margin`` and each role's threshold), the syntactic and
    induction inputs, and the batching; each field is commented in the source.

    >>> RolesConfig(correction="holm")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ...
    """

    seed: int = 0
    # uncertainty
    n_boot: int = 1000  # bootstrap resamples over items for ci_low/ci_high
    ci_level: float = 0.95
    n_perm: int = 2000  # sign-flip permutations for p_value (continuous scores, or a baseline neither 0/1 nor constant)
    # where the permutation floor 1/(n_perm+1) is not below what the correction needs (alpha/m for BH over m heads),
    # heads with p < alpha are redrawn with ceil(1/needed) permutations, at most max(n_perm, n_perm_max); only a p
    # still at the floor after that takes the normal tail (the `test` column says which)
    n_perm_max: int = 200_000
    alpha: float = 0.01  # significance level for a verdict (after correction)
    # "bh" (Benjamini-Hochberg), "by" (Benjamini-Yekutieli: FDR under any dependence) or "none"
    correction: str = "bh"
    # the family a correction spans: "role" = the heads of one role/relation/direction (one verdict_rows call);
    # "global" = every row of the run's roles table (analyses.stats.verdicts.apply_family)
    family: str = "role"
    # thresholds
    margin: float = 0.10  # score must beat the baseline by this much (Voita et al. 2019)
    positional_threshold: float = 0.90  # Voita et al. 2019: >=90% of max-attention on one offset
    special_threshold: float = 0.50  # mean attention mass on [CLS]/[SEP]/BOS/first token for a sink head
    punctuation_threshold: float = 0.30  # mean attention mass on punctuation, vs its share under uniform attention
    induction_threshold: float = 0.40  # induction / duplicate / previous-token score (transformer-lens uses 0.4-ish)
    rare_threshold: float = 0.50  # share of max-attention on the sentence's rarest token (Voita: rare-word head)
    # syntactic
    full_labels: bool = False  # True: "nmod:poss"; False: "nmod" (the label before ':')
    min_instances: int = 20  # relations with fewer instances are reported but get no verdict
    # summary statistics
    entropy_smoothing: float = 0.0  # Clark et al. add a small uniform mass before entropy; 0 = none
    js_rows_per_item: int | None = 4  # query rows per item for the head-by-head JS matrix; None = all (slow)
    # induction sequences
    induction_seq_len: int = 20
    induction_n_sequences: int = 64
    # IOI roles (analyses.roles.ioi): items of the IOI task; S-inhibition heads by path patching (costly: opt-in)
    ioi_n_items: int = 32
    ioi_s_inhibition: bool = False
    # function-vector heads (analyses.roles.function_vector): mean and scored prompts per task (Todd et al.'s
    # statistics on more prompts: `headscope roles --fv-prompts 8`; each prompt costs ~2 re-runs of the last
    # position per head: SmolLM2 ~2 s of one core)
    fv_prompts: int = 5
    # running
    batch_size: int = 32
    #: query rows per pattern piece where the backend hands over Q and K (the pattern is never
    #: stored, :mod:`headscope.probes.chunked`); None: stored patterns. The figures do not change.
    query_chunk: int | None = 128

    def __post_init__(self):
        if self.correction not in ("bh", "by", "none"):
            raise ValueError(
                f"The 'correction' parameter of RolesConfig must be 'bh', 'by' or 'none'; got {self.correction!r}."
            )
        if self.family not in ("role", "global"):
            raise ValueError(f"The 'family' parameter of RolesConfig must be 'role' or 'global'; got {self.family!r}.")
        if not isinstance(self.n_perm_max, int) or isinstance(self.n_perm_max, bool) or self.n_perm_max < 1:
            raise ValueError(
                f"The 'n_perm_max' parameter of RolesConfig must be a positive int; got {self.n_perm_max!r}."
            )
        # a role's threshold is a field named <role>_threshold: checked here without listing it
        thresholds = tuple(f.name for f in fields(self) if f.name.endswith("_threshold"))
        for k in ("margin", "alpha", "ci_level", *thresholds):
            v = getattr(self, k)
            if not 0 <= v <= 1:
                raise ValueError(f"The {k!r} parameter of RolesConfig must be in [0, 1]; got {v!r}.")
        if self.js_rows_per_item is not None and (
            not isinstance(self.js_rows_per_item, int) or self.js_rows_per_item < 1
        ):
            raise ValueError(
                f"The 'js_rows_per_item' parameter of RolesConfig must be a positive int or None; "
                f"got {self.js_rows_per_item!r}."
            )
        if not is_seed(self.seed):
            raise ValueError(
                f"The 'seed' parameter of RolesConfig must be an int in [0, 2**32 - 1]; got {self.seed!r}."
            )
        if self.query_chunk is not None and (
            not isinstance(self.query_chunk, int) or isinstance(self.query_chunk, bool) or self.query_chunk < 1
        ):
            raise ValueError(
                f"The 'query_chunk' parameter of RolesConfig must be a positive int or None; got {self.query_chunk!r}."
            )
        if not isinstance(self.ioi_n_items, int) or isinstance(self.ioi_n_items, bool) or self.ioi_n_items < 1:
            raise ValueError(
                f"The 'ioi_n_items' parameter of RolesConfig must be a positive int; got {self.ioi_n_items!r}."
            )
        if not isinstance(self.fv_prompts, int) or isinstance(self.fv_prompts, bool) or self.fv_prompts < 2:
            raise ValueError(f"The 'fv_prompts' parameter of RolesConfig must be an int >= 2; got {self.fv_prompts!r}.")
        if self.n_boot < 1 or self.n_perm < 1 or self.batch_size < 1:
            raise ValueError("n_boot, n_perm and batch_size must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoleOutput:
    """What one role analysis returns: ``frame`` (ROLE_COLUMNS rows), optional ``stats``
    (STAT_COLUMNS rows), ``skipped`` counts by reason (items that could not be used),
    and ``examples``: for the report, an item index per head worth showing."""

    frame: pd.DataFrame
    stats: pd.DataFrame | None = None
    skipped: Counter = field(default_factory=Counter)
    n_items: int = 0
    extra: dict = field(default_factory=dict)
