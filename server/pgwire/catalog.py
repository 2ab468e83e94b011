"""A small fake Postgres catalog describing the policy's tables, and nothing else.

Clients ask the server about itself when they connect and when a tool browses tables: psql's
``\\d``, SQLAlchemy's inspector, pgjdbc's ``DatabaseMetaData``, ``SELECT version()``.  Those
queries are never forwarded to the real database (it would expose its real catalog, statistics
included).  They run here instead, on a private in-memory DuckDB holding Postgres-shaped catalog
tables (``pg_class``, ``pg_attribute``, ``pg_type``, ``information_schema.columns``...) that list
the tables and columns of the policy only, with names and types and nothing else: no row counts,
no statistics, no data.  That DuckDB cannot read files or the network, and holds no data to leak.

The analyst's SQL (Postgres dialect) is rewritten with sqlglot before it runs there: catalog
names point to the fake tables, ``::regclass`` and friends become lookups, Postgres-only
functions become small macros, and session functions (``current_user``, ``version()``...) become
literals.  Result columns are named the way Postgres names them.

The same module types analyst queries for ``Describe`` without running them: the policy's tables
exist here as *empty* tables with the declared column types, so DuckDB can bind a query and
report its output types while reading nothing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
from sqlglot import exp

from chorus_py.backends import cancellable
from server.pgwire import types as t

VERSION = "15.0"
SERVER_VERSION = f"{VERSION} (chorus-py differential-privacy proxy)"
VERSION_STRING = (f"PostgreSQL {VERSION} (chorus-py differential-privacy proxy; answers are "
                  "noisy aggregates)")
OWNER = "chorus"
PUBLIC_NS, CATALOG_NS, INFO_NS = 2200, 11, 13_000
FIRST_TABLE_OID = 16_400

_CATALOG_SCHEMA = "pgc"
_INFO_SCHEMA = "pgi"


class CatalogError(Exception):
    """A catalog query the fake catalog cannot answer; carries a SQLSTATE."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


@dataclass(frozen=True)
class Column:
    """A result column: its name and wire type."""

    name: str
    oid: int


@dataclass(frozen=True)
class CatalogResult:
    """Rows of a catalog answer."""

    columns: tuple[Column, ...]
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class SessionInfo:
    """What session functions return: ``current_user``, ``current_database()``..."""

    user: str
    database: str
    pid: int
    settings: Mapping[str, str]


# -- the fake catalog tables (Postgres column names, DuckDB types) ------------------------------

_B, _I, _S, _V, _F, _VA, _BA, _SA = ("BIGINT", "INTEGER", "SMALLINT", "VARCHAR", "DOUBLE",
                                    "VARCHAR[]", "BIGINT[]", "SMALLINT[]")
