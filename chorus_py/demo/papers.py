"""A synthetic co-authorship hypergraph for the demo: papers that belong to all their authors.

:func:`generate_papers` returns two tables as numpy arrays:

``papers`` (private; the privacy unit is every author of the paper)
    ``paper_id BIGINT`` 1..P, ``field TEXT`` (cs 35%, physics 25%, math 15%, bio 15%, econ 10%),
    ``year BIGINT`` 2016..2025 (uniform), ``citations DOUBLE``.
``paper_authors`` (the attribution table: one row per (paper, author) pair, never declared to
analysts)
    ``paper_id BIGINT``, ``author_id BIGINT``.

Distributions (one ``numpy.random.Generator`` seeded with ``seed``):

- authors per paper: 1..10 with probabilities 12, 20, 20, 15, 11, 8, 5, 4, 3, 2 % (mean about 3.9);
- authors: about 0.8 P of them; each author slot of a paper picks an author with probability
  proportional to the author's productivity, lognormal with sigma 1.4, so degrees are skewed (most
  authors have one or two papers, a few have hundreds); an author drawn twice for one paper
  counts once, so a paper may end up with fewer authors than drawn;
- citations: lognormal, median 4 * (1 + 0.25 (authors - 1)) (papers with more authors are cited
  more, as the paper's "bias" experiments assume: a selection that favours papers with few
  authors lowers the average), sigma 1.1, rounded, at most 5000.
"""

from __future__ import annotations

import io

import duckdb
import numpy as np

FIELDS: tuple[str, ...] = ("cs", "physics", "math", "bio", "econ")
_FIELD_WEIGHTS = np.array([0.35, 0.25, 0.15, 0.15, 0.10])
_DEGREE_WEIGHTS = np.array([12, 20, 20, 15, 11, 8, 5, 4, 3, 2], dtype=float)
MAX_AUTHORS = 10
FIRST_YEAR, LAST_YEAR = 2016, 2025


def demo_paper_count(trips: int) -> int:
    """Papers generated next to ``trips`` trips by ``chorus demo`` (one per 20 trips, >= 500)."""
    return max(500, trips // 20)


def generate_papers(papers: int, seed: int, author_pool: float = 0.8,
                    productivity_sigma: float = 1.4
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(papers, paper_authors)`` as dicts of numpy arrays (see the module docstring).

    ``author_pool`` authors per paper and ``productivity_sigma`` set how dense and how skewed
    the co-authorship is (the demo's defaults: 0.8 and 1.4; benchmarks vary them).
    """
    if papers < 1:
        raise ValueError("papers must be >= 1")
    rng = np.random.default_rng(seed)
    degree = rng.choice(np.arange(1, MAX_AUTHORS + 1), size=papers,
                        p=_DEGREE_WEIGHTS / _DEGREE_WEIGHTS.sum())
    n_authors = max(1, int(papers * author_pool))
    productivity = rng.lognormal(0.0, productivity_sigma, size=n_authors)
    slots = int(degree.sum())
    # Inverse-CDF sampling of authors by productivity (one searchsorted, no Python loop).
    cdf = np.cumsum(productivity)
    author = np.searchsorted(cdf, rng.random(slots) * cdf[-1], side="right")
    author = np.minimum(author, n_authors - 1) + 1
    paper = np.repeat(np.arange(1, papers + 1, dtype=np.int64), degree)
    # Author ids are shuffled so that an id says nothing about productivity.
    relabel = rng.permutation(n_authors).astype(np.int64) + 1
    pairs = np.unique(paper * (n_authors + 1) + relabel[author - 1])
    pair_paper, pair_author = pairs // (n_authors + 1), pairs % (n_authors + 1)
    actual = np.bincount(pair_paper, minlength=papers + 1)[1:]
    median = 4.0 * (1.0 + 0.25 * (actual - 1))
    citations = np.minimum(np.rint(median * rng.lognormal(0.0, 1.1, size=papers)), 5000.0)
    table = {
        "paper_id": np.arange(1, papers + 1, dtype=np.int64),
        "field": rng.choice(len(FIELDS), size=papers, p=_FIELD_WEIGHTS).astype(np.uint8),
        "year": rng.integers(FIRST_YEAR, LAST_YEAR + 1, size=papers).astype(np.int64),
        "citations": citations.astype(np.float64),
    }
    return table, {"paper_id": pair_paper.astype(np.int64),
                   "author_id": pair_author.astype(np.int64)}


_FIELD_LIST_SQL = "[" + ", ".join(f"'{f}'" for f in FIELDS) + "]"


def load_papers_duckdb(con: duckdb.DuckDBPyConnection, papers: dict[str, np.ndarray],
                       authors: dict[str, np.ndarray]) -> None:
    """Create (or replace) ``papers`` and ``paper_authors`` in an open DuckDB connection."""
    con.register("_chorus_demo_papers", papers)
    con.register("_chorus_demo_authors", authors)
    try:
        con.execute("CREATE OR REPLACE TABLE papers (paper_id BIGINT, field VARCHAR, "
                    "year BIGINT, citations DOUBLE)")
        con.execute(f"INSERT INTO papers SELECT paper_id, ({_FIELD_LIST_SQL})[field + 1], "
                    "year, citations FROM _chorus_demo_papers")
        con.execute("CREATE OR REPLACE TABLE paper_authors AS "
                    "SELECT paper_id, author_id FROM _chorus_demo_authors")
    finally:
        con.unregister("_chorus_demo_papers")
        con.unregister("_chorus_demo_authors")


def load_papers_postgres(url: str, papers: dict[str, np.ndarray],
                         authors: dict[str, np.ndarray]) -> None:
    """Replace ``papers`` and ``paper_authors`` in the Postgres database at ``url`` (COPY)."""
    import psycopg  # imported here: the DuckDB demo must not need a Postgres driver at runtime

    fields = np.array(FIELDS)[papers["field"]]
    rows = io.StringIO()
    for pid, field, year, cites in zip(papers["paper_id"].tolist(), fields.tolist(),
                                       papers["year"].tolist(), papers["citations"].tolist(),
                                       strict=True):
        rows.write(f"{pid},{field},{year},{cites!r}\n")
    pairs = io.StringIO()
    np.savetxt(pairs, np.column_stack([authors["paper_id"], authors["author_id"]]), fmt="%d",
               delimiter=",")
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS papers; DROP TABLE IF EXISTS paper_authors; "
                    "CREATE TABLE papers (paper_id BIGINT PRIMARY KEY, field TEXT NOT NULL, "
                    "year BIGINT NOT NULL, citations DOUBLE PRECISION NOT NULL); "
                    "CREATE TABLE paper_authors (paper_id BIGINT NOT NULL, "
                    "author_id BIGINT NOT NULL)")
        with cur.copy("COPY papers FROM STDIN (FORMAT csv)") as copy:
            copy.write(rows.getvalue())
        with cur.copy("COPY paper_authors FROM STDIN (FORMAT csv)") as copy:
            copy.write(pairs.getvalue())
        cur.execute("CREATE INDEX paper_authors_paper_idx ON paper_authors (paper_id)")
        cur.execute("ANALYZE papers")
        cur.execute("ANALYZE paper_authors")
