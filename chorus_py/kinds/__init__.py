"""The kinds of query the engine answers, one module each, all behind one interface
(``base.QueryKind``: prepare, then run):

``public``   public tables only: exact, free.
``single``   one private table, analytic sensitivity (``analytic`` is what it shares with joins;
             ``selection`` its private choices of caps and clipping bounds; ``templates`` its
             rewritten SQL as text with holes).
``join``     joins, elastic sensitivity.
``sampled``  sensitivity sampling (random DP), opt-in.
``quantile`` MEDIAN, percentiles, MIN and MAX: the exponential mechanism over a one-scan histogram.
``mixed``    quantiles next to COUNT/SUM/AVG-like aggregates: both kinds under one charge.

A new kind is a new module with a class satisfying ``QueryKind``, and a line
in ``Engine._pick``.  No kind imports the engine: what they use comes in ``base.Services``.
"""
