-- Migration 21 (PostgreSQL): a job's manners and caps, "try me later", and error_kind
-- 'memory' (see src/migrations/0021_manners.sql).
ALTER TABLE jobs ADD COLUMN limits TEXT;
ALTER TABLE jobs ADD COLUMN tempfail_max BIGINT;
ALTER TABLE jobs ADD COLUMN tempfails BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs DROP CONSTRAINT jobs_error_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_error_kind_check
    CHECK (error_kind = 'exit' OR error_kind = 'signal' OR error_kind = 'timeout'
           OR error_kind = 'idle_timeout' OR error_kind = 'lost'
           OR error_kind = 'spawn' OR error_kind = 'memory');