_BOOL = "BOOLEAN"
CATALOG_TABLES: dict[str, list[tuple[str, str]]] = {
    "pg_namespace": [("oid", _B), ("nspname", _V), ("nspowner", _B), ("nspacl", _VA)],
    "pg_class": [
        ("oid", _B), ("relname", _V), ("relnamespace", _B), ("reltype", _B), ("reloftype", _B),
        ("relowner", _B), ("relam", _B), ("relfilenode", _B), ("reltablespace", _B),
        ("relpages", _I), ("reltuples", "REAL"), ("relallvisible", _I), ("reltoastrelid", _B),
        ("relhasindex", _BOOL), ("relisshared", _BOOL), ("relpersistence", _V),
        ("relkind", _V), ("relnatts", _S), ("relchecks", _S), ("relhasrules", _BOOL),
        ("relhastriggers", _BOOL), ("relhassubclass", _BOOL), ("relrowsecurity", _BOOL),
        ("relforcerowsecurity", _BOOL), ("relispopulated", _BOOL), ("relreplident", _V),
        ("relispartition", _BOOL), ("relrewrite", _B), ("relfrozenxid", _B),
        ("relminmxid", _B), ("relacl", _VA), ("reloptions", _VA), ("relpartbound", _V)],
    "pg_attribute": [
        ("attrelid", _B), ("attname", _V), ("atttypid", _B), ("attstattarget", _I),
        ("attlen", _S), ("attnum", _S), ("attndims", _I), ("attcacheoff", _I),
        ("atttypmod", _I), ("attbyval", _BOOL), ("attalign", _V), ("attstorage", _V),
        ("attcompression", _V), ("attnotnull", _BOOL), ("atthasdef", _BOOL),
        ("atthasmissing", _BOOL), ("attidentity", _V), ("attgenerated", _V),
        ("attisdropped", _BOOL), ("attislocal", _BOOL), ("attinhcount", _I),
        ("attcollation", _B), ("attacl", _VA), ("attoptions", _VA), ("attfdwoptions", _VA),
        ("attmissingval", _V)],
    "pg_type": [
        ("oid", _B), ("typname", _V), ("typnamespace", _B), ("typowner", _B), ("typlen", _S),
        ("typbyval", _BOOL), ("typtype", _V), ("typcategory", _V), ("typispreferred", _BOOL),
        ("typisdefined", _BOOL), ("typdelim", _V), ("typrelid", _B), ("typsubscript", _V),
        ("typelem", _B), ("typarray", _B), ("typinput", _V), ("typoutput", _V),
        ("typreceive", _V), ("typsend", _V), ("typmodin", _V), ("typmodout", _V),
        ("typanalyze", _V), ("typalign", _V), ("typstorage", _V), ("typnotnull", _BOOL),
        ("typbasetype", _B), ("typtypmod", _I), ("typndims", _I), ("typcollation", _B),
        ("typdefaultbin", _V), ("typdefault", _V), ("typacl", _VA)],
    "pg_am": [("oid", _B), ("amname", _V), ("amhandler", _V), ("amtype", _V)],
    "pg_attrdef": [("oid", _B), ("adrelid", _B), ("adnum", _S), ("adbin", _V)],
    "pg_collation": [("oid", _B), ("collname", _V), ("collnamespace", _B), ("collowner", _B),
                     ("collprovider", _V), ("collisdeterministic", _BOOL),
                     ("collencoding", _I), ("collcollate", _V), ("collctype", _V)],
    "pg_index": [("indexrelid", _B), ("indrelid", _B), ("indnatts", _S), ("indnkeyatts", _S),
                 ("indisunique", _BOOL), ("indisprimary", _BOOL), ("indisexclusion", _BOOL),
                 ("indimmediate", _BOOL), ("indisclustered", _BOOL), ("indisvalid", _BOOL),
                 ("indcheckxmin", _BOOL), ("indisready", _BOOL), ("indislive", _BOOL),
                 ("indisreplident", _BOOL), ("indkey", _SA), ("indcollation", _BA),
                 ("indclass", _BA), ("indoption", _SA), ("indexprs", _V), ("indpred", _V),
                 ("indnullsnotdistinct", _BOOL)],
    "pg_constraint": [("oid", _B), ("conname", _V), ("connamespace", _B), ("contype", _V),
                      ("condeferrable", _BOOL), ("condeferred", _BOOL),
                      ("convalidated", _BOOL), ("conrelid", _B), ("contypid", _B),
                      ("conindid", _B), ("conparentid", _B), ("confrelid", _B),
                      ("confupdtype", _V), ("confdeltype", _V), ("confmatchtype", _V),
                      ("conislocal", _BOOL), ("coninhcount", _I), ("connoinherit", _BOOL),
                      ("conkey", _SA), ("confkey", _SA), ("conpfeqop", _BA),
                      ("conppeqop", _BA), ("conffeqop", _BA), ("conexclop", _BA),
                      ("conbin", _V)],
    "pg_description": [("objoid", _B), ("classoid", _B), ("objsubid", _I),
                       ("description", _V)],
    "pg_inherits": [("inhrelid", _B), ("inhparent", _B), ("inhseqno", _I),
                    ("inhdetachpending", _BOOL)],
    "pg_policy": [("oid", _B), ("polname", _V), ("polrelid", _B), ("polcmd", _V),
                  ("polpermissive", _BOOL), ("polroles", _BA), ("polqual", _V),
                  ("polwithcheck", _V)],
    "pg_statistic_ext": [("oid", _B), ("stxrelid", _B), ("stxname", _V), ("stxnamespace", _B),
                         ("stxowner", _B), ("stxstattarget", _I), ("stxkeys", _SA),
                         ("stxkind", _VA), ("stxexprs", _V)],
    "pg_publication": [("oid", _B), ("pubname", _V), ("pubowner", _B),
                       ("puballtables", _BOOL), ("pubinsert", _BOOL), ("pubupdate", _BOOL),
                       ("pubdelete", _BOOL), ("pubtruncate", _BOOL), ("pubviaroot", _BOOL)],
    "pg_publication_namespace": [("oid", _B), ("pnpubid", _B), ("pnnspid", _B)],
    "pg_publication_rel": [("oid", _B), ("prpubid", _B), ("prrelid", _B), ("prqual", _V),
                           ("prattrs", _SA)],
    "pg_trigger": [("oid", _B), ("tgrelid", _B), ("tgparentid", _B), ("tgname", _V),
                   ("tgfoid", _B), ("tgtype", _S), ("tgenabled", _V), ("tgisinternal", _BOOL),
                   ("tgconstrrelid", _B), ("tgconstrindid", _B), ("tgconstraint", _B),
                   ("tgdeferrable", _BOOL), ("tginitdeferred", _BOOL), ("tgnargs", _S),
                   ("tgattr", _SA), ("tgargs", _V), ("tgqual", _V), ("tgoldtable", _V),
                   ("tgnewtable", _V)],
    "pg_rewrite": [("oid", _B), ("rulename", _V), ("ev_class", _B), ("ev_type", _V),
                   ("ev_enabled", _V), ("is_instead", _BOOL), ("ev_qual", _V),
                   ("ev_action", _V)],
    "pg_sequence": [("seqrelid", _B), ("seqtypid", _B), ("seqstart", _B),
                    ("seqincrement", _B), ("seqmax", _B), ("seqmin", _B), ("seqcache", _B),
                    ("seqcycle", _BOOL)],
    "pg_depend": [("classid", _B), ("objid", _B), ("objsubid", _I), ("refclassid", _B),
                  ("refobjid", _B), ("refobjsubid", _I), ("deptype", _V)],
    "pg_roles": [("oid", _B), ("rolname", _V), ("rolsuper", _BOOL), ("rolinherit", _BOOL),
                 ("rolcreaterole", _BOOL), ("rolcreatedb", _BOOL), ("rolcanlogin", _BOOL),
                 ("rolreplication", _BOOL), ("rolconnlimit", _I), ("rolpassword", _V),
                 ("rolvaliduntil", "TIMESTAMP"), ("rolbypassrls", _BOOL), ("rolconfig", _VA)],
    "pg_user": [("usename", _V), ("usesysid", _B), ("usecreatedb", _BOOL),
                ("usesuper", _BOOL), ("userepl", _BOOL), ("usebypassrls", _BOOL),
                ("passwd", _V), ("valuntil", "TIMESTAMP"), ("useconfig", _VA)],
    "pg_database": [("oid", _B), ("datname", _V), ("datdba", _B), ("encoding", _I),
                    ("datlocprovider", _V), ("datistemplate", _BOOL),
                    ("datallowconn", _BOOL), ("datconnlimit", _I), ("datfrozenxid", _B),
                    ("datminmxid", _B), ("dattablespace", _B), ("datcollate", _V),
                    ("datctype", _V), ("daticulocale", _V), ("datcollversion", _V),
                    ("datacl", _VA)],
    "pg_tablespace": [("oid", _B), ("spcname", _V), ("spcowner", _B), ("spcacl", _VA),
                      ("spcoptions", _VA)],
    "pg_proc": [("oid", _B), ("proname", _V), ("pronamespace", _B), ("proowner", _B),
                ("prolang", _B), ("prokind", _V), ("prorettype", _B), ("proargtypes", _BA),
                ("proargnames", _VA), ("prosrc", _V), ("proretset", _BOOL)],
    "pg_range": [("rngtypid", _B), ("rngsubtype", _B), ("rngmultitypid", _B),
                 ("rngcollation", _B), ("rngsubopc", _B), ("rngcanonical", _V),
                 ("rngsubdiff", _V)],
    "pg_enum": [("oid", _B), ("enumtypid", _B), ("enumsortorder", "REAL"),
                ("enumlabel", _V)],
    "pg_extension": [("oid", _B), ("extname", _V), ("extowner", _B), ("extnamespace", _B),
                     ("extrelocatable", _BOOL), ("extversion", _V)],
    "pg_foreign_table": [("ftrelid", _B), ("ftserver", _B), ("ftoptions", _VA)],
    "pg_partitioned_table": [("partrelid", _B), ("partstrat", _V), ("partnatts", _S),
                             ("partdefid", _B), ("partattrs", _SA)],
    "pg_event_trigger": [("oid", _B), ("evtname", _V), ("evtevent", _V), ("evtenabled", _V)],
    "pg_language": [("oid", _B), ("lanname", _V), ("lanowner", _B), ("lanispl", _BOOL),
                    ("lanpltrusted", _BOOL)],
    "pg_opclass": [("oid", _B), ("opcmethod", _B), ("opcname", _V), ("opcnamespace", _B),
                   ("opcowner", _B), ("opcfamily", _B), ("opcintype", _B),
                   ("opcdefault", _BOOL), ("opckeytype", _B)],
    "pg_operator": [("oid", _B), ("oprname", _V), ("oprnamespace", _B), ("oprleft", _B),
                    ("oprright", _B), ("oprresult", _B)],
    "pg_cast": [("oid", _B), ("castsource", _B), ("casttarget", _B), ("castfunc", _B),
                ("castcontext", _V), ("castmethod", _V)],
    "pg_tables": [("schemaname", _V), ("tablename", _V), ("tableowner", _V),
                  ("tablespace", _V), ("hasindexes", _BOOL), ("hasrules", _BOOL),
                  ("hastriggers", _BOOL), ("rowsecurity", _BOOL)],
    "pg_views": [("schemaname", _V), ("viewname", _V), ("viewowner", _V),
                 ("definition", _V)],
    "pg_matviews": [("schemaname", _V), ("matviewname", _V), ("matviewowner", _V),
                    ("definition", _V)],
    "pg_indexes": [("schemaname", _V), ("tablename", _V), ("indexname", _V),
                   ("tablespace", _V), ("indexdef", _V)],
    "pg_settings": [("name", _V), ("setting", _V), ("unit", _V), ("category", _V),
                    ("short_desc", _V), ("context", _V), ("vartype", _V), ("source", _V),
                    ("min_val", _V), ("max_val", _V), ("enumvals", _VA),
                    ("boot_val", _V), ("reset_val", _V)],
}
INFO_TABLES: dict[str, list[tuple[str, str]]] = {
    "schemata": [("catalog_name", _V), ("schema_name", _V), ("schema_owner", _V)],
    "tables": [("table_catalog", _V), ("table_schema", _V), ("table_name", _V),
               ("table_type", _V), ("is_insertable_into", _V), ("is_typed", _V)],
    "columns": [("table_catalog", _V), ("table_schema", _V), ("table_name", _V),
                ("column_name", _V), ("ordinal_position", _I), ("column_default", _V),
                ("is_nullable", _V), ("data_type", _V), ("character_maximum_length", _I),
                ("numeric_precision", _I), ("numeric_scale", _I), ("datetime_precision", _I),
                ("udt_catalog", _V), ("udt_schema", _V), ("udt_name", _V),
                ("is_identity", _V), ("is_generated", _V), ("is_updatable", _V)],
    "views": [("table_catalog", _V), ("table_schema", _V), ("table_name", _V),
              ("view_definition", _V)],
    "table_constraints": [("constraint_catalog", _V), ("constraint_schema", _V),
                          ("constraint_name", _V), ("table_catalog", _V),
                          ("table_schema", _V), ("table_name", _V), ("constraint_type", _V)],
    "key_column_usage": [("constraint_catalog", _V), ("constraint_schema", _V),
                         ("constraint_name", _V), ("table_catalog", _V),
                         ("table_schema", _V), ("table_name", _V), ("column_name", _V),
                         ("ordinal_position", _I)],
    "referential_constraints": [("constraint_catalog", _V), ("constraint_schema", _V),
                                ("constraint_name", _V), ("unique_constraint_name", _V)],
    "routines": [("routine_catalog", _V), ("routine_schema", _V), ("routine_name", _V),
                 ("routine_type", _V)],
    "sequences": [("sequence_catalog", _V), ("sequence_schema", _V), ("sequence_name", _V)],
}

