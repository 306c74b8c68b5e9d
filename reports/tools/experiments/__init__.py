"""The README's figures regenerated from code (``make figures``: :mod:`.patching_figures`,
:mod:`.atp_figures`, :mod:`.report_figures`, :mod:`.weights_figures`, :mod:`.kv_figures`, written by
:mod:`.figures_doc`), and a study beyond the main pipeline: train-small vs prune-big on a synthetic
task (:mod:`.train_time`). (Ray-sharded runs are the stages' own: :mod:`headscope.reports.stages.sharded`.)"""
