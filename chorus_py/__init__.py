"""Chorus: a differential-privacy SQL proxy.  ``chorus_py.connect`` is its DB-API 2.0 driver."""

from chorus_py.clients.dbapi import connect

__all__ = ["connect"]