# (oid, name, size, category, array oid, element oid)
_TYPES = [
    (t.BOOL, "bool", 1, "B", t.BOOL_ARRAY, 0), (t.BYTEA, "bytea", -1, "U", 1001, 0),
    (t.CHAR, "char", 1, "Z", 1002, 0), (t.NAME, "name", 64, "S", 1003, 0),
    (t.INT8, "int8", 8, "N", t.INT8_ARRAY, 0), (t.INT2, "int2", 2, "N", t.INT2_ARRAY, 0),
    (t.INT4, "int4", 4, "N", t.INT4_ARRAY, 0), (t.TEXT, "text", -1, "S", t.TEXT_ARRAY, 0),
    (t.OID, "oid", 4, "N", t.OID_ARRAY, 0), (t.JSON, "json", -1, "U", 199, 0),
    (t.FLOAT4, "float4", 4, "N", 1021, 0), (t.FLOAT8, "float8", 8, "N", t.FLOAT8_ARRAY, 0),
    (t.UNKNOWN, "unknown", -2, "X", 0, 0), (t.BPCHAR, "bpchar", -1, "S", 1014, 0),
    (t.VARCHAR, "varchar", -1, "S", 1015, 0), (t.DATE, "date", 4, "D", 1182, 0),
    (t.TIME, "time", 8, "D", 1183, 0), (t.TIMESTAMP, "timestamp", 8, "D", 1115, 0),
    (t.TIMESTAMPTZ, "timestamptz", 8, "D", 1185, 0), (t.INTERVAL, "interval", 16, "T", 1187, 0),
    (t.NUMERIC, "numeric", -1, "N", 1231, 0), (t.UUID, "uuid", 16, "U", 2951, 0),
    (t.JSONB, "jsonb", -1, "U", 3807, 0), (t.REGCLASS, "regclass", 4, "N", 2210, 0),
    (t.REGTYPE, "regtype", 4, "N", 2211, 0),
    (t.BOOL_ARRAY, "_bool", -1, "A", 0, t.BOOL), (t.INT2_ARRAY, "_int2", -1, "A", 0, t.INT2),
    (t.INT4_ARRAY, "_int4", -1, "A", 0, t.INT4), (t.TEXT_ARRAY, "_text", -1, "A", 0, t.TEXT),
    (t.INT8_ARRAY, "_int8", -1, "A", 0, t.INT8), (t.FLOAT8_ARRAY, "_float8", -1, "A", 0,
                                                    t.FLOAT8),
    (t.OID_ARRAY, "_oid", -1, "A", 0, t.OID), (1015, "_varchar", -1, "A", 0, t.VARCHAR),
    (1182, "_date", -1, "A", 0, t.DATE), (1115, "_timestamp", -1, "A", 0, t.TIMESTAMP),
    (1231, "_numeric", -1, "A", 0, t.NUMERIC),
]
_FORMAT_NAMES = {"bool": "boolean", "int8": "bigint", "int2": "smallint", "int4": "integer",
                 "float4": "real", "float8": "double precision", "varchar": "character varying",
                 "bpchar": "character", "timestamp": "timestamp without time zone",
                 "timestamptz": "timestamp with time zone", "time": "time without time zone",
                 "char": '"char"'}
