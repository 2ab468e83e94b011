#!/bin/sh
# Run once by the postgres image when it creates the database (docker-entrypoint-initdb.d):
# the proxy's least-privilege roles, with the password docker-compose.yml passes in.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v db_password="$CHORUS_DB_PASSWORD" -f /chorus/roles.sql
