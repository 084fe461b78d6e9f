-- Reverts 0025: the library sends the unkeyed insert itself again.
-- Locks: the function's catalog row.
DROP FUNCTION durable_etl_enqueue_unkeyed(uuid[], bytea[], bytea[], jsonb[], int4[],
                                          timestamptz[], bytea, text, uuid[], text[], int2[],
                                          text[]);
