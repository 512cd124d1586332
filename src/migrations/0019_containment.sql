-- Migration 19: how a runner contains its attempts (`cgroup <node>` or `process groups
-- (why)`), which `leasehold status` shows. NULL: registered before version 19.
ALTER TABLE runners ADD COLUMN containment TEXT;
