"""Circuits, two ways: read from the weights alone (:mod:`.weights`: OV/QK circuits and composition
between heads, Elhage et al. 2021) and found from edge attributions on a task (:mod:`.edges`: EAP and
EAP-IG edge scores, circuits at budgets, exact edge patching, faithfulness).
"""
