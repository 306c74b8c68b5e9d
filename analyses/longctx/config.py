"""Configuration of the long-context roles and their causal check.

Every threshold is here, with its source; all are configurable. The statistics (bootstrap
intervals, permutation p, the correction across heads, ``alpha``) are the roles'
(:class:`~headscope.analyses.roles.config.RolesConfig`, field ``stats``).

>>> LongContextConfig().n_tokens, LongContextConfig().windows
(2048, (16, 64, 256))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from headscope.analyses.roles.config import RolesConfig, is_seed


@dataclass(frozen=True, kw_only=True)
class LongContextConfig:
    # items: the needle task (analyses.longctx.needle)
    n_tokens: int = 2048  # tokens per item (capped at the model's context by long_context_roles)
    # needle items, needles at depths (i + 0.5) / n_items; items are the resampling unit, and the sign-flip p of
    # n items is at least 2**-n: 16 lets BH over a few hundred heads pass at alpha 0.01 (8 items cannot on SmolLM2)
    n_items: int = 16
    needle_len: int = 8
    corpus: str = "generated"  # the haystack: "generated", "shipped" or a text file
    seed: int = 0
    # retrieval (Wu et al. 2024): share of copied needle tokens a head's top-1 key lands on
    retrieval_threshold: float = 0.10  # Wu et al.'s retrieval heads score above 0.1
    # streaming (Xiao et al. 2024, StreamingLLM / DuoAttention): mass within sink + recent window
    sink_tokens: int = 4  # StreamingLLM keeps the first 4 tokens
    windows: tuple[int, ...] = (16, 64, 256)  # recent windows (keys j > i - w), one row per window
    streaming_threshold: float = 0.90  # share of the mass within sink + window
    # sink: mass on the first sink_tokens keys of queries at long range (the last long_range of the item)
    sink_threshold: float = 0.50  # as the roles' special_threshold
    long_range: float = 0.5  # queries in the second half of each item
    sink_bos_pass: bool = True  # a second pass with BOS put in (or taken out): does the sink move?
    margin: float = 0.10  # streaming and sink also beat the uniform baseline by this much
    # running
    query_chunk: int | None = 128  # query rows per pattern piece (probes.chunked); None: stored patterns
    # causal check (analyses.longctx.causal): mask the top share of heads by retrieval score
    causal_share: float = 0.05  # Wu et al.: fewer than 5% of heads; at least one is masked
    causal_draws: int = 5  # random sets of as many heads, outside the top set
    causal_items: int | None = None  # items of the causal check (None: n_items)
    stats: RolesConfig = field(default_factory=RolesConfig)

    def __post_init__(self):
        for name, lo in (("n_tokens", 8), ("n_items", 1), ("needle_len", 1), ("sink_tokens", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"The {name!r} parameter of LongContextConfig must be an int >= {lo}; got {v!r}.")
        for name in ("query_chunk", "causal_draws"):
            v = getattr(self, name)
            if v is None and name == "query_chunk":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {name!r} parameter of LongContextConfig must be a positive int; got {v!r}.")
        if self.causal_items is not None and (not isinstance(self.causal_items, int) or self.causal_items < 1):
            raise ValueError(f"The 'causal_items' parameter must be a positive int or None; got {self.causal_items!r}.")
        if not self.windows or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in self.windows):
            raise ValueError(f"The 'windows' parameter must be positive ints; got {self.windows!r}.")
        for name in ("retrieval_threshold", "streaming_threshold", "sink_threshold", "margin", "causal_share"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"The {name!r} parameter of LongContextConfig must be in [0, 1]; got {v!r}.")
        if not 0 <= self.long_range < 1:
            raise ValueError(f"The 'long_range' parameter must be in [0, 1); got {self.long_range!r}.")
        if not is_seed(self.seed):
            raise ValueError(f"The 'seed' parameter must be an int in [0, 2**32 - 1]; got {self.seed!r}.")
        if not isinstance(self.stats, RolesConfig):
            raise TypeError(f"The 'stats' parameter must be a RolesConfig; got {type(self.stats).__name__}.")

    def to_dict(self) -> dict:
        return asdict(self)
