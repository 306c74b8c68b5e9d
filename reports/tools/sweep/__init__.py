"""A sweep over transformers' registry: every text family built from a tiny random config
(:mod:`~headscope.reports.tools.sweep.tiny_config`), every command checked on it on the default backend
(:mod:`~headscope.reports.tools.sweep.run`), and the table the README's family table is rendered from
(:mod:`~headscope.reports.tools.sweep.table`); ``headscope sweep`` runs it."""
