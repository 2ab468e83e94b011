"""Client libraries that speak to the proxy from Python: the DB-API 2.0 driver (``dbapi``,
in-process or over HTTP) and the SQLAlchemy dialect built on it (``sqlalchemy_dialect``)."""
