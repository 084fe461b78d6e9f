-- 0042: an owner can move to another cell (`cells move-owner`, `directory::moving`).
--
-- `etl_moved_owners` lists the owners this cell holds no longer (or is giving up): once an
-- owner is listed, no job or schedule of its is accepted here again. The statement triggers of
-- the intake and the schedules refuse a statement that writes a row of a listed owner (SQLSTATE
-- 55M02), whatever path it came by, whichever release wrote it. The trigger reads the list with a snapshot of its own, taken after
-- the rows were written; the mover, after listing an owner, waits for every transaction that
-- was open then (its writes, and its snapshots for repeatable-read readers) to end, so every
-- job of the owner that will ever commit here has committed once that wait is over.
--
-- `etl_moving_rows` holds the owner's rows that must stop acting in the old cell before the new
-- cell has them: its schedules, taken out with the fence (so no replica fires them here again),
-- and its pending jobs, taken out of the live table (so no replica claims them here again). Each
-- move takes them out in one statement, so none is lost if the mover dies; the new cell makes
-- them its own in the transaction that brings the owner's other rows, and they are deleted here
-- after. Each row is whole, as JSON, so the table follows its table's columns.
--
-- `etl_owner_arrivals` records each move that brought an owner's rows into this cell, in the
-- transaction that brought them: a move that starts again after it died finds its arrival and
-- never brings them (and its pending jobs) a second time.
--
-- Readers: additive. A release before it never reads the new tables; its enqueues are refused
-- for a moved owner like this release's.
--
-- Locks: CREATE TABLE, and CREATE TRIGGER takes SHARE ROW EXCLUSIVE on the intake and the
-- schedules for an instant (it waits for running enqueues and fires, and they for it).
--
-- Its statements are sent one at a time, split at each `-- ;` line (Citus propagates a DDL
-- statement to the nodes with the text of the query that held it).

CREATE TABLE etl_moved_owners (
    owner_key durable_etl_digest PRIMARY KEY,
    moved_to text NOT NULL CHECK (char_length(moved_to) BETWEEN 1 AND 63),
    fenced_at timestamptz NOT NULL DEFAULT now()
);
-- ;
COMMENT ON TABLE etl_moved_owners IS 'durable-etl: owners this cell holds no longer (moved, or moving, to another cell): their enqueues are refused here';
-- ;
CREATE TABLE etl_moving_rows (
    owner_key durable_etl_digest NOT NULL,
    relation text NOT NULL CHECK (relation IN ('etl_job_records', 'etl_schedules')),
    row_data jsonb NOT NULL
);
-- ;
CREATE INDEX etl_moving_rows_owner_key_idx ON etl_moving_rows (owner_key);
-- ;
COMMENT ON TABLE etl_moving_rows IS 'durable-etl: pending jobs and schedules of an owner moving to another cell, out of their tables until the new cell has them';
-- ;
CREATE TABLE etl_owner_arrivals (
    move_id uuid PRIMARY KEY,
    owner_key durable_etl_digest NOT NULL,
    arrived_at timestamptz NOT NULL DEFAULT now()
);
-- ;
COMMENT ON TABLE etl_owner_arrivals IS 'durable-etl: each move that brought an owner here, written in the transaction that brought its rows, so that no move brings them twice';
-- ;
CREATE FUNCTION durable_etl_refuse_moved_owners() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM etl_moved_owners)
       AND EXISTS (SELECT 1 FROM etl_moved_owners m JOIN new_rows a USING (owner_key)) THEN
        RAISE EXCEPTION 'the owner has moved to another cell' USING ERRCODE = '55M02';
    END IF;
    RETURN NULL;
END;
$$;
-- ;
CREATE TRIGGER etl_job_intake_refuse_moved_owners
    AFTER INSERT ON etl_job_intake
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION durable_etl_refuse_moved_owners();
-- ;
CREATE TRIGGER etl_schedules_refuse_moved_owners
    AFTER INSERT ON etl_schedules
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION durable_etl_refuse_moved_owners();
