-- Migration 20: conditions on a job (Job::when, `jobs add --when`). conditions is a bit mask
-- (1 ac-power, 2 battery-not-low, 4 unmetered, 8 online, 16 idle; 0: none) that a claim tests
-- against what holds on the claiming runner's machine; when_lost says what happens to a
-- running job when one stops holding (`run` on, or `stop` and requeue without spending an
-- attempt). A runner records what holds as it sees it (conditions_held, the same bits; NULL:
-- registered before version 20) and what it assumes where it cannot tell (conditions_note),
-- which `jobs inspect`, `jobs ls`, `status` and the dashboard read to say what a job waits for.
ALTER TABLE jobs ADD COLUMN conditions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN when_lost TEXT NOT NULL DEFAULT 'run'
    CHECK (when_lost = 'run' OR when_lost = 'stop');
ALTER TABLE runners ADD COLUMN conditions_held INTEGER;
ALTER TABLE runners ADD COLUMN conditions_note TEXT;
