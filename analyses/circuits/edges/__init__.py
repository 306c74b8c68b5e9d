"""Edge circuits: the graph of a model (:mod:`.graph`), edge attribution scores (EAP, EAP-IG),
circuits at budgets evaluated by exact edge patching, and their faithfulness.
"""