_TYPE_ALIASES = {v: k for k, v in _FORMAT_NAMES.items()} | {
    "int": "int4", "float": "float8", "boolean": "bool", "character varying": "varchar",
    "decimal": "numeric", "\"char\"": "char"}

# Macros for the Postgres functions clients call on the catalog.  Nothing here reads data.
_MACROS = {
    "pg_get_userbyid": "(x) AS '" + OWNER + "'",
    "pg_table_is_visible": "(x) AS true",
    "pg_type_is_visible": "(x) AS true",
    "pg_collation_is_visible": "(x) AS true",
    "pg_function_is_visible": "(x) AS true",
    "pg_get_expr": "(x, y, z := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_indexdef": "(x, y := NULL, z := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_constraintdef": "(x, y := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_viewdef": "(x, y := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_triggerdef": "(x, y := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_ruledef": "(x, y := NULL) AS CAST(NULL AS VARCHAR)",
    "pg_get_functiondef": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_function_result": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_function_arguments": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_function_identity_arguments": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_statisticsobjdef_columns": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_partkeydef": "(x) AS CAST(NULL AS VARCHAR)",
    "pg_get_serial_sequence": "(x, y) AS CAST(NULL AS VARCHAR)",
    "pg_relation_is_publishable": "(x) AS false",
    "pg_encoding_to_char": "(x) AS 'UTF8'",
    "obj_description": "(x, y := NULL) AS CAST(NULL AS VARCHAR)",
    "col_description": "(x, y) AS CAST(NULL AS VARCHAR)",
    "shobj_description": "(x, y) AS CAST(NULL AS VARCHAR)",
    "has_table_privilege": "(x, y, z := NULL) AS true",
    "has_schema_privilege": "(x, y, z := NULL) AS true",
    "has_database_privilege": "(x, y, z := NULL) AS true",
    "has_column_privilege": "(x, y, z := NULL, w := NULL) AS true",
    "pg_has_role": "(x, y, z := NULL) AS false",
    "pg_is_in_recovery": "() AS false",
    "array_upper": "(a, d) AS CASE WHEN len(a) = 0 THEN NULL ELSE len(a) END",
    "array_lower": "(a, d) AS CASE WHEN len(a) = 0 THEN NULL ELSE 1 END",
    "quote_ident": "(x) AS CASE WHEN regexp_full_match(x, '[a-z_][a-z0-9_$]*') THEN x "
                   "ELSE '\"' || replace(x, '\"', '\"\"') || '\"' END",
    "pg_total_relation_size": None,  # statistics about data: never answered
}
# Macros that look names up are CASE expressions over constants, not subqueries: a subquery
# would capture an unqualified argument such as ``oid`` (SELECT oid::regtype FROM pg_type).
_LOOKUP_MACROS = ("format_type", "to_regtype", "to_regclass", "chorus_regclass_name",
                  "chorus_nspname", "chorus_nsp_oid")
_MACRO_NAMES = frozenset(k for k, v in _MACROS.items() if v is not None) | frozenset(
    _LOOKUP_MACROS)


def _case(arg: str, pairs: list[tuple[object, object]], default: str) -> str:
    whens = " ".join(f"WHEN {exp.convert(k).sql('duckdb')} THEN {exp.convert(v).sql('duckdb')}"
                     for k, v in pairs)
    return f"CASE {arg} {whens} ELSE {default} END" if pairs else default


