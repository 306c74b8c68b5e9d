"""A sweep over transformers' registry: every text family built from a tiny random config
(:mod:`~headscope.analyses.sweep.tiny_config`), every stage run on it on the default backend
(:mod:`~headscope.analyses.sweep.run`), and the table the README's family table is rendered from
(:mod:`~headscope.analyses.sweep.table`); ``headscope sweep`` runs it."""
