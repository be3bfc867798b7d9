"""Data-CUBE curriculum (docs/design.md, Data-CUBE): offline jobs that turn a dataset store and a reference model
into the files a batch plan consumes.

- ``similarity``: task representations (Eq. 4), task similarity (Eq. 5), heat map;
- ``order``: the cyclic objective (Eq. 6) and its solvers -- simulated annealing (Eq. 7), 2-opt / Or-opt, Held-Karp;
- ``difficulty``: instance difficulty phi (Eq. 8), instance orders (E2D / D2E / random), mask counts (Eq. 9);
- ``cli``: ``jaxembed score``, ``jaxembed curriculum`` and ``jaxembed mine`` (mining itself: ``jaxembed.mining``).
"""
