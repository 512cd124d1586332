-- Migration 3: unique jobs and recurring schedules. Frozen once released.

-- A job may carry a unique key: enqueueing one whose key matches an unfinished job (or, with a
-- window, any job of that key created within it) creates nothing. The check runs in the
-- enqueue's IMMEDIATE transaction, so it holds across processes; this index makes it a lookup.
ALTER TABLE jobs ADD COLUMN unique_key TEXT;
-- The schedule that enqueued the job and the slot (the scheduled instant) it fired for.
ALTER TABLE jobs ADD COLUMN schedule TEXT;
ALTER TABLE jobs ADD COLUMN slot_at INTEGER;
CREATE INDEX jobs_unique ON jobs (unique_key, status, created_at) WHERE unique_key IS NOT NULL;
-- The overlap check: does a schedule still have a pending or running job?
CREATE INDEX jobs_schedule ON jobs (schedule, status) WHERE schedule IS NOT NULL;

-- One row per recurring schedule. A slot fires in the IMMEDIATE transaction that enqueues its
-- job and moves next_slot_at past it, guarded by next_slot_at: any number of runners fire
-- each slot exactly once.
CREATE TABLE schedules (
    name          TEXT    PRIMARY KEY CHECK (name <> ''),
    -- A cron expression (5 fields, 6 with seconds first, or an @shorthand), or NULL for an
    -- interval of every_ms milliseconds counted from anchor_at.
    cron          TEXT,
    every_ms      INTEGER CHECK (every_ms IS NULL OR every_ms > 0),
    anchor_at     INTEGER NOT NULL,
    -- An IANA zone name: cron fields are read in its local time.
    tz            TEXT    NOT NULL DEFAULT 'UTC',
    -- The job each slot enqueues: a JSON object of the `jobs add` options.
    job           TEXT    NOT NULL,
    catch_up      TEXT    NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('skip', 'one', 'all')),
    overlap       TEXT    NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    paused        INTEGER NOT NULL DEFAULT 0,
    -- The newest slot fired (or missed), and the next slot due; NULL when none is left.
    last_slot_at  INTEGER,
    next_slot_at  INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);
CREATE INDEX schedules_due ON schedules (next_slot_at) WHERE paused = 0;

-- A schedule's own history: missed and skipped slots (a fired slot is its job's history).
CREATE TABLE schedule_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule    TEXT    NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    slot_at     INTEGER,
    detail      TEXT
);
CREATE INDEX schedule_events_schedule ON schedule_events (schedule, id);