def _lookup_macros(table_oids: Mapping[str, int]) -> dict[str, str]:
    formats = []
    by_oid = {oid: name for oid, name, *_ in _TYPES}
    for oid, name, _size, cat, _array, elem in _TYPES:
        if cat == "A":
            base = by_oid[elem]
            formats.append((oid, _FORMAT_NAMES.get(base, base) + "[]"))
        else:
            formats.append((oid, _FORMAT_NAMES.get(name, name)))
    type_oids = [(name, oid) for oid, name, *_ in _TYPES] + [
        (alias, dict((n, o) for o, n, *_ in _TYPES)[target])
        for alias, target in _TYPE_ALIASES.items()]
    namespaces = [(CATALOG_NS, "pg_catalog"), (PUBLIC_NS, "public"),
                  (INFO_NS, "information_schema")]
    rels = list(table_oids.items())
    return {
        "format_type": "(x, m) AS " + _case("x", formats, "CAST(NULL AS VARCHAR)"),
        "to_regtype": "(x) AS " + _case("lower(CAST(x AS VARCHAR))", type_oids,
                                        "CAST(NULL AS BIGINT)"),
        "to_regclass": "(x) AS " + _case(
            "regexp_replace(CAST(x AS VARCHAR), '^(public|\"public\")[.]', '')", rels,
            "CAST(NULL AS BIGINT)"),
        "chorus_regclass_name": "(x) AS " + _case(
            "x", [(o, n) for n, o in rels], "CAST(x AS VARCHAR)"),
        "chorus_nspname": "(x) AS " + _case("x", namespaces, "CAST(x AS VARCHAR)"),
        "chorus_nsp_oid": "(x) AS " + _case(
            "x", [(n, o) for o, n in namespaces], "CAST(NULL AS BIGINT)"),
    }
# Functions clients use on the catalog that DuckDB has under the same name and meaning.
_DUCKDB_SAME = frozenset({
    "array_to_string", "string_agg", "unnest", "generate_series", "json_build_object",
    "replace", "split_part", "regexp_replace", "array_length", "cardinality", "row_number",
    "concat_ws", "format", "left", "right", "strpos", "btrim", "ltrim", "rtrim", "lpad",
    "rpad", "md5", "array_agg", "string_to_array", "to_char", "translate",
})


def _literal_array(text: str) -> exp.Expr | None:
    """'{a,b}' -> ARRAY['a', 'b'] (numbers as numbers), as Postgres reads an array literal."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return exp.Array(expressions=[])
    items: list[exp.Expr] = []
    for part in inner.split(","):
        p = part.strip().strip('"')
        items.append(exp.Literal.number(p) if re.fullmatch(r"-?\d+(\.\d+)?", p)
                     else exp.Literal.string(p))
    return exp.Array(expressions=items)


def _type_name(node: exp.DataType) -> str:
    name = node.sql("postgres").lower().replace('"', "")
    return name.removeprefix("pg_catalog.")


# -- Postgres result column names (FigureColname) -----------------------------------------------

_VALUE_FUNCTIONS = {exp.CurrentUser: "current_user", exp.CurrentSchema: "current_schema",
                    exp.SessionUser: "session_user", exp.CurrentDate: "current_date",
                    exp.CurrentTimestamp: "current_timestamp", exp.CurrentTime: "current_time"}


def column_name(node: exp.Expr) -> str:
    """The name Postgres gives an unaliased output expression."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Dot):
        return column_name(node.expression)
    if isinstance(node, exp.Paren):
        return column_name(node.this)
    if isinstance(node, exp.Cast | exp.TryCast):
        inner = column_name(node.this)
        return inner if inner != "?column?" else _type_name(node.to).split("[")[0].split("(")[0]
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, exp.Array):
        return "array"
    if isinstance(node, exp.Coalesce):
        return "coalesce"
    for cls, name in _VALUE_FUNCTIONS.items():
        if isinstance(node, cls):
            return name
    if isinstance(node, exp.CurrentVersion):
        return "version"
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Count):
        return "count"
    if isinstance(node, exp.Func) and not isinstance(node, exp.Binary):
        return node.sql_name().lower()
    return "?column?"


# -- the catalog --------------------------------------------------------------------------------


