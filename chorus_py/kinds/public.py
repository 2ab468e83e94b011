"""Queries that read public tables only: answered exactly, free of charge, on the connection
restricted to the public tables (wall 5 of DESIGN.md section 11)."""

from __future__ import annotations

from analyses.binding import generated_sql
from analyses.query import PublicQuery
from chorus_py.kinds.analytic import portable
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.report import PrivacyReport
from chorus_py.statements import QueryRun


class PublicKind:
    """Public-only queries: the analyst's SQL, bound to the public tables, runs as it is."""

    charges = False

    def __init__(self, services: Services) -> None:
        self.services = services

    def prepare(self, query: PublicQuery, analyst: str, epsilon: float,
                delta: float) -> Prepared:
        """The statement (the bound tree, every table qualified), verified: it may read only
        the public tables its analysis found."""
        services = self.services
        sql = generated_sql(query.tree, query.tables, services.dialect,
                            services.schema)
        services.statements.verify_outgoing(sql, "exact", query.tables)
        report = PrivacyReport(
            analyst=analyst, verdict="allowed", charged=False, epsilon=0.0, delta=0.0,
            noise="none", tables=query.tables, blocks=(),
            notes=("public tables only: answered exactly, free of charge",),
        )
        return Prepared(report, (), (), sql)

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """The exact answer, on the restricted connection."""
        return Answer(portable(self.services.statements.run(prepared.detail, None, public=True)))
