"""What the proxy keeps about the data, apart from the ledger: stored bounded samples
(``samples``), kept sets of multi-attribution tables (``attribution``), max frequencies of join
keys (``frequencies``), all in the private schema analysts cannot name; and the block windows of
the policy's public schedules (``schedules``), which read no data.  Each refreshes itself after
its time to live; the engine owns one of each."""