class Catalog:
    """The fake catalog of one policy (thread-safe: each call uses its own cursor)."""

    def __init__(self, tables: Mapping[str, Mapping[str, str]],
                 statement_timeout_seconds: float | None = 300.0) -> None:
        """``tables`` maps each policy table to its columns and their wire type OIDs; a catalog
        query running longer than ``statement_timeout_seconds`` is cancelled."""
        self.tables = {name: dict(cols) for name, cols in tables.items()}
        self.statement_timeout_seconds = statement_timeout_seconds
        self._con = duckdb.connect(":memory:", config={
            "enable_external_access": False, "autoinstall_known_extensions": False,
            "autoload_known_extensions": False, "threads": 1, "memory_limit": "256MB"})
        self._shadow = duckdb.connect(":memory:", config={
            "enable_external_access": False, "autoinstall_known_extensions": False,
            "autoload_known_extensions": False, "threads": 1, "memory_limit": "64MB"})
        self._lock = threading.Lock()
        self._build()
        self._con.execute("SET lock_configuration = true")
        self._shadow.execute("SET lock_configuration = true")
        self.table_oids = {name: FIRST_TABLE_OID + i for i, name in enumerate(self.tables)}

    # building ------------------------------------------------------------------------------
    def _build(self) -> None:
        con = self._con
        con.execute(f"CREATE SCHEMA {_CATALOG_SCHEMA}")
        con.execute(f"CREATE SCHEMA {_INFO_SCHEMA}")
        for schema, tables in ((_CATALOG_SCHEMA, CATALOG_TABLES), (_INFO_SCHEMA, INFO_TABLES)):
            for name, cols in tables.items():
                con.execute(f"CREATE TABLE {schema}.{name} ("
                            + ", ".join(f'"{c}" {ty}' for c, ty in cols) + ")")
        con.execute("CREATE TABLE chorus_format_names (k VARCHAR, n VARCHAR)")
        con.executemany("INSERT INTO chorus_format_names VALUES (?, ?)",
                        list(_FORMAT_NAMES.items()))
        con.execute("CREATE TABLE chorus_type_aliases (k VARCHAR, v VARCHAR)")
        con.executemany("INSERT INTO chorus_type_aliases VALUES (?, ?)",
                        list(_TYPE_ALIASES.items()))

        def insert(table: str, values: dict[str, Any], schema: str = _CATALOG_SCHEMA) -> None:
            names = list(values)
            con.execute(f"INSERT INTO {schema}.{table} ({', '.join(names)}) VALUES ("
                        + ", ".join("?" * len(names)) + ")", list(values.values()))

        for oid, name in ((CATALOG_NS, "pg_catalog"), (PUBLIC_NS, "public"),
                          (INFO_NS, "information_schema")):
            insert("pg_namespace", {"oid": oid, "nspname": name, "nspowner": 10})
            insert("schemata", {"catalog_name": "chorus", "schema_name": name,
                                "schema_owner": OWNER}, _INFO_SCHEMA)
        for oid, name, size, cat, array, elem in _TYPES:
            insert("pg_type", {
                "oid": oid, "typname": name, "typnamespace": CATALOG_NS, "typowner": 10,
                "typlen": size, "typbyval": 0 < size <= 8, "typtype": "b", "typcategory": cat,
                "typispreferred": name in ("text", "float8", "bool", "timestamptz", "oid"),
                "typisdefined": True, "typdelim": ",", "typrelid": 0, "typelem": elem,
                "typarray": array, "typinput": f"{name}in", "typoutput": f"{name}out",
                "typreceive": f"{name}recv", "typsend": f"{name}send", "typalign": "i",
                "typstorage": "p" if size > 0 else "x", "typnotnull": False,
                "typbasetype": 0, "typtypmod": -1, "typndims": 0,
                "typcollation": 100 if cat == "S" else 0})
        insert("pg_am", {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler",
                         "amtype": "t"})
        insert("pg_collation", {"oid": 100, "collname": "default", "collnamespace": CATALOG_NS,
                                "collowner": 10, "collprovider": "d",
                                "collisdeterministic": True, "collencoding": -1})
        insert("pg_roles", {"oid": 10, "rolname": OWNER, "rolsuper": False,
                            "rolinherit": True, "rolcreaterole": False, "rolcreatedb": False,
                            "rolcanlogin": False, "rolreplication": False,
                            "rolconnlimit": -1, "rolpassword": "********",
                            "rolbypassrls": False})
        insert("pg_tablespace", {"oid": 1663, "spcname": "pg_default", "spcowner": 10})
        for i, (name, cols) in enumerate(self.tables.items()):
            oid = FIRST_TABLE_OID + i
            insert("pg_class", {
                "oid": oid, "relname": name, "relnamespace": PUBLIC_NS, "reltype": 0,
                "reloftype": 0, "relowner": 10, "relam": 2, "relfilenode": oid,
                "reltablespace": 0, "relpages": 0, "reltuples": -1.0, "relallvisible": 0,
                "reltoastrelid": 0, "relhasindex": False, "relisshared": False,
                "relpersistence": "p", "relkind": "r", "relnatts": len(cols),
                "relchecks": 0, "relhasrules": False, "relhastriggers": False,
                "relhassubclass": False, "relrowsecurity": False,
                "relforcerowsecurity": False, "relispopulated": True, "relreplident": "d",
                "relispartition": False, "relrewrite": 0, "relfrozenxid": 0,
                "relminmxid": 0})
            insert("pg_tables", {"schemaname": "public", "tablename": name,
                                 "tableowner": OWNER, "hasindexes": False, "hasrules": False,
                                 "hastriggers": False, "rowsecurity": False})
            insert("tables", {"table_catalog": "chorus", "table_schema": "public",
                              "table_name": name, "table_type": "BASE TABLE",
                              "is_insertable_into": "NO", "is_typed": "NO"}, _INFO_SCHEMA)
            shadow_cols = []
            for num, (col, oid_type) in enumerate(cols.items(), start=1):
                type_name, size = t.TYPE_INFO.get(oid_type, ("text", -1))
                insert("pg_attribute", {
                    "attrelid": oid, "attname": col, "atttypid": oid_type,
                    "attstattarget": -1, "attlen": size, "attnum": num, "attndims": 0,
                    "attcacheoff": -1, "atttypmod": -1, "attbyval": 0 < size <= 8,
                    "attalign": "d", "attstorage": "p" if size > 0 else "x",
                    "attcompression": "", "attnotnull": False, "atthasdef": False,
                    "atthasmissing": False, "attidentity": "", "attgenerated": "",
                    "attisdropped": False, "attislocal": True, "attinhcount": 0,
                    "attcollation": 100 if oid_type == t.TEXT else 0})
                udt = {v: k for k, v in _FORMAT_NAMES.items()}.get(type_name, type_name)
                insert("columns", {
                    "table_catalog": "chorus", "table_schema": "public", "table_name": name,
                    "column_name": col, "ordinal_position": num, "is_nullable": "YES",
                    "data_type": type_name, "udt_catalog": "chorus", "udt_schema": "pg_catalog",
                    "udt_name": udt, "is_identity": "NO", "is_generated": "NEVER",
                    "is_updatable": "NO"}, _INFO_SCHEMA)
                shadow_cols.append(f'"{col}" {_SHADOW_TYPES.get(oid_type, "VARCHAR")}')
            self._shadow.execute(f'CREATE TABLE "{name}" ({", ".join(shadow_cols)})')
        oids = {name: FIRST_TABLE_OID + i for i, name in enumerate(self.tables)}
        for name, body in {**_MACROS, **_lookup_macros(oids)}.items():
            if body is not None:
                con.execute(f"CREATE MACRO {name}{body}")

    # answering -----------------------------------------------------------------------------
    def run(self, tree: exp.Expr, session: SessionInfo) -> CatalogResult:
        """Answer a catalog query (a parsed Postgres SELECT) from the fake catalog."""
        names = _output_names(tree)
        sql = self.to_duckdb(tree, session, names)
        with self._lock:
            cur = self._con.cursor()
        stop = None
        try:
            # A catalog query can be made slow (a cross join of generate_series): the front
            # door's cancel and the statement timeout reach it as they reach the backend's.
            with cancellable(cur.interrupt, self.statement_timeout_seconds) as stop:
                cur.execute(sql)
                rows = cur.fetchall()
                desc = cur.description or []
        except duckdb.Error as err:
            raise _catalog_error(err, stop.reason if stop is not None else None) from None
        finally:
            cur.close()
        columns = tuple(Column(name if name is not None else d[0], t.duckdb_oid(str(d[1])))
                        for name, d in zip(_pad(names, len(desc)), desc, strict=True))
        return CatalogResult(columns, rows)

    def to_duckdb(self, tree: exp.Expr, session: SessionInfo,
                  names: list[str | None] | None = None) -> str:
        """The catalog query rewritten for the fake catalog DuckDB."""
        tree = tree.copy()
        if names is not None and isinstance(tree, exp.Select):
            for i, (node, name) in enumerate(zip(tree.expressions, names, strict=False)):
                if name is not None and not isinstance(node, exp.Alias | exp.Star):
                    tree.expressions[i] = exp.alias_(node, name, quoted=True)
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        # Children first, so a rewrite sees rewritten arguments (CAST(CAST(x AS regtype) AS
        # text) must turn the inner cast into a lookup before the outer one is looked at).
        for node in reversed(list(tree.walk())):
            new = _rewrite(node, session, ctes)
            if new is not node:
                if node is tree:
                    tree = new
                else:
                    node.replace(new)
        return tree.sql("duckdb")

    def describe(self, tree: exp.Expr) -> list[Column]:
        """Output names and types of an analyst query, bound on empty shadow tables."""
        tree = tree.copy()
        for node in list(tree.find_all(exp.Placeholder, exp.Parameter)):
            if isinstance(node, exp.Parameter | exp.Placeholder):
                node.replace(exp.Null())
        names = _output_names(tree)
        sql = tree.sql("duckdb")
        with self._lock:
            cur = self._shadow.cursor()
        try:
            desc = cur.execute(f"DESCRIBE {sql}").fetchall()
        except duckdb.Error as err:
            raise _catalog_error(err) from None
        finally:
            cur.close()
        return [Column(name if name is not None else d[0], t.duckdb_oid(str(d[1])))
                for name, d in zip(_pad(names, len(desc)), desc, strict=True)]

    def close(self) -> None:
        self._con.close()
        self._shadow.close()


