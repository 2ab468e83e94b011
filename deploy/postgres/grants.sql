-- What the proxy's roles may read: exactly the tables of the policy (examples/docker-policy.toml),
-- after they exist. docker-compose.yml's db-grants service runs this on every start (it is
-- idempotent, and a reloaded table comes back without grants); run it again after adding a
-- table to the policy, with the table added here.
--   psql -v ON_ERROR_STOP=1 -d yourdb -f grants.sql
\set ON_ERROR_STOP on

BEGIN;
-- Nothing through PUBLIC (it would reach every role), nothing but SELECT for the proxy.
REVOKE ALL ON trips, riders, drivers, papers, paper_authors, cities FROM PUBLIC;
REVOKE ALL ON trips, riders, drivers, papers, paper_authors, cities
    FROM chorus_proxy, chorus_public_reader;
-- The private tables, the attribution table of papers, and the public table.
GRANT SELECT ON trips, riders, drivers, papers, paper_authors, cities TO chorus_proxy;
-- Public queries: the public tables only.
GRANT SELECT ON cities TO chorus_public_reader;
COMMIT;
