"""The data owner's budget dashboard: a static page and the data it draws.

The page (``index.html``, ``dashboard.js``, ``dashboard.css`` in this folder) loads nothing from
elsewhere and fetches ``GET /v1/dashboard`` with the owner's token.  :mod:`server.dashboard.page`
serves the files; :mod:`server.dashboard.data` builds the data from the ledger's public views
(:mod:`server.metrics`).  The REST app (:mod:`server.rest.app`) mounts both behind its
authentication; nothing here knows about tokens or routes.
"""