_SHADOW_TYPES = {t.INT8: "BIGINT", t.FLOAT8: "DOUBLE", t.TEXT: "VARCHAR", t.BOOL: "BOOLEAN",
                 t.DATE: "DATE", t.TIMESTAMP: "TIMESTAMP"}


def _pad(names: list[str | None], n: int) -> list[str | None]:
    if len(names) == n:
        return names
    return [None] * n


def _output_names(tree: exp.Expr) -> list[str | None]:
    select = tree
    while isinstance(select, exp.SetOperation):
        select = select.this
    if isinstance(select, exp.Subquery):
        select = select.this
    if not isinstance(select, exp.Select):
        return []
    if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
           for e in select.expressions):
        return [None] * 0
    return [column_name(e) for e in select.expressions]


def _catalog_error(err: duckdb.Error, cancelled: str | None = None) -> CatalogError:
    text = str(err).split("\n")[0]
    if isinstance(err, duckdb.CatalogException):
        if "Function" in text or "function" in text or "Macro" in text:
            return CatalogError("42883", "function does not exist in the proxy's catalog: "
                                + text.split(":", 1)[-1].strip())
        return CatalogError("42P01", "relation does not exist in the proxy's catalog: "
                            + text.split(":", 1)[-1].strip())
    if isinstance(err, duckdb.BinderException):
        return CatalogError("42703", text.split(":", 1)[-1].strip())
    if isinstance(err, duckdb.ParserException):
        return CatalogError("42601", text.split(":", 1)[-1].strip())
    if isinstance(err, duckdb.InterruptException):
        return CatalogError("57014", f"canceling statement due to {cancelled or 'user request'}")
    return CatalogError("XX000", "the catalog query failed: " + text)


def _rewrite(node: exp.Expr, session: SessionInfo, ctes: set[str]) -> exp.Expr:
    if isinstance(node, exp.Table):
        return _table(node, session, ctes)
    if isinstance(node, exp.Column):
        if node.args.get("db") is not None:
            node.set("db", None)
        if node.args.get("catalog") is not None:
            node.set("catalog", None)
        return node
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and \
            node.this.name.lower() == "pg_catalog":
        return node.expression  # pg_catalog.f(x): the function, already rewritten
    if isinstance(node, exp.Collate):
        return node.this
    if isinstance(node, exp.Operator):
        return _operator(node)
    if isinstance(node, exp.Cast | exp.TryCast):
        return _cast(node)
    if isinstance(node, exp.Literal) and node.is_string and isinstance(
            node.parent, exp.EQ | exp.NEQ):
        array = _literal_array(node.this)
        return array if array is not None else node
    if isinstance(node, exp.CurrentVersion):
        return exp.Literal.string(VERSION_STRING)
    if isinstance(node, exp.CurrentUser | exp.SessionUser):
        return exp.Literal.string(session.user)
    if isinstance(node, exp.CurrentSchema):
        return exp.Literal.string("public")
    if isinstance(node, exp.CurrentDatabase | exp.CurrentCatalog):
        return exp.Literal.string(session.database)
    if isinstance(node, exp.Anonymous):
        return _function(node, session)
    return node


def _table(node: exp.Table, session: SessionInfo, ctes: set[str]) -> exp.Expr:
    name, db = node.name.lower(), node.db.lower()
    if isinstance(node.this, exp.Func | exp.Anonymous) or not name:
        node.set("db", None)  # table functions (generate_series, unnest): see _function
        node.set("catalog", None)
        return node
    if not db and name in ctes:
        return node
    if db in ("", "pg_catalog") and name == "pg_database":
        values = exp.select(*(exp.alias_(exp.Literal.number(1) if c == "oid" else
                                         exp.Literal.string(session.database)
                                         if c == "datname" else
                                         exp.Literal.number(6) if c == "encoding" else
                                         exp.Cast(this=exp.Null(), to=exp.DataType.build(ty)),
                                         c) for c, ty in CATALOG_TABLES["pg_database"]))
        alias = node.alias or "pg_database"
        return exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias)))
    if db in ("", "pg_catalog") and name in CATALOG_TABLES:
        node.set("db", exp.to_identifier(_CATALOG_SCHEMA))
        node.set("catalog", None)
        return node
    if db == "information_schema" and name in INFO_TABLES:
        node.set("db", exp.to_identifier(_INFO_SCHEMA))
        node.set("catalog", None)
        return node
    raise CatalogError("42P01", f"relation \"{(db + '.') if db else ''}{name}\" does not exist "
                       "in the proxy's catalog (it describes the policy's tables only)")


