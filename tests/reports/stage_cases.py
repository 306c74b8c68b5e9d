"""What the stage tests share: :func:`small_config` (every stage on with small settings: the same
frames, columns and dtypes as the default run, a fraction of its time) and a toy stage written as a
new stage would be, in one module (its registry line is the test's ``monkeypatch.setitem(STAGES, ...)``):
it counts the heads each role holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from headscope.analyses.kvcache.stage import KVStageConfig
from headscope.analyses.pruning.study import PruneConfig
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.run_patching import CausalConfig
from headscope.analyses.run_weights import WeightsConfig
from headscope.reports.document import Paragraph, Section
from headscope.reports.stages.base import Stage, StageResult, WorkingSet
from headscope.reports.stages.config import RunConfig
from headscope.reports.stages.quick import QUICK_PRUNING


def small_config(**kw) -> RunConfig:
    """Every stage on (the circuits stage, off by default, too), each with small settings."""
    return RunConfig(
        roles_config=RolesConfig(n_boot=50, n_perm=100, n_perm_max=200, induction_n_sequences=8, ioi_n_items=8),
        prune_config=PruneConfig(**QUICK_PRUNING, n_items=6, role_draws=2),
        causal_config=CausalConfig(n_items=4, n_boot=50, n_perm=100),
        weights_config=WeightsConfig(draws=20, null=50),
        kv_config=KVStageConfig(tokens=64, role_items=2, role_tokens=64, causal_items=2),
        **{"on": ("circuits",), "configs": {"context": _small_context(), "circuits": _small_circuits()}, **kw},
    )


def _small_circuits():
    from headscope.analyses.circuits.edges.study import CircuitsConfig

    return CircuitsConfig(n_items=4, seq_len=4, steps=2, seeds=2)


def _small_context():
    from headscope.analyses.context import ContextConfig

    return ContextConfig(max_words=3, max_per_sense=3, attention_sentences=4, n_boot=50, n_perm=10)


@dataclass(frozen=True, kw_only=True)
class CountConfig:
    top: int = field(default=3, metadata={"help": "roles listed in the section"})
    fail: bool = field(default=False, metadata={"help": "raise inside run (to test a failing stage)"})


class CountStage(Stage[CountConfig]):
    name = "count"
    Config = CountConfig
    help = "heads per role"
    requires = ("roles",)
    unit = "heads"
    schemas = {"count": {"role": "object", "n": "int64"}}

    def plan(self, ctx, cfg):
        return [WorkingSet(name="count", batch_size=1, longest=1, logits="none")]

    def run(self, ctx, cfg):
        if cfg.fail:
            raise RuntimeError("the toy stage broke")
        r = ctx.frames["roles"]
        n = r[r["verdict"].astype(bool)].groupby(r["role"].astype(str)).size()
        frame = pd.DataFrame({"role": n.index.astype(object), "n": n.to_numpy().astype("int64")})
        return StageResult({"count": frame}, {"roles": len(frame)})

    def section(self, frames, meta):
        c = frames.get("count")
        why = (meta.get("absent") or {}).get(self.name)
        text = f"Absent, because {why}." if why else f"{0 if c is None else len(c)} roles hold a head."
        return [Section(id="count", title="Heads per role", blocks=[Paragraph(text)])]


class AfterCount(CountStage):
    name = "after_count"
    requires = ("count",)
    schemas = {}

    def run(self, ctx, cfg):
        return StageResult({}, {})


STAGE = CountStage()
AFTER = AfterCount()
