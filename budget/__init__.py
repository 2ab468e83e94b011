"""The privacy budget: private blocks, claims, the DPF scheduler, accounting, the durable ledger.

Modules (DESIGN.md section 7; PrivateKube, "Privacy Budget Scheduling", OSDI 2021):

``accounting``  events (one per noisy release: kind, scale, sensitivity, epsilon, delta) and the
                basic / Rényi accountants that turn them into demands on a block's budget.
``scheduler``   block state (global = locked + unlocked + allocated + consumed, checked on every
                change), the transitions, DPF-N / DPF-T unlocking, the DPF order.
``store``       where the state lives: memory, SQLite (WAL, ``BEGIN IMMEDIATE``), Postgres (a row
                lock); an append-only journal of every change.
``ledger``      :class:`~budget.ledger.Ledger`, what the engine calls: ``ensure_blocks``,
                ``claim`` (all or nothing; waits up to the wait time), ``consume``, ``release``;
                views (``blocks``, ``claims``, ``history``, ``spending``) and crash recovery.
``simulator``   the paper's microbenchmark on the real ledger (``chorus budget simulate``).

Choices worth knowing (each is explained where it is made):

- The durable store uses the standard library's ``sqlite3`` and psycopg (already a dependency)
  rather than SQLAlchemy: the locking that makes two proxies unable to overspend is
  backend-specific anyway (``BEGIN IMMEDIATE`` vs ``SELECT ... FOR UPDATE``) and is spelled out in
  ``store``.
- Rényi accounting splits delta^G: ``(1 - renyi_delta_share)`` converts Rényi DP back to
  (epsilon, delta)-DP, the rest pays for queries' own deltas (noisy key-release thresholds).
- A claim that can never fit (a retired block, or less left than it asks) is refused at once and
  unlocks nothing; a DPF claim that does not fit *yet* waits up to ``wait_seconds``.
- After a crash, an allocated claim whose process is gone is *consumed* (the query may have read
  data); a waiting one is refused.  Claims of processes on other machines (a shared Postgres
  ledger) are left alone: waiting ones expire at their deadline, allocated ones stay allocated
  (never an overspend; at worst budget held back).
- DPF-T unlocks nothing at a block's creation: the first tick unlocks the first share
  (Algorithm 2 of the paper).
"""