def _operator(node: exp.Operator) -> exp.Expr:
    op = str(node.args.get("operator") or "").lower().removeprefix("pg_catalog.").strip()
    left, right = node.this, node.expression
    if op == "~":
        return exp.RegexpLike(this=left, expression=right)
    if op == "!~":
        return exp.Not(this=exp.RegexpLike(this=left, expression=right))
    if op == "~*":
        return exp.RegexpILike(this=left, expression=right)
    if op == "!~*":
        return exp.Not(this=exp.RegexpILike(this=left, expression=right))
    binary = {"=": exp.EQ, "<>": exp.NEQ, "!=": exp.NEQ, "<": exp.LT, "<=": exp.LTE,
              ">": exp.GT, ">=": exp.GTE, "~~": exp.Like, "~~*": exp.ILike}
    if op in binary:
        return binary[op](this=left, expression=right)
    raise CatalogError("42883", f"operator {op} is not supported by the proxy's catalog")


def _cast(node: exp.Cast | exp.TryCast) -> exp.Expr:
    target = _type_name(node.to)
    value = node.this
    literal = value.this if isinstance(value, exp.Literal) and value.is_string else None
    if target == "regclass":
        if literal is not None:
            rel = literal.split(".")[-1]
            rel = rel.strip('"') if rel.startswith('"') else rel.lower()
            return exp.Anonymous(this="to_regclass", expressions=[exp.Literal.string(rel)])
        return exp.Anonymous(this="chorus_regclass_name", expressions=[value])
    if target == "regtype":
        if literal is not None:
            return exp.Anonymous(this="to_regtype", expressions=[value])
        return exp.Anonymous(this="format_type", expressions=[value, exp.Null()])
    if target == "regnamespace":
        if literal is not None:
            return exp.Anonymous(this="chorus_nsp_oid", expressions=[value])
        return exp.Anonymous(this="chorus_nspname", expressions=[value])
    if target in ("regproc", "regprocedure", "regoper", "regoperator", "regrole", "regconfig",
                  "regdictionary", "regcollation"):
        if literal is not None:
            return exp.Literal.number(0)
        return exp.Cast(this=value, to=exp.DataType.build("VARCHAR"))
    if target in ("oid", "xid", "cid", "tid", "xid8"):
        return exp.Cast(this=value, to=exp.DataType.build("BIGINT"))
    if target in ("name", "char", "\"char\"", "bpchar", "text", "pg_node_tree", "aclitem",
                  "character"):
        return exp.Cast(this=value, to=exp.DataType.build("VARCHAR"))
    if target in ("oid[]", "oidvector", "int2vector"):
        return exp.Cast(this=value, to=exp.DataType.build("BIGINT[]"))
    if target in ("name[]", "aclitem[]", "text[]"):
        if literal is not None:
            array = _literal_array(literal)
            if array is not None:
                return array
        return exp.Cast(this=value, to=exp.DataType.build("VARCHAR[]"))
    if any(d.this == exp.DType.USERDEFINED for d in node.to.find_all(exp.DataType)):
        target = target.replace("pg_catalog.", "")
        base = target.removesuffix("[]")
        base = {"int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real",
                "float8": "double precision", "bool": "boolean"}.get(base, base)
        try:  # pg_catalog.int2[] and the like: the same type without the schema
            built = exp.DataType.build(base + ("[]" if target.endswith("[]") else ""),
                                       dialect="postgres")
        except Exception:
            built = None
        if built is not None and built.this != exp.DType.USERDEFINED:
            return exp.Cast(this=value, to=built)
        raise CatalogError("42704", f"type \"{target}\" does not exist in the proxy's catalog")
    return node


def _function(node: exp.Anonymous, session: SessionInfo) -> exp.Expr:
    name = str(node.this).lower()
    if name == "current_schemas":
        return exp.Array(expressions=[exp.Literal.string("pg_catalog"),
                                      exp.Literal.string("public")])
    if name in ("current_database", "current_catalog"):
        return exp.Literal.string(session.database)
    if name in ("current_user", "session_user", "user", "current_role"):
        return exp.Literal.string(session.user)
    if name == "version":
        return exp.Literal.string(VERSION_STRING)
    if name == "json_build_object":
        return exp.Anonymous(this="json_object", expressions=node.expressions)
    if name == "pg_backend_pid":
        return exp.Literal.number(session.pid)
    if name in ("current_setting",):
        args = node.expressions
        if args and isinstance(args[0], exp.Literal) and args[0].is_string:
            key = args[0].this.lower()
            if key in session.settings:
                return exp.Literal.string(session.settings[key])
            missing_ok = len(args) > 1 and isinstance(args[1], exp.Boolean) and \
                args[1].this is True
            if missing_ok:
                return exp.Cast(this=exp.Null(), to=exp.DataType.build("VARCHAR"))
            raise CatalogError("42704", f'unrecognized configuration parameter "{key}"')
        raise CatalogError("0A000", "current_setting() needs a literal setting name here")
    if name in ("inet_server_addr", "inet_client_addr", "inet_server_port",
                "inet_client_port", "txid_current", "pg_postmaster_start_time"):
        return exp.Null()
    if name in _MACRO_NAMES or name in _DUCKDB_SAME:
        return node
    raise CatalogError("42883", f"function {name}() is not available in the proxy's catalog "
                       "(it answers catalog queries about the policy's tables only)")
