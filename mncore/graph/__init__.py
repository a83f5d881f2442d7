"""From pending roots to a keyed graph: collect, ``GraphKey``, stable names, recompile notes, FX build."""
from mncore.graph.collect import Collected, collect
from mncore.graph.key import GraphKey, graph_key, stable_name

__all__ = ["Collected", "GraphKey", "collect", "graph_key", "stable_name"]
