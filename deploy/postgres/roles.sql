-- The database roles of the Chorus proxy: least privilege (docs/owner-guide.md, "Least privilege").
--
-- docker-compose.yml runs this once, when the postgres container creates its database
-- (initdb/10-chorus-roles.sh). On a Postgres of your own, run it as a superuser in the database
-- the proxy reads, then grants.sql once your tables exist:
--   psql -v ON_ERROR_STOP=1 -v db_password='...' -d yourdb -f roles.sql
--
-- chorus_proxy          the proxy's main connection: SELECT on the policy's tables (grants.sql)
--                       and its own schema chorus_private (stored samples, attribution sets);
--                       nothing else, so a gap in the query analyser still cannot write or read
--                       an undeclared table.
-- chorus_public_reader  backend.public_url: queries over public tables only (answered without
--                       noise) run as this role, which can read the public tables and nothing
--                       else.
-- Both log in with db_password: the proxy holds both credentials anyway; what matters is what
-- each role can read.
\set ON_ERROR_STOP on

CREATE ROLE chorus_proxy LOGIN PASSWORD :'db_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;
CREATE ROLE chorus_public_reader LOGIN PASSWORD :'db_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;

-- Only the owner creates objects in the shared schema (the default since Postgres 15, said again
-- for databases made earlier), and only named roles connect (PUBLIC's CONNECT and TEMP go).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON DATABASE :"DBNAME" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"DBNAME" TO chorus_proxy, chorus_public_reader;
GRANT USAGE ON SCHEMA public TO chorus_proxy, chorus_public_reader;

-- The proxy's own schema: it owns it, so it needs no CREATE on the database.
CREATE SCHEMA chorus_private AUTHORIZATION chorus_proxy;
