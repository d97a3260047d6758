"""xfuse.fusion: the pass manager, simplification and fusion passes, cost model, fusion report.

May import xfuse.hlo and networkx.
"""
