-- Migration 17: a job's name (`Job::name`, `jobs add --name`), which a harness that runs tests
-- as jobs gives each of them: shown by `jobs ls`, `jobs inspect` and `jobs wait`. NULL: none.
ALTER TABLE jobs ADD COLUMN name TEXT;
