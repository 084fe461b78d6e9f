-- Reverts 0030: recovery of a release before it judges lock-backed owners by their locks alone.
-- Locks: DROP TABLE takes the beats table's ACCESS EXCLUSIVE lock (no job statement reads it).

DROP TABLE etl_owner_beats;
