-- Migration 20: conditions on a job; see src/migrations/0020_conditions.sql.
ALTER TABLE jobs ADD COLUMN conditions BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN when_lost TEXT NOT NULL DEFAULT 'run'
    CHECK (when_lost = 'run' OR when_lost = 'stop');
ALTER TABLE runners ADD COLUMN conditions_held BIGINT;
ALTER TABLE runners ADD COLUMN conditions_note TEXT;
